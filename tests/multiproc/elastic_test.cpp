// SPDX-License-Identifier: Apache-2.0
// Elastic jobs end to end: a kf-config-server, a `kfrun --watch` agent and elastic-worker
// processes (deterministic linear regression with kf::Session) on 127.0.0.1, changed while they
// train: grow and shrink, kill -9 at random steps, revoke with notice, a config server restart,
// racing kf-member commands, a joiner whose start fails. After each the job must finish with
// every remaining worker holding bitwise-identical parameters; the workers themselves check that
// every sample of each epoch was used exactly once and that no step went back past a commit
// (they print BROKEN and exit 3 otherwise); the audit trail must list each change.
#include <gtest/gtest.h>

#include <map>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "support/elastic_job.hpp"
#include "support/etcd_process.hpp"

namespace kf::test {
namespace {

// Small, quick steps: 20000 samples in global batches of 64 (313 steps per epoch).
const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 1000";

TEST(Elastic, GrowsTwoToFourAndShrinksBackWhileTraining) {
  ElasticJob job("grow");
  ASSERT_FALSE(job.url().empty());
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  auto r = job.member("resize 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(4)) << job.err();
  const long at4 = job.progress();
  ASSERT_TRUE(job.wait_progress(at4 + 50));
  r = job.member("resize 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) { return e.type == "joined"; }));
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) { return e.type == "left"; }));
}

TEST(Elastic, RevokedWorkerFinishesItsStepAndLeavesCleanly) {
  ElasticJob job("revoke");
  job.start(3, kArgs);
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  const auto before = job.client().get_cluster();
  const std::string leaver = before.workers[1].endpoint.str();
  auto r = job.member("revoke " + leaver + " --notice 10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  ASSERT_TRUE(job.wait_event("exited", leaver)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  EXPECT_NE(job.out().find("left step"), std::string::npos) << job.out();
  EXPECT_FALSE(job.has_event([&](const ConfigEvent& e) {
    return e.type == "failed" && e.worker == leaver;
  })) << "a revoked worker leaves cleanly";
}

// Hot spares (docs/elastic.md): `spares: 1` keeps one started outside the cluster, holding
// the commits rank 0 sends it. A kill -9 and then a notice each move the spare in, in the same
// write that removes the worker, so the job keeps its two workers; the agents place a new spare
// after each. The job ends with identical models and every sample used once.
TEST(ElasticSpares, ASpareTakesThePlaceOfAKilledWorkerAndOfOneGivenNotice) {
  ElasticJob job("spares");
  const auto file = job.dir() / "job.yaml";
  std::ofstream(file) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\nspares: 1\n";
  job.set_agent_options("--job " + file.string());
  job.start(2, kArgs);
  const auto spare_ready = [&](const std::string& not_this) {
    std::string spare;
    eventually(
        [&] {
          const auto c = job.client().get_cluster();
          if (c.spares.size() != 1 || c.spares[0].endpoint.str() == not_this) return false;
          spare = c.spares[0].endpoint.str();
          return job.err_lines_with(spare + ": a hot spare holding commit") > 0;
        },
        60s);
    return spare;
  };
  const std::string first = spare_ready("");
  ASSERT_FALSE(first.empty()) << job.err();
  ASSERT_TRUE(job.wait_progress(job.progress() + 20)) << job.err();

  // kill -9 of rank 1: the survivors' write moves the spare in.
  const std::string victim = job.client().get_cluster().workers[1].endpoint.str();
  ASSERT_EQ(::kill(job.worker_pid(victim), SIGKILL), 0);
  ASSERT_TRUE(eventually(
      [&] {
        const auto c = job.client().get_cluster();
        return c.size() == 2 && c.rank_of(Endpoint::parse(first)).has_value();
      },
      60s))
      << job.err();
  ASSERT_TRUE(eventually(
      [&] { return job.err_lines_with("a hot spare moved in, holding commit") > 0; }, 60s))
      << job.err();
  EXPECT_TRUE(job.has_event([&](const ConfigEvent& e) {
    return e.type == "promoted" && e.worker == first && e.detail.find(victim) != std::string::npos;
  })) << "the promotion is in the audit trail";

  // A new spare, then a notice for the worker that is rank 1 now: the new spare moves in.
  const std::string second = spare_ready(first);
  ASSERT_FALSE(second.empty()) << job.err();
  const std::string leaver = job.client().get_cluster().workers[1].endpoint.str();
  auto r = job.member("notice " + leaver + " --in 10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("moved in the spare " + second), std::string::npos) << r.output;
  ASSERT_TRUE(job.wait_event("exited", leaver)) << job.err();
  ASSERT_TRUE(job.wait_progress(job.progress() + 20)) << job.err();
  EXPECT_EQ(job.client().get_cluster().size(), 2);
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
}

// kill -9 of a random worker at a random step; 20 seeds.
TEST(Elastic, SurvivesKillNineOfARandomWorkerAtARandomStep) {
  // KF_TEST_SEED=N runs that seed alone.
  const int only = std::atoi(env_or_empty("KF_TEST_SEED").c_str());
  for (int seed = only > 0 ? only : 1; seed <= (only > 0 ? only : 20); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 gen(static_cast<unsigned>(seed));
    const int np = 3 + seed % 2;
    ElasticJob job("kill" + std::to_string(seed));
    job.start(np, kArgs);
    const long at = std::uniform_int_distribution<long>(5, 300)(gen);
    ASSERT_TRUE(job.wait_progress(at)) << job.err();
    const std::string victim = job.kill_random_worker(gen);
    ASSERT_FALSE(victim.empty());
    ASSERT_TRUE(job.wait_size(np - 1)) << job.err();
    job.finish_soon();
    job.expect_clean_finish(job.wait(), np - 1);
    job.expect_one_recovery_write(np - 1);
    EXPECT_TRUE(job.has_event(
        [&](const ConfigEvent& e) { return e.type == "failed" && e.worker == victim; }));
    if (::testing::Test::HasFailure()) break;
  }
}

// Boundaries on change in an asynchronous mode (docs/elastic.md, "Boundaries on change"): a step
// ends at a boundary only when a worker needs one, and each worker trains through its own piece of
// the epoch. A grow, a kill -9 at a drawn step and a revoke with notice while the workers step at
// their own pace; the workers check that each sample counts once per epoch in the state they
// hold and that no step went back past a commit, and the job ends with identical parameters.
// Boundaries stay rare: each worker passed far fewer than it took steps.
void grow_kill_revoke_on_change(const std::string& name, const std::string& mode) {
  const int only = std::atoi(env_or_empty("KF_TEST_SEED").c_str());
  for (int seed = only > 0 ? only : 1; seed <= (only > 0 ? only : 2); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 gen(static_cast<unsigned>(seed));
    ElasticJob job(name + std::to_string(seed));
    job.start(3, kArgs + " --mode " + mode + " --boundaries on-change");
    ASSERT_TRUE(job.wait_progress(std::uniform_int_distribution<long>(20, 200)(gen))) << job.err();
    auto r = job.member("resize 4");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(job.wait_size(4)) << job.err();
    ASSERT_TRUE(
        job.wait_progress(job.progress() + std::uniform_int_distribution<long>(5, 200)(gen)))
        << job.err();
    const std::string victim = job.kill_random_worker(gen);
    ASSERT_FALSE(victim.empty());
    ASSERT_TRUE(job.wait_size(3)) << job.err();
    ASSERT_TRUE(job.wait_progress(job.progress() + 50)) << job.err();
    const std::string leaver = job.client().get_cluster().workers[1].endpoint.str();
    r = job.member("revoke " + leaver + " --notice 10");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(job.wait_size(2)) << job.err();
    ASSERT_TRUE(job.wait_event("exited", leaver)) << job.err();
    job.finish_soon();
    job.expect_clean_finish(job.wait(), 2);
    EXPECT_TRUE(job.has_event(
        [&](const ConfigEvent& e) { return e.type == "failed" && e.worker == victim; }));
    for (const auto& line : job.finals()) {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(line, m, std::regex("final step=(\\d+) .* plans=(\\d+)")))
          << line;
      EXPECT_LT(std::stol(m[2]) * 4, std::stol(m[1])) << "a boundary at most steps: " << line;
    }
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(ElasticOnChange, PairAveragingWithoutAPerStepBoundaryGrowsSurvivesKillNineAndRevoke) {
  grow_kill_revoke_on_change("onchange", "pair-avg");
}

// The parameter server without a per-step boundary: rank 0 serves at its own steps and marks
// its answers before a boundary, so that no worker waits for it there.
TEST(ElasticOnChange, ParameterServerWithoutAPerStepBoundaryGrowsSurvivesKillNineAndRevoke) {
  grow_kill_revoke_on_change("psonchange", "async-ps:max_staleness=1");
}

// sma with boundaries on change: a boundary only at the averaging steps (every 8th), where the
// workers meet anyway; a kill -9 between two is found at the next averaging.
TEST(ElasticOnChange, SmaWithBoundariesOnlyAtItsAveragingsGrowsSurvivesKillNineAndRevoke) {
  grow_kill_revoke_on_change("smaonchange", "sma:period=8");
}

// The same job with etcd as the control plane (etcd://): a grow, a kill -9 and a shrink, each
// committed once, with the same guarantees at the end.
TEST(ElasticEtcd, GrowsSurvivesKillNineAndShrinksOnEtcd) {
  EtcdProcess etcd;
  if (!etcd.error().empty()) GTEST_SKIP() << etcd.error();
  ElasticJob job("etcd", etcd.url());
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(30)) << job.err();
  auto r = job.member("resize 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(4)) << job.err();
  ASSERT_TRUE(job.wait_progress(job.progress() + 30)) << job.err();
  std::mt19937 gen(7);
  const std::string victim = job.kill_random_worker(gen);
  ASSERT_FALSE(victim.empty());
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  job.expect_one_recovery_write(3);
  r = job.member("resize 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  // Every change once: versions 1 (initial), 2 (resize 4), 3 (the kill), 4 (resize 2), 5
  // (epochs), 6 (finished); each cluster_changed names its own version.
  std::set<std::uint64_t> versions;
  int changes = 0;
  for (const auto& e : job.events()) {
    if (e.type != "cluster_changed") continue;
    ++changes;
    versions.insert(e.version.value_or(0));
  }
  EXPECT_EQ(static_cast<std::size_t>(changes), versions.size()) << "a change was applied twice";
  EXPECT_EQ(job.client().get_cluster().version, versions.empty() ? 0 : *versions.rbegin());
}

// Gradients on "device" buffers through the staging backend, with host memory standing in for
// the device: the same guarantees through a grow and a kill -9 (tests/gpu runs this on a GPU).
TEST(ElasticDevice, StagedGradientsKeepTheGuaranteesThroughGrowAndKill) {
  grow_then_kill("device", kArgs + " --device standin", 7);
}

TEST(Elastic, ConfigServerRestartDoesNotStopTrainingAndChangesResume) {
  ElasticJob job("restart");
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  const std::string address = job.server().address();
  job.stop_server();
  const long down_at = job.progress();
  EXPECT_TRUE(job.wait_progress(down_at + 100)) << "training stopped while the service was down";
  job.restart_server(address);
  ASSERT_FALSE(job.url().empty()) << "the server did not come back on " << address;
  auto r = job.member("add");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
}

// Starts 4 workers whose survivors wait `writer_wait_ms` for their writer after a failure, and
// returns the pids of ranks 0 and 1 once the job trains (-1 and a test failure otherwise).
std::array<pid_t, 2> start_four_with_writer_wait(ElasticJob& job, const char* writer_wait_ms) {
  ::setenv("KF_RECOVERY_WRITER_WAIT_MS", writer_wait_ms, 1);
  job.start(4, kArgs);
  ::unsetenv("KF_RECOVERY_WRITER_WAIT_MS");
  if (!job.wait_progress(30)) {
    ADD_FAILURE() << "the job does not train:\n" << job.err();
    return {-1, -1};
  }
  const auto c = job.client().get_cluster();
  if (c.size() != 4) {
    ADD_FAILURE() << "a cluster of " << c.size() << " workers, not 4";
    return {-1, -1};
  }
  return {job.worker_pid(c.workers[0].endpoint.str()), job.worker_pid(c.workers[1].endpoint.str())};
}

// After rank 0's kill -9 the survivors' writer is rank 1, which is stopped (SIGSTOP) and not yet
// known to be lost: the other two wait KF_RECOVERY_WRITER_WAIT_MS for its write, then write the
// successor themselves; the next recovery removes rank 1, which, let go on, finds itself
// removed and leaves.
TEST(Elastic, SurvivorsWriteThemselvesWhenTheirWriterIsStopped) {
  ElasticJob job("writer-stopped");
  const auto [first, writer] = start_four_with_writer_wait(job, "100");  // below the agent's 500
  ASSERT_GT(first, 0);
  ASSERT_GT(writer, 0);
  ASSERT_EQ(::kill(writer, SIGSTOP), 0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  const bool shrank = job.wait_size(2);
  ::kill(writer, SIGCONT);
  ASSERT_TRUE(shrank) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  // One or both (the second may see the first one's write just before its own wait ends).
  EXPECT_GE(job.err_lines_with("within 100 ms; writing it"), 1) << job.err();
}

// kill -9 of ranks 0 and 1 at once: a survivor that sees rank 0's loss first waits for rank 1,
// its writer, until it sees that loss too and passes the task on (rank 2 writes one version
// without both), long before the wait would end or the agent would remove them.
TEST(Elastic, AWriterLostTooPassesTheWriteOn) {
  ElasticJob job("writer-lost");
  const auto [first, second] = start_four_with_writer_wait(job, "600000");
  ASSERT_GT(first, 0);
  ASSERT_GT(second, 0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_EQ(::kill(second, SIGKILL), 0);
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  EXPECT_EQ(job.err_lines_with(": wrote v"), 1) << job.err();
  EXPECT_EQ(job.err_lines_with("kfrun: removed "), 0) << "the agent removed them" << job.err();
}

TEST(Elastic, RacingMemberCommandsBothTakeEffect) {
  ElasticJob job("race");
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  Ran a, b;
  std::thread ta([&] { a = job.member("add"); });
  std::thread tb([&] { b = job.member("add"); });
  ta.join();
  tb.join();
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(job.client().get_cluster().size(), 4);
  ASSERT_TRUE(job.wait_size(4)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 4);
}

// A loss that meets a joiner nobody can reach (added on a host where no agent runs, so it never
// starts): the recovery gives the joiner KF_RECOVERY_JOINER_WAIT_MS and then forms without it,
// instead of waiting on its connect timeout (20 s); the job trains on with the survivors.
TEST(Elastic, ARecoveryDoesNotWaitOnAJoinerNobodyCanReach) {
  ElasticJob job("recovery-joiner");
  job.start(3, kArgs, {"KF_RECOVERY_JOINER_WAIT_MS=200"});
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  auto r = job.member("add --host 127.0.0.9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(
      eventually([&] { return job.err_lines_with("adds workers; switching once") > 0; }, 30s))
      << job.err();
  const auto c = job.client().get_cluster();
  ASSERT_EQ(c.size(), 4);
  const std::string victim = c.workers[1].endpoint.str();
  const pid_t pid = job.worker_pid(victim);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(eventually(
      [&] {
        const auto now = job.client().get_cluster();
        return now.size() == 2 && !now.rank_of(Endpoint::parse(victim));
      },
      30s))
      << job.err();
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  EXPECT_GT(job.err_lines_with("not reached within 200 ms of a recovery; forming without them"), 0)
      << job.err();
  const long at = job.progress();
  ASSERT_TRUE(job.wait_progress(at + 50)) << "training stopped after the recovery";
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
}

TEST(Elastic, JoinerWhoseStartFailsIsDroppedAndTrainingGoesOn) {
  ElasticJob job("badjoiner");
  const auto fail = job.dir() / "fail-once";
  job.start(2, kArgs + " --fail-start-once " + fail.string());
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  std::ofstream(fail) << "x\n";
  auto r = job.member("add");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually(
      [&] { return job.has_event([](const ConfigEvent& e) { return e.type == "failed"; }); }, 30s))
      << job.err();
  ASSERT_TRUE(eventually([&] { return job.client().get_cluster().size() == 2; }, 30s));
  const long at = job.progress();
  ASSERT_TRUE(job.wait_progress(at + 50)) << "training stopped after the failed join";
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
}

// A policy proposes resize 2 -> 3 and batch 64 -> 128 in one proposal at step 100: every worker
// applies both at the same step, and no worker ever runs with one of them alone.
TEST(ElasticPolicies, ResizeAndBatchSizeChangeAtTheSameStepOnEveryWorker) {
  ElasticJob job("policy");
  job.start(2, kArgs + " --policy-grow-at 100 --policy-grow-to 3 --policy-batch 128");
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  const long at3 = job.progress();
  ASSERT_TRUE(job.wait_progress(at3 + 20));
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  // "[host:port] setting step=S workers=N batch=B version=V"
  std::map<std::string, std::vector<std::pair<long, std::string>>> seen;
  std::istringstream in(job.out());
  const std::regex re(R"(^\[([^\]]+)\] setting step=(\d+) (workers=\d+ batch=\d+))");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) seen[m[1]].emplace_back(std::stol(m[2]), m[3]);
  }
  ASSERT_EQ(seen.size(), 3u) << job.out();
  std::set<long> switch_steps;
  for (const auto& [worker, changes] : seen) {
    for (const auto& [step, setting] : changes) {
      EXPECT_TRUE(setting == "workers=2 batch=64" || setting == "workers=3 batch=128")
          << worker << " ran step " << step << " with " << setting;
      if (setting == "workers=3 batch=128") switch_steps.insert(step);
    }
  }
  EXPECT_EQ(switch_steps.size(), 1u) << "workers switched at different steps:\n" << job.out();
  EXPECT_GE(*switch_steps.begin(), 100);
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) {
    return e.type == "resized" && e.detail.find("test-grow") != std::string::npos;
  })) << "the audit trail names the policy";
}

// With `autoscale`, a policy's resize becomes autoscale's target, and the agents place the
// worker on an offered slot: 2 -> 3 while training, every worker ending with the same model.
TEST(ElasticPolicies, UnderAutoscaleAResizeIsPlacedOnTheOfferedSlots) {
  ElasticJob job("policy-autoscale");
  const auto file = job.dir() / "job.yaml";
  std::ofstream(file) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\n"
                         "autoscale: {target: 2, cooldown_s: 0}\n";
  job.set_agent_options("--job " + file.string());
  job.start(2, kArgs + " --policy-grow-at 100 --policy-grow-to 3");
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  const long at3 = job.progress();
  ASSERT_TRUE(job.wait_progress(at3 + 20));
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) {
    return e.type == "note" && e.detail.find("test-grow") != std::string::npos &&
           e.detail.find("(as autoscale's target)") != std::string::npos;
  })) << "the policy's proposal became the target";
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) {
    return e.type == "placed" && e.detail.starts_with("autoscale: target 3,");
  })) << "the agent placed the third worker";
  EXPECT_EQ(job.client().get_cluster().settings["autoscale"]["target"], 3);
}

