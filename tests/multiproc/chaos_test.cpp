// SPDX-License-Identifier: Apache-2.0
// kf-chaos and kf-replay end to end: random churn against a real elastic job (kf-config-server,
// kfrun --watch, elastic-worker) ends with every guarantee checked; kf-chaos itself notices a job
// whose workers disagree, and one that hangs; the repository's synthetic trace replayed with
// kills and revokes reports the throughput retained and keeps the guarantees.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>

#include "support/process.hpp"

namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Runs kf-chaos with a work directory that is removed afterwards (kf-chaos keeps its own after
// a failure, for a look).
kf::test::Ran chaos(const std::string& args) {
  return kf::test::run_shell("(d=$(mktemp -d) && timeout 300 " + env_or_empty("KF_CHAOS") +
                             " --dir \"$d\" " + args + "; rc=$?; rm -rf \"$d\"; exit $rc)");
}

kf::test::Ran replay(const std::string& args) {
  return kf::test::run_shell("(d=$(mktemp -d) && timeout 300 " + env_or_empty("KF_REPLAY") +
                             " --dir \"$d\" " + args + "; rc=$?; rm -rf \"$d\"; exit $rc)");
}

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (std::size_t at = 0; (at = text.find(part, at)) != std::string::npos; at += part.size()) ++n;
  return n;
}

TEST(KfChaos, EveryGuaranteeHoldsThroughRandomChurn) {
  const auto r = chaos(
      "--seed 11 --events 12 --interval-ms 300-800 --stop-ms 100-1200 --max-workers 4 "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") + " --samples 20000 --dim 32 --batch 64 --epochs 1000");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: seed 11: 12 events ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("with identical parameters (hash "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS: "), std::string::npos) << r.output;
}

// Spot machines are reclaimed in waves: bursts of two or three kill -9 within 100 ms, a loss
// meeting a recovery under way, between additions. kf-chaos never takes the last worker that
// holds the job's state (a joiner holds none), so every guarantee must hold.
TEST(KfChaos, EveryGuaranteeHoldsThroughBurstsOfKills) {
  const auto r = chaos(
      "--seed 2 -np 4 --events 14 --interval-ms 300-800 --max-workers 4 --kinds add,burst "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") + " --samples 20000 --dim 32 --batch 64 --epochs 1000");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kill -9 in a burst: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS: "), std::string::npos) << r.output;
}

// The same churn while the workers train by pair averaging, with exchanges in flight at every
// change: no hang, nothing committed lost, every sample once. (The workers average their
// models at the end, so the final parameter check says nothing about the changes: the
// LibTorch elastic test checks that each change leaves one model.)
TEST(KfChaos, EveryGuaranteeHoldsThroughRandomChurnInPairAveraging) {
  const auto r = chaos(
      "--seed 12 --events 12 --interval-ms 300-800 --stop-ms 100-1200 --max-workers 4 "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") +
      " --samples 20000 --dim 32 --batch 64 --epochs 1000 --mode pair-avg");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS"), std::string::npos) << r.output;
}

// The same with boundaries on change: the workers meet only when something changes, each
// trains through its own piece of the epoch, and every change still applies at one boundary.
TEST(KfChaos, EveryGuaranteeHoldsThroughRandomChurnWithBoundariesOnChange) {
  const auto r = chaos(
      "--seed 14 --events 12 --interval-ms 300-800 --stop-ms 100-1200 --max-workers 4 "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") +
      " --samples 20000 --dim 32 --batch 64 --epochs 1000 --mode pair-avg --boundaries on-change");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS"), std::string::npos) << r.output;
}

// The parameter server with boundaries on change: rank 0 serves at its own steps, the workers
// wait only for it, and before each boundary it releases them; changes, kills and stops land
// while pushes and answers are in flight.
TEST(KfChaos, EveryGuaranteeHoldsThroughRandomChurnInParameterServerTrainingOnChange) {
  const auto r = chaos(
      "--seed 15 --events 12 --interval-ms 300-800 --stop-ms 100-1200 --max-workers 4 "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") +
      " --samples 20000 --dim 32 --batch 64 --epochs 1000 --mode async-ps:max_staleness=1 "
      "--boundaries on-change");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS"), std::string::npos) << r.output;
}

