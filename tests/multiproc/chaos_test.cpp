// SPDX-License-Identifier: Apache-2.0
// kf-chaos end to end: random churn against a real elastic job (kf-config-server, kfrun --watch,
// elastic-worker) ends with every guarantee checked; and kf-chaos itself notices a job whose
// workers disagree, and one that hangs.
#include <gtest/gtest.h>

#include <cstdlib>
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

}  // namespace