// The GNS operator is fed from the step's control collective, so every worker holds the same
// estimate at every step (to the last bit: the workers print 17 significant digits).
TEST(ElasticMonitors, GradientNoiseScaleIsIdenticalOnEveryWorker) {
  ElasticJob job("gns");
  job.start(3, kArgs + " --gns");
  ASSERT_TRUE(job.wait_progress(60)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  // "[host:port] gns step=S sqr=.. tr_sigma=.. b_simple=.."
  std::map<long, std::map<std::string, std::string>> by_step;
  std::istringstream in(job.out());
  const std::regex re(R"(^\[([^\]]+)\] gns step=(\d+) (.*)$)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) by_step[std::stol(m[2])][m[1]] = m[3];
  }
  int compared = 0;
  for (const auto& [step, seen] : by_step) {
    if (seen.size() < 3) continue;  // the last steps, cut short by the finish
    for (const auto& [worker, values] : seen) {
      EXPECT_EQ(values, seen.begin()->second) << "step " << step << ": " << worker << " differs";
      EXPECT_EQ(values.find("sqr=-1 "), std::string::npos) << "no estimate at step " << step;
    }
    ++compared;
  }
  EXPECT_GE(compared, 50) << job.out();
}

// A worker made 3x slower is scored as a straggler by the monitors and reported once (event
// "slow"), and once it is fast again, reported as recovered; no other worker is.
TEST(ElasticMonitors, AStragglerIsReportedWhenItTurnsSlowAndWhenItRecovers) {
  ElasticJob job("stragglers");
  job.start(3, kArgs + " --sample-us 100 --slow-rank 2 --slow-until 300");
  ASSERT_TRUE(job.wait_progress(5)) << job.err();
  const std::string slow = job.client().get_cluster().workers.at(2).endpoint.str();
  ASSERT_TRUE(job.wait_event("slow", slow)) << job.err();
  ASSERT_TRUE(job.wait_event("recovered", slow)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  int reports = 0;
  for (const auto& e : job.events()) {
    if (e.type != "slow" && e.type != "recovered") continue;
    ++reports;
    EXPECT_EQ(e.worker, slow) << e.type << ": " << e.detail;
    if (e.type == "slow") {
      // "... samples per second of compute: 0.33 of the fastest worker's, ..."
      const auto at = e.detail.find(": 0.");
      ASSERT_NE(at, std::string::npos) << e.detail;
      EXPECT_LT(std::stod(e.detail.substr(at + 2)), 0.7) << e.detail;
    }
  }
  EXPECT_EQ(reports, 2) << "a worker was reported more than once";
}

TEST(ElasticPolicies, ThrowingPolicyIsDisabledAndTheJobCompletes) {
  ElasticJob job("thrower");
  job.start(2, kArgs + " --policy-throw-at 30");
  ASSERT_TRUE(job.wait_progress(100)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  EXPECT_NE(job.out().find("policy disabled: test-thrower: thrown on purpose at step 30"),
            std::string::npos)
      << job.out();
}

// A live run records its policy runs; kf-policy-replay runs the job file's policies (here the
// example plugin) over the recording and must make exactly the same decisions.
// Replays each worker's recording (job.dir()/runs-*) with kf-policy-replay --check, expecting no
// difference from the live decisions. Returns how many recordings there were, and how many of
// them replayed a decision holding `decision`.
std::pair<int, int> replay_recordings(const ElasticJob& job, const std::filesystem::path& yaml,
                                      const std::string& decision) {
  int replayed = 0;
  int decided = 0;
  for (const auto& entry : std::filesystem::directory_iterator(job.dir())) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("runs-")) continue;
    const Ran r = run_shell(env_or_empty("KF_POLICY_REPLAY") + " --check --job " + yaml.string() +
                            " " + entry.path().string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(", 0 differences from the recording"), std::string::npos) << r.output;
    decided += r.output.find(decision) != std::string::npos ? 1 : 0;
    ++replayed;
  }
  return {replayed, decided};
}

TEST(ElasticPolicies, ReplayReproducesTheDecisionsOfALiveRun) {
  ElasticJob job("replay");
  const auto yaml = job.dir() / "job.yaml";
  std::ofstream(yaml) << "job: {name: replay}\n"
                      << "plugins: [" << env_or_empty("KF_TEST_PLUGIN") << "]\n"
                      << "policies:\n"
                      << "  - name: lr-plateau\n"
                      << "    params: {patience: 20, min_delta: 0.0, min_lr: 0.0001, lr: 0.05}\n";
  const auto record = job.dir() / "runs";
  job.start(2, kArgs + " --job " + yaml.string() + " --policy-record " + record.string());
  ASSERT_TRUE(eventually(
      [&] {
        return job.has_event([](const ConfigEvent& e) {
          return e.detail.find("lr-plateau: lr=") != std::string::npos;
        });
      },
      60s))
      << "the live run never changed the learning rate\n"
      << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  const auto [replayed, decided] = replay_recordings(job, yaml, "\"lr\":");
  EXPECT_EQ(replayed, 2) << "one recording per worker";
  EXPECT_EQ(decided, 2) << "a recording replayed no decision";
}

// The stragglers policy live: a worker 3x slower is balanced, then revoked with notice, and the
// hot spare takes its place; the job keeps its size and finishes cleanly, and each worker's
// recording replays to the same decisions.
TEST(ElasticPolicies, TheStragglersPolicyRevokesASlowWorkerAndASpareTakesItsPlace) {
  ElasticJob job("stragglers-policy");
  const auto yaml = job.dir() / "job.yaml";
  std::ofstream(yaml) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\nspares: 1\n"
                      << "policies:\n"
                      << "  - name: stragglers\n"
                      << "    params: {revoke_after: 1, cooldown: 1000}\n";
  job.set_agent_options("--job " + yaml.string());
  const auto record = job.dir() / "runs";
  job.start(3, kArgs + " --sample-us 100 --slow-rank 2 --job " + yaml.string() +
                   " --policy-record " + record.string());
  ASSERT_TRUE(job.wait_progress(5)) << job.err();
  const std::string slow = job.client().get_cluster().workers.at(2).endpoint.str();
  ASSERT_TRUE(job.wait_event("revoked", slow, 60s)) << job.err();
  ASSERT_TRUE(job.wait_event("exited", slow)) << job.err();
  const auto c = job.client().get_cluster();
  EXPECT_EQ(c.size(), 3) << "the spare took the revoked worker's place";
  EXPECT_FALSE(c.rank_of(Endpoint::parse(slow)).has_value());
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) { return e.type == "promoted"; }));
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) {
    return e.detail.find("stragglers: balance=true") != std::string::npos;
  })) << "balanced before it was revoked";
  ASSERT_TRUE(job.wait_progress(job.progress() + 20)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  // The first three workers' recordings hold the revoke; the spares' start after it.
  const auto [replayed, decided] = replay_recordings(job, yaml, "\"revoke\":");
  EXPECT_GE(replayed, 3) << "one recording per worker";
  EXPECT_EQ(decided, 3);
}