// Parameter-server training with balanced batches: the batch parts change with the measured
// speeds, and every sample of an epoch is still used once.
TEST(KfChaos, EveryGuaranteeHoldsThroughRandomChurnInParameterServerTrainingWithBalance) {
  const auto r = chaos(
      "--seed 13 --events 12 --interval-ms 300-800 --stop-ms 100-1200 --max-workers 4 "
      "--finish-with epochs=1 --finish-timeout-s 120 -- " +
      env_or_empty("KF_ELASTIC_WORKER") +
      " --samples 20000 --dim 32 --batch 64 --epochs 1000 --mode async-ps:max_staleness=2 "
      "--balance");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: PASS"), std::string::npos) << r.output;
}

TEST(KfChaos, NoticesWorkersThatFinishWithDifferentParameters) {
  // Each "worker" reports its own address as its parameters' hash, and exits 0.
  const auto r = chaos(
      "-np 2 --events 0 --finish-timeout-s 60 -- sh -c 'echo \"final step=3 workers=2 "
      "hash=$(echo $KF_SELF | tr -dc 0-9)\"'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: FAIL: the workers finished with different parameters (2 "
                          "different hashes)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kf-chaos: the job's output is in "), std::string::npos) << r.output;
}

TEST(KfChaos, NoticesAJobThatHangs) {
  const auto r = chaos("-np 1 --events 0 --finish-timeout-s 1 -- sleep 600");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("kf-chaos: FAIL: the job hung: it had not finished 1 s after the last "
                          "event"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(kf::test::run_shell("pgrep -x -f 'sleep 600'").exit_code, 1)
      << "kf-chaos left the hung workers running";
}

TEST(KfChaos, RefusesBadArgumentsWithAClearMessage) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c :
       {Case{"-np 5 -- true", "-np must lie within --min-workers and --max-workers"},
        Case{"--kinds add,nap -- true", "--kinds: unknown event 'nap'"},
        Case{"--interval-ms 9-3 -- true", "--interval-ms: '9-3' ends before"},
        Case{"--finish-with epochs -- true", "--finish-with: 'epochs' is not"},
        Case{"--min-workers 0 -- true", "--min-workers must be at least 1"}}) {
    const auto r = chaos(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_EQ(count_of(r.output, c.says), 1) << c.args << "\n" << r.output;
  }
}

TEST(KfReplay, ReplaysTheSyntheticTraceAndReportsTheThroughputRetained) {
  const auto r = replay("--trace " + env_or_empty("KF_TRACE") +
                        " --speed 60 --max-workers 3 --kill-fraction 0.5 --seed 4 --settle-ms 500 "
                        "--calibrate-ms 1500 --finish-with epochs=1 -- " +
                        env_or_empty("KF_ELASTIC_WORKER") +
                        " --samples 20000 --dim 32 --batch 64 --epochs 1000");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const int n : {1, 2, 3}) {
    EXPECT_NE(
        r.output.find("] calibrated " + std::to_string(n) + (n == 1 ? " worker: " : " workers: ")),
        std::string::npos)
        << r.output;
  }
  // 5 nodes at most, scaled to 3 workers: 2, 3, 2, 1, 2 workers.
  EXPECT_NE(r.output.find("synthetic-spot.csv: 12 rows, 5 nodes at most, scaled to 3 workers; "
                          "4 changes (2 removals: "),
            std::string::npos)
      << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.output, m, std::regex(R"(throughput retained (\d+\.\d+): (\d+) steps committed of (\d+))")))
      << r.output;
  const double retained = std::stod(m[1]);
  EXPECT_GT(retained, 0.0) << r.output;
  EXPECT_LT(retained, 2.0) << r.output;
  EXPECT_GT(std::stod(m[3]), 0.0) << r.output;
  EXPECT_NE(r.output.find("kf-replay: guarantees held: identical parameters ("), std::string::npos)
      << r.output;
}

TEST(KfReplay, ATraceThatCannotBeUsedIsNamedWithItsLine) {
  const std::string bad = ::testing::TempDir() + "/bad-trace.csv";
  std::ofstream(bad) << "t_ms,action,node\n0,add,a\n10,remove,b\n";
  const auto r = replay("--trace " + bad + " -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("kf-replay: " + bad + ":3: node b is not up"), std::string::npos)
      << r.output;
  const auto missing = replay("--trace /nonexistent/trace.csv -- true");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent/trace.csv: cannot be read"), std::string::npos)
      << missing.output;
  const auto fraction = replay("--trace " + bad + " --kill-fraction 2 -- true");
  EXPECT_EQ(fraction.exit_code, 2) << fraction.output;
  EXPECT_NE(fraction.output.find("--kill-fraction must lie in [0, 1]"), std::string::npos)
      << fraction.output;
}

}  // namespace
