// SPDX-License-Identifier: Apache-2.0
// Notices and orphans with real training: elastic-worker processes (deterministic linear
// regression with kf::Session) under two kfrun agents, on 127.0.0.1 and 127.0.0.2 (another
// loopback address stands for another machine). The second agent is told its machine goes away;
// its workers must finish their step and leave, with nothing committed lost and every sample of
// each epoch used once (the workers check both and print BROKEN otherwise), the survivors must
// finish with identical parameters, and the told agent must exit 0 within its grace. And workers
// whose agent died and whose config service is gone for good stop, while an outage with their
// agent alive leaves them training; and a job that keeps changing without committing stops.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "support/elastic_job.hpp"

namespace kf::test {
namespace {

const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 1000";
constexpr const char* kOther = "127.0.0.2";

// Two workers on 127.0.0.1 and `count` on the other host, placed by kf-member add --host, all
// training; returns the other agent's index.
std::size_t start_two_hosts(ElasticJob& job, const std::string& other_options, int count) {
  job.start(2, kArgs);
  EXPECT_TRUE(job.wait_progress(20)) << job.err();
  const auto other = job.start_other_agent(kOther, other_options);
  const auto r =
      job.member("add --host " + std::string(kOther) + " --count " + std::to_string(count));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(job.wait_size(2 + count)) << job.err() << job.other_err(kOther);
  EXPECT_TRUE(job.wait_progress(job.progress() + 20)) << job.err();
  return other;
}

std::vector<std::string> workers_on(const Cluster& c, const std::string& host) {
  std::vector<std::string> found;
  for (const auto& w : c.workers) {
    if (w.endpoint.host == host) found.push_back(w.endpoint.str());
  }
  return found;
}

// The leavers left cleanly: revoked with notice, exited 0, never failed; the job shrank by one
// change to the workers of 127.0.0.1.
void expect_left_cleanly(const ElasticJob& job, const std::vector<std::string>& leavers) {
  for (const auto& w : leavers) {
    EXPECT_TRUE(job.has_event([&](const ConfigEvent& e) {
      return e.type == "revoked" && e.worker == w && e.detail.find("notice ") != std::string::npos;
    })) << w;
    EXPECT_TRUE(job.has_event([&](const ConfigEvent& e) {
      return e.type == "exited" && e.worker == w && e.detail == "exit 0";
    })) << w
        << "\n"
        << job.other_err(kOther);
    EXPECT_FALSE(job.has_event([&](const ConfigEvent& e) {
      return e.type == "failed" && e.worker == w;
    })) << w
        << " failed instead of leaving";
  }
}

// Slurm's --signal=USR1@N sends the signal to every process of the job step: the agent takes it
// as the notice, and its workers (which start with it ignored) finish their step and leave. The
// job keeps a hot spare (on 127.0.0.1: of two hosts with as many workers, the first): the agent's
// write that takes its workers out moves the spare in, so the job goes on with 3 workers.
TEST(Notice, ASignalledHostsWorkersLeaveAndTheJobFinishesClean) {
  ElasticJob job("notice-usr1");
  const auto other = start_two_hosts(job, "--notice-signal USR1 --grace 30", 2);
  auto set = job.member("set spares=1");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  std::string spare;
  ASSERT_TRUE(eventually(
      [&] {
        const auto c = job.client().get_cluster();
        spare = c.spares.empty() ? "" : c.spares[0].endpoint.str();
        return !spare.empty() && job.err_lines_with(spare + ": a hot spare holding commit") > 0;
      },
      60s))
      << job.err();
  EXPECT_TRUE(spare.starts_with("127.0.0.1:")) << spare;
  const auto leavers = workers_on(job.client().get_cluster(), kOther);
  ASSERT_EQ(leavers.size(), 2u);
  for (const auto& w : leavers) ASSERT_EQ(::kill(job.worker_pid(w), SIGUSR1), 0) << w;
  const auto noticed = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(job.other_agent_pid(other), SIGUSR1), 0);
  EXPECT_EQ(job.wait_other_agent(other), 0) << job.other_err(kOther);
  EXPECT_LT(std::chrono::steady_clock::now() - noticed, 30s) << "not within the grace";
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  const long after = job.progress();
  ASSERT_TRUE(job.wait_progress(after + 20)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 3);
  expect_left_cleanly(job, leavers);
  EXPECT_TRUE(job.has_event([&](const ConfigEvent& e) {
    return e.type == "promoted" && e.worker == spare &&
           e.detail.find("in place of the workers of 127.0.0.2") != std::string::npos;
  })) << "the agent's write moved the spare in";
  EXPECT_NE(job.other_err(kOther).find("kfrun: left on the notice"), std::string::npos)
      << job.other_err(kOther);
}

TEST(Notice, KfMemberNoticeForAHostDrainsItWhileTheJobTrains) {
  ElasticJob job("notice-member");
  const auto other = start_two_hosts(job, "", 1);
  const auto leavers = workers_on(job.client().get_cluster(), kOther);
  const auto r = job.member("notice " + std::string(kOther) + " --in 20");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(job.wait_other_agent(other), 0) << job.other_err(kOther);
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  expect_left_cleanly(job, leavers);
}

// The steps at which the workers in `out` left ("left step S" lines).
std::vector<long> left_steps(const std::string& out) {
  std::vector<long> steps;
  const std::regex left(R"(left step (\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), left); it != std::sregex_iterator();
       ++it) {
    steps.push_back(std::stol((*it)[1]));
  }
  return steps;
}

// Every worker of the job given notice at once (its one agent signalled): the job cannot keep a
// worker, so it is suspended; rank 0 writes the last commit to the checkpoint and every worker
// leaves at that step. An agent started later with workers (on another host) resumes the job:
// its workers load the checkpoint and train on from that step, every sample of each epoch still
// used once, and the job finishes clean.
TEST(Suspend, ANoticeToEveryWorkerSuspendsTheJobAndANewAgentResumesItFromTheCheckpoint) {
  ElasticJob job("suspend");
  const auto checkpoint = job.dir() / "checkpoint";
  // No periodic checkpoint: the one the job resumes from is the suspension's.
  const std::vector<std::string> env{"KF_CHECKPOINT=" + checkpoint.string(),
                                     "KF_CHECKPOINT_EVERY=1000000000"};
  job.set_agent_options("--notice-signal USR1");
  job.start(2, kArgs, env);
  ASSERT_TRUE(job.wait_progress(50)) << job.err();
  ASSERT_EQ(::kill(job.agent_pid(), SIGUSR1), 0);
  ASSERT_EQ(job.wait(), 0) << job.err();
  EXPECT_NE(job.err().find("kfrun: suspended the job (SIGUSR1"), std::string::npos) << job.err();
  EXPECT_EQ(job.err().find("job finished"), std::string::npos) << job.err();
  EXPECT_EQ(job.client().get_cluster().settings.value("suspended", false), true);
  const auto left = left_steps(job.out());
  ASSERT_EQ(left.size(), 2u) << job.out();
  EXPECT_EQ(left[0], left[1]) << "both workers leave at the same commit";
  ASSERT_TRUE(std::filesystem::exists(checkpoint));
  EXPECT_TRUE(job.has_event([&](const ConfigEvent& e) {
    return e.type == "suspended" && e.detail.find("at commit ") == 0 &&
           e.detail.find("checkpoint " + checkpoint.string() + " written") != std::string::npos;
  })) << "rank 0 says where the commit is kept";

  const auto other = job.start_other_agent(kOther, "-np 2", env);
  ASSERT_TRUE(job.wait_progress(left[0] + 50)) << job.other_err(kOther);
  const std::string resumed_out = job.other_out(kOther);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(resumed_out, m, std::regex(R"(joined v\d+ rank 0 size 2 step (\d+))")))
      << resumed_out;
  EXPECT_EQ(std::stol(m[1]), left[0]) << "the resumed job starts at the suspension's step";
  EXPECT_NE(job.other_err(kOther).find("kfrun: resumed the suspended job: 2 workers on 127.0.0.2"),
            std::string::npos)
      << job.other_err(kOther);
  job.finish_soon();
  EXPECT_EQ(job.wait_other_agent(other), 0) << job.other_err(kOther);
  EXPECT_EQ(resumed_out.find("BROKEN"), std::string::npos);
  const std::string finals = job.other_out(kOther);
  const std::regex final_line(R"(final step=(\d+) workers=2 hash=([0-9a-f]+))");
  std::set<std::string> hashes;
  int count = 0;
  for (auto it = std::sregex_iterator(finals.begin(), finals.end(), final_line);
       it != std::sregex_iterator(); ++it, ++count) {
    hashes.insert((*it)[2]);
  }
  EXPECT_EQ(count, 2) << finals;
  EXPECT_EQ(hashes.size(), 1u) << finals;
  EXPECT_EQ(finals.find("BROKEN"), std::string::npos) << finals;
}

