// SPDX-License-Identifier: Apache-2.0
// kfrun --watch on notices, end to end: an agent told that its machine goes away (SIGTERM, a
// chosen signal, a file that appears, a command that answers yes, kf-member notice) revokes its
// workers with notice, starts nothing more and exits 0 once they left; the job goes on with the
// other hosts' workers. Two agents share an external kf-config-server: the first on 127.0.0.1,
// the other, the one told, on 127.0.0.2 (another loopback address stands for another machine).
// The workers are the harness's shell scripts.
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "tools/kfrun_watch_harness.hpp"

namespace kf::test::watch {
namespace {

constexpr const char* kOther = "127.0.0.2";

class KfrunNotice : public KfrunWatch {
 protected:
  void TearDown() override {
    other_.reset();
    KfrunWatch::TearDown();
  }

  // The service, the first agent with one worker on 127.0.0.1, and the other agent on
  // 127.0.0.2 with `options` and `count` workers placed there by kf-member add --host.
  void start_job(const std::vector<std::string>& options, int count = 1) {
    std::ofstream(dir_ / "token") << "notice-e2e-token\n";
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    server_ = std::make_unique<kf::test::ServerProcess>(dir_);
    ASSERT_FALSE(server_->url().empty());
    url_ = server_->url();
    token_file_ = (dir_ / "token").string();
    start({"--watch", "--config-server", url_, "--job-token-file", token_file_, "--slots", "2",
           "-np", "1"});
    ASSERT_TRUE(agent_->wait_for_workers(1)) << agent_->output();
    std::vector<std::string> args{"--watch",   "--config-server", url_, "--job-token-file",
                                  token_file_, "--slots",         "4",  "--host",
                                  kOther};
    args.insert(args.end(), options.begin(), options.end());
    for (const std::string& a :
         {std::string("--"), std::string("/bin/sh"), std::string("-c"), worker_script(dir_)}) {
      args.push_back(a);
    }
    other_ = std::make_unique<KfrunProcess>(args);
    ASSERT_GT(other_->pid(), 0);
    const auto r =
        member("add --host " + std::string(kOther) + " --count " + std::to_string(count));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(other_->wait_for_workers(static_cast<std::size_t>(count))) << other_->output();
    for (const auto& [self, w] : other_->workers()) leavers_.push_back(self);
  }

  // The workers of the other agent left the cluster, with `revoked` events whose notice matches
  // `notice` (a regular expression such as "notice 1[78]s"), and a `draining` event for its host.
  void expect_revoked_with_notice(const std::string& notice) {
    ASSERT_TRUE(wait_for_host_event("draining")) << other_->output();
    for (const auto& w : leavers_) {
      const auto revoked = wait_for_event("revoked", w);
      ASSERT_TRUE(revoked) << other_->output();
      EXPECT_TRUE(std::regex_search(revoked->detail, std::regex(notice))) << revoked->detail;
    }
    const kf::Cluster c = client().get_cluster();
    EXPECT_EQ(c.size(), 1) << c.to_json().dump();
  }

  // Each leaver finishes its step and exits 0; the other agent then exits 0, and the job goes on
  // with the first agent's worker, which then finishes it.
  void expect_clean_leave() {
    for (const auto& w : leavers_) release(w, 0);
    EXPECT_EQ(other_->wait_exit(Clock::now() + kWait), 0) << other_->output();
    EXPECT_TRUE(
        contains(other_->output(), "kfrun: left on the notice: no worker of this host runs"))
        << other_->output();
    for (const auto& w : leavers_) {
      const auto exited = wait_for_event("exited", w);
      ASSERT_TRUE(exited) << other_->output();
      EXPECT_EQ(exited->detail, "exit 0");
      EXPECT_EQ(count_events("failed", w), 0) << w;
    }
    EXPECT_FALSE(agent_->wait_exit(Clock::now() + 100ms)) << agent_->output();
    release(self_of_rank(0), 0);
    EXPECT_EQ(wait_exit(), 0) << agent_->output();
  }