// Under autoscale the stragglers policy's revoke leaves the target as it was, so the agents place
// a replacement on an offered slot (after the 10 s a host that lost a worker waits).
TEST(ElasticPolicies, UnderAutoscaleARevokedStragglerIsReplacedOnAnOfferedSlot) {
  ElasticJob job("stragglers-autoscale");
  const auto yaml = job.dir() / "job.yaml";
  std::ofstream(yaml) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\n"
                      << "autoscale: {target: 3, cooldown_s: 0}\n"
                      << "policies:\n"
                      << "  - name: stragglers\n"
                      << "    params: {revoke_after: 1, cooldown: 1000}\n";
  job.set_agent_options("--job " + yaml.string());
  job.start(3, kArgs + " --sample-us 100 --slow-rank 2 --job " + yaml.string());
  ASSERT_TRUE(job.wait_progress(5)) << job.err();
  const std::string slow = job.client().get_cluster().workers.at(2).endpoint.str();
  ASSERT_TRUE(job.wait_event("revoked", slow, 60s)) << job.err();
  ASSERT_TRUE(eventually(
      [&] {
        return job.has_event([](const ConfigEvent& e) {
          return e.type == "placed" && e.detail.starts_with("autoscale: target 3,");
        });
      },
      60s))
      << job.err();
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  ASSERT_TRUE(job.wait_progress(job.progress() + 20)) << job.err();
  EXPECT_FALSE(job.client().get_cluster().rank_of(Endpoint::parse(slow)).has_value());
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
}