// The agent killed and the service stopped: nothing can adopt the workers or change their job,
// so they stop once the service has been unreachable for KF_SERVICE_TIMEOUT_MS. Before that, the
// same outage with the agent alive leaves training alone.
TEST(Orphans, WorkersWhoseAgentAndServiceAreGoneStopButAnOutageAloneDoesNotStopThem) {
  ElasticJob job("orphans");
  job.start(2, kArgs, {"KF_SERVICE_TIMEOUT_MS=1000"});
  ASSERT_TRUE(job.wait_progress(20)) << job.err();
  std::vector<pid_t> pids;
  for (const auto& w : job.client().get_cluster().workers) {
    pids.push_back(job.worker_pid(w.endpoint.str()));
    ASSERT_GT(pids.back(), 0) << w.endpoint.str() << "\n" << job.err();
  }
  job.stop_server();
  // Three timeouts of outage with the agent alive: training goes on, and nobody stops.
  const long before = job.progress();
  const auto outage_end = std::chrono::steady_clock::now() + 3s;
  EXPECT_TRUE(eventually(
      [&] {
        return std::chrono::steady_clock::now() >= outage_end && job.progress() > before + 10;
      },
      30s))
      << job.err();
  for (const pid_t pid : pids) {
    EXPECT_FALSE(ended(pid)) << pid << " stopped during an outage with its agent alive";
  }
  job.kill_agent();
  for (const pid_t pid : pids) {
    EXPECT_TRUE(wait_ended(pid, std::chrono::steady_clock::now() + 30s))
        << pid << " trains on without an agent or a service";
  }
}