  // Waits for an event of `type` about the other host (worker empty, detail "host HOST: ...").
  std::optional<kf::ConfigEvent> wait_for_host_event(const std::string& type) {
    std::optional<kf::ConfigEvent> found;
    const std::string prefix = std::string("host ") + kOther + ": ";
    agent_->eventually(
        [&] {
          other_->pump(std::chrono::milliseconds(1));
          for (const auto& e : client().get_events()) {
            if (e.type == type && e.worker.empty() && e.detail.starts_with(prefix)) found = e;
          }
          return found.has_value();
        },
        Clock::now() + kWait);
    return found;
  }

  std::unique_ptr<kf::test::ServerProcess> server_;
  std::unique_ptr<KfrunProcess> other_;
  std::vector<std::string> leavers_;
};

TEST_F(KfrunNotice, SigtermMakesTheWorkersLeaveWithNoticeAndTheAgentExitZero) {
  start_job({"--grace", "20"}, 2);
  ASSERT_EQ(::kill(other_->pid(), SIGTERM), 0);
  ASSERT_TRUE(
      other_->wait_for_text("kfrun: notice from SIGTERM: this host goes away within "
                            "20000 ms; its 2 workers leave the job at their next step"))
      << other_->output();
  // 20 s of grace, less the 2 s between SIGTERM and SIGKILL.
  expect_revoked_with_notice("notice 1[78]s$");
  expect_clean_leave();
}

// As Slurm's --signal=USR1@N does, the signal reaches the workers too: they start with it
// ignored, so it does not kill them.
TEST_F(KfrunNotice, AChosenSignalIsANoticeAndTheWorkersIgnoreIt) {
  start_job({"--notice-signal", "USR1", "--grace", "10"});
  const auto started = wait_for_event("started", leavers_.at(0));
  ASSERT_TRUE(started);
  const pid_t worker = std::stoi(started->detail.substr(4));  // "pid N"
  ASSERT_EQ(::kill(worker, SIGUSR1), 0);
  ASSERT_EQ(::kill(other_->pid(), SIGUSR1), 0);
  ASSERT_TRUE(other_->wait_for_text("kfrun: notice from SIGUSR1: ")) << other_->output();
  expect_revoked_with_notice("SIGUSR1, notice [78]s$");
  expect_clean_leave();
}

TEST_F(KfrunNotice, AFileThatAppearsIsANoticeAndItsTimeCutsTheGrace) {
  const auto file = (dir_ / "preempted").string();
  start_job({"--notice-file", file, "--notice-poll-ms", "20", "--grace", "60"});
  std::ofstream(file) << "4\n";
  ASSERT_TRUE(other_->wait_for_text("kfrun: notice from file " + file +
                                    ": this host goes away within 4000 ms (the time the notice "
                                    "gave)"))
      << other_->output();
  expect_revoked_with_notice("notice [12]s$");
  // The worker never exits by itself: it gets SIGTERM before the 4 s are over, and counts as
  // left (it is no member any more), so the agent still exits 0.
  const auto began = Clock::now();
  EXPECT_EQ(other_->wait_exit(Clock::now() + kWait), 0) << other_->output();
  EXPECT_LT(Clock::now() - began, 4500ms) << other_->output();
  EXPECT_TRUE(other_->wait_for_text("kfrun: stopping " + leavers_.at(0))) << other_->output();
  release(self_of_rank(0), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunNotice, ACommandThatAnswersYesIsANotice) {
  const auto flag = (dir_ / "metadata-says-stop").string();
  start_job({"--notice-command", "test -e '" + flag + "'", "--notice-poll-ms", "20"});
  EXPECT_FALSE(other_->wait_for_text("kfrun: notice", std::chrono::seconds(1)))
      << "a notice before the command said so:\n"
      << other_->output();
  std::ofstream(flag) << "";
  ASSERT_TRUE(
      other_->wait_for_text("kfrun: notice from command: this host goes away within "
                            "30000 ms"))
      << other_->output();
  expect_revoked_with_notice("notice 2[78]s$");
  expect_clean_leave();
}

TEST_F(KfrunNotice, KfMemberNoticeForAHostDrainsItsAgent) {
  start_job({}, 2);
  const auto r = member("notice " + std::string(kOther) + " --in 12");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, " on 127.0.0.2 (kf-member notice, notice 12s)")) << r.output;
  const auto notice = wait_for_host_event("notice");
  ASSERT_TRUE(notice);
  EXPECT_EQ(notice->detail, "host 127.0.0.2: kf-member notice, notice 12s");
  ASSERT_TRUE(
      other_->wait_for_text("kfrun: notice from kf-member notice: this host goes away "
                            "within 12000 ms"))
      << other_->output();
  for (const auto& w : leavers_) {
    const auto revoked = wait_for_event("revoked", w);
    ASSERT_TRUE(revoked);
    EXPECT_EQ(revoked->detail, "kf-member notice, notice 12s");
  }
  EXPECT_EQ(client().get_cluster().size(), 1);
  expect_clean_leave();
}

TEST_F(KfrunNotice, KfMemberNoticeForAWorkerRevokesItWithTheNotice) {
  start_job({}, 2);
  const std::string leaver = leavers_.at(1);
  const auto r = member("notice " + leaver + " --in 9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto revoked = wait_for_event("revoked", leaver);
  ASSERT_TRUE(revoked);
  EXPECT_EQ(revoked->detail, "kf-member notice, notice 9s");
  ASSERT_TRUE(other_->wait_for_match("kfrun: revoked " + leaver + R"( \(pid \d+\), notice 9s)"))
      << other_->output();
  release(leaver, 0);
  ASSERT_TRUE(wait_for_event("exited", leaver));
  // A worker's notice is not the host's: the agent stays for the job.
  EXPECT_FALSE(other_->wait_exit(Clock::now() + 200ms)) << other_->output();
  EXPECT_EQ(count_events("draining", ""), 0);
}

TEST_F(KfrunNotice, KfMemberNoticeRefusesWhatIsNotInTheJobAndChangesNothing) {
  start_job({});
  const auto before = client().get_cluster().version;
  auto r = member("notice 10.9.9.9 --in 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "'10.9.9.9' is neither a host with workers of the job nor a "
                       "worker of it"))
      << r.output;
  r = member("notice 7 --in 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  r = member("notice " + std::string(kOther));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--in")) << r.output;
  r = member("notice " + std::string(kOther) + " --in -3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(client().get_cluster().version, before);
  // The whole job on one host: a notice for it would leave nothing.
  ASSERT_EQ(member("revoke " + leavers_.at(0)).exit_code, 0);
  release(leavers_.at(0), 0);
  r = member("notice 127.0.0.1 --in 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "every worker of the job is on 127.0.0.1")) << r.output;
  EXPECT_EQ(client().get_cluster().size(), 1);
}

// One agent that holds every worker of the job: they cannot leave it (a job keeps a worker), so
// the notice suspends the job instead; the workers leave at their next step (here: exit 0 when
// released), and the agent exits 0 as after any leave.
TEST_F(KfrunWatch, ANoticeForEveryWorkerOfTheJobSuspendsIt) {
  start_builtin(2, 2);
  ASSERT_EQ(::kill(agent_->pid(), SIGTERM), 0);
  ASSERT_TRUE(agent_->eventually(
      [&] { return contains(agent_->output(), "kfrun: suspended the job (SIGTERM, notice "); },
      Clock::now() + kWait))
      << agent_->output();
  const kf::Cluster c = client().get_cluster();
  EXPECT_EQ(c.settings.value("suspended", false), true) << c.to_json().dump();
  EXPECT_EQ(c.size(), 2) << "the suspended job keeps its workers listed";
  release(self_of_rank(0), 0);
  release(self_of_rank(1), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
  EXPECT_TRUE(contains(agent_->output(), "kfrun: left on the notice: no worker of this host runs"))
      << agent_->output();
  EXPECT_FALSE(contains(agent_->output(), "job finished")) << agent_->output();
}

}  // namespace
}  // namespace kf::test::watch