// A built-in policy live: throughput-scaling measures 2 workers, adds one (its rule with a single
// worker count), and the job takes the change on every worker at one step and finishes cleanly.
TEST(ElasticPolicies, ThroughputScalingGrowsTheJobItself) {
  ElasticJob job("scaling");
  const auto yaml = job.dir() / "job.yaml";
  std::ofstream(yaml) << "job: {name: scaling}\n"
                      << "policies:\n"
                      << "  - name: throughput-scaling\n"
                      << "    params: {spawn_size: 1, min_steps: 20, every: 20, max_workers: 3,"
                      << " cooldown: 1000000}\n";
  job.start(2, kArgs + " --gns --job " + yaml.string());
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  EXPECT_TRUE(job.has_event([](const ConfigEvent& e) {
    return e.type == "resized" && e.detail.find("throughput-scaling") != std::string::npos;
  })) << "the audit trail names the policy";
  const long at3 = job.progress();
  ASSERT_TRUE(job.wait_progress(at3 + 20));
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
}

// kfrun --job: the workers get the job file as KF_JOB_FILE, and Session::from_environment loads
// its policies (here the example plugin's) and runs them with no code in the program.
TEST(ElasticPolicies, JobFilePoliciesRunWithoutCodeInTheProgram) {
  ElasticJob job("jobfile");  // only for its directory
  const auto yaml = job.dir() / "job.yaml";
  std::ofstream(yaml) << "job: {name: static}\n"
                      << "workers: {initial: 2}\n"
                      << "learning_rate: 0.05\n"
                      << "plugins: [" << env_or_empty("KF_TEST_PLUGIN") << "]\n"
                      << "policies:\n"
                      << "  - name: lr-plateau\n"
                      << "    params: {patience: 5, min_delta: 1.0e+9, min_lr: 0.0001, lr: 0.05}\n";
  const Ran r = run_shell("KF_LOG_LEVEL=info " + env_or_empty("KFRUN") + " --job " + yaml.string() +
                          " -- " + env_or_empty("KF_ELASTIC_WORKER") +
                          " --samples 2000 --dim 8 --batch 64 --epochs 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // min_delta is huge, so the loss never improves enough: the LR is cut after 5 steps.
  EXPECT_NE(r.output.find("after_step applied lr-plateau: lr="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("final step="), std::string::npos) << r.output;

  std::ofstream(yaml) << "job: {}\npolicies:\n  - name: no-such-policy\n";
  const Ran bad = run_shell(env_or_empty("KFRUN") + " --job " + yaml.string() + " -- " +
                            env_or_empty("KF_ELASTIC_WORKER"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find(yaml.string() + ":3: policies:"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("no-such-policy"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace kf::test