// The no-progress guard: a recovery that finds no step committed for longer than
// KF_NO_PROGRESS_TIMEOUT_MS stops the job instead of going on. A kill -9 is found within
// milliseconds of the last commit and recovers; a stopped worker (SIGSTOP) holds the others at
// the boundary until heartbeats give it up (750 ms), longer than the 300 ms allowed here.
TEST(NoProgress, ARecoveryAfterTooLongWithoutACommitStopsTheJob) {
  ElasticJob job("noprogress");
  job.start(3, kArgs, {"KF_NO_PROGRESS_TIMEOUT_MS=300"});
  ASSERT_TRUE(job.wait_progress(20)) << job.err();
  std::mt19937 gen(3);
  ASSERT_FALSE(job.kill_random_worker(gen).empty());
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  const long after = job.progress();
  ASSERT_TRUE(job.wait_progress(after + 20)) << job.err();
  const auto c = job.client().get_cluster();
  const pid_t stopped = job.worker_pid(c.workers.back().endpoint.str());
  ASSERT_GT(stopped, 0);
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  EXPECT_TRUE(eventually(
      [&] { return job.err().find("no step committed for ") != std::string::npos; }, 30s))
      << job.err();
  ::kill(stopped, SIGKILL);
  EXPECT_NE(job.wait(60s), 0) << job.err();
  EXPECT_NE(job.err().find("(KF_NO_PROGRESS_TIMEOUT_MS 300): the job stops"), std::string::npos)
      << job.err();
}

}  // namespace
}  // namespace kf::test
