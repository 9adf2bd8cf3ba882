// SPDX-License-Identifier: Apache-2.0
// kfrun --watch end to end: the real kfrun ($KFRUN) runs as the agent of an elastic job, with its
// builtin config service or an external kf-config-server ($CONFIG_SERVER_EXE), and the real
// kf-member ($KF_MEMBER) changes the cluster. The workers are /bin/sh scripts that print their
// environment and then block reading a FIFO of their own until the test writes the exit code they
// should end with, or until a signal ends them. Every wait polls a condition with a deadline.
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <set>

#include "tools/kfrun_watch_harness.hpp"

namespace kf::test::watch {
namespace {

TEST_F(KfrunWatch, BuiltinStartsTheInitialWorkersWithTheirEnvironment) {
  start_builtin(2, 2, {"--algorithm", "ring"});
  EXPECT_TRUE(std::regex_match(url_, std::regex(R"(http://127\.0\.0\.1:\d+)"))) << url_;
  struct stat st {};
  ASSERT_EQ(::stat(token_file_.c_str(), &st), 0) << token_file_;
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  const auto workers = agent_->workers();
  ASSERT_EQ(workers.size(), 2u) << agent_->output();
  const kf::Cluster cluster = client().get_cluster();
  EXPECT_EQ(cluster.version, 1u);
  EXPECT_EQ(cluster.settings, (nlohmann::json{{"algorithm", "ring"}}));
  std::set<int> ranks;
  for (const auto& [self, w] : workers) {
    EXPECT_EQ(w.server, url_);
    EXPECT_EQ(w.token_file, token_file_);
    EXPECT_EQ(w.job_id, workers.begin()->second.job_id);
    EXPECT_FALSE(w.job_id.empty());
    EXPECT_EQ(w.size, 2);
    EXPECT_EQ(w.cluster.to_json(), cluster.to_json());
    EXPECT_EQ(cluster.workers[static_cast<std::size_t>(w.rank)].endpoint.str(), self);
    ranks.insert(w.rank);
    // The worker's output is tagged with its endpoint.
    EXPECT_TRUE(contains(agent_->output(), "[" + self + "] ready|" + self + "|")) << self;
    const auto started = wait_for_event("started", self);
    ASSERT_TRUE(started) << self;
    EXPECT_TRUE(std::regex_match(started->detail, std::regex(R"(pid \d+)"))) << started->detail;
    EXPECT_EQ(started->version, 1u);
    EXPECT_TRUE(agent_->wait_for_text("kfrun: started " + self + " (pid ")) << self;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));

  // Every worker exits 0 while in the cluster: the job is finished.
  for (const auto& [self, w] : workers) release(self, 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
  EXPECT_TRUE(contains(agent_->output(), "kfrun: job finished: ")) << agent_->output();
  EXPECT_FALSE(fs::exists(token_file_)) << "the temporary directory was left behind";
}

// The agent holds sockets (its config service's, its connections to it) and pipes (its other
// workers' output); a worker gets none of them, only the socket bound to its own port
// (KF_LISTEN_FD).
TEST_F(KfrunWatch, AWorkerInheritsNothingOfTheAgentButItsListeningSocket) {
  agent_ = std::make_unique<KfrunProcess>(std::vector<std::string>{
      "--watch", "--config-server", "builtin", "--slots", "1", "-np", "1", "--", "sh", "-c",
      "echo \"listen=$KF_LISTEN_FD\"; exec ls -l /proc/self/fd/"});
  ASSERT_GT(agent_->pid(), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
  const std::string out = agent_->output();
  const auto at = out.find("listen=");
  ASSERT_NE(at, std::string::npos) << out;
  const int listen_fd = std::atoi(out.c_str() + at + 7);
  ASSERT_GT(listen_fd, 2) << out;
  const auto listed = kf::test::listed_fds(out);
  // And the directory ls is listing.
  EXPECT_EQ(listed.fds.size(), 5U) << out;
  EXPECT_EQ(listed.sockets, (std::set<int>{listen_fd})) << out;
}

// With the builtin service (which dies with its agent) the default is --orphans kill: workers do
// not outlive an agent killed with kill -9. With an external service they do, and the next agent
// adopts them (AdoptsTheWorkersOfAnAgentThatWasKilled).
TEST_F(KfrunWatch, WithTheBuiltinServiceTheWorkersDieWithTheAgent) {
  start_builtin(2, 2);
  std::vector<pid_t> pids;
  for (const auto& [self, w] : agent_->workers()) {
    const auto started = wait_for_event("started", self);
    ASSERT_TRUE(started) << self;
    pids.push_back(std::stoi(started->detail.substr(4)));  // "pid N"
  }
  ASSERT_EQ(::kill(agent_->pid(), SIGKILL), 0);
  ASSERT_EQ(agent_->wait_exit(Clock::now() + kWait), 128 + SIGKILL);
  for (const pid_t pid : pids) {
    EXPECT_TRUE(kf::test::wait_ended(pid, Clock::now() + kWait)) << pid << " outlived its agent";
    if (!kf::test::ended(pid)) ::kill(pid, SIGKILL);
  }
}

TEST_F(KfrunWatch, StartsAWorkerThatKfMemberAdds) {
  start_builtin(2, 1);
  const std::string first = self_of_rank(0);
  const auto r = member("add");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(agent_->wait_for_workers(2)) << agent_->output();
  const kf::Cluster v2 = client().get_cluster();
  ASSERT_EQ(v2.size(), 2);
  const std::string added = v2.workers[1].endpoint.str();
  const WorkerInfo w = agent_->workers().at(added);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.cluster.version, 2u);
  EXPECT_EQ(w.cluster.to_json(), v2.to_json());
  ASSERT_TRUE(wait_for_event("started", added));
  EXPECT_EQ(count_events("started", first), 1) << "the first worker was started again";

  release(first, 0);
  release(added, 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, KillsAKilledWorkerAtOnce) {
  start_builtin(2, 2, {"--leave-grace-ms", "60000"});
  const std::string victim = self_of_rank(0);
  const auto start = Clock::now();
  const auto r = member("kill " + victim);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto failed = wait_for_event("failed", victim, 10s);
  ASSERT_TRUE(failed) << agent_->output();
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_TRUE(contains(failed->detail, "signal 9")) << failed->detail;
  EXPECT_TRUE(agent_->wait_for_text("kfrun: killed " + victim)) << agent_->output();
  // kf-member already took it out: the agent removes nothing.
  EXPECT_EQ(count_events("removed", victim), 0);
  EXPECT_EQ(client().get_cluster().size(), 1);

  release(self_of_rank(1), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, LetsARevokedWorkerExitByItself) {
  start_builtin(2, 2, {"--leave-grace-ms", "60000"});
  const std::string leaver = self_of_rank(0);
  ASSERT_EQ(member("revoke " + leaver).exit_code, 0);
  ASSERT_TRUE(agent_->wait_for_text("kfrun: left " + leaver)) << agent_->output();
  ASSERT_TRUE(agent_->wait_for_text("kfrun: revoked " + leaver)) << agent_->output();
  // The worker finishes its step and exits 0: not signalled, and the job goes on.
  release(leaver, 0);
  const auto exited = wait_for_event("exited", leaver);
  ASSERT_TRUE(exited) << agent_->output();
  EXPECT_EQ(exited->detail, "exit 0");
  EXPECT_FALSE(agent_->wait_exit(Clock::now() + 200ms)) << "kfrun ended with a worker running";
  EXPECT_FALSE(contains(agent_->output(), "job finished")) << agent_->output();

  release(self_of_rank(1), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, StopsARevokedWorkerAfterTheLeaveGrace) {
  start_builtin(2, 2, {"--leave-grace-ms", "300"});
  const std::string leaver = self_of_rank(0);
  const auto start = Clock::now();
  ASSERT_EQ(member("revoke " + leaver).exit_code, 0);
  const auto failed = wait_for_event("failed", leaver);
  ASSERT_TRUE(failed) << agent_->output();
  EXPECT_GE(Clock::now() - start, 300ms);
  EXPECT_TRUE(contains(failed->detail, "signal 15")) << failed->detail;
  EXPECT_TRUE(agent_->wait_for_text("kfrun: stopping " + leaver)) << agent_->output();
  EXPECT_EQ(count_events("removed", leaver), 0);

  release(self_of_rank(1), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, TakesTheGraceOfARevokeFromItsNotice) {
  start_builtin(2, 2, {"--leave-grace-ms", "60000"});
  const std::string leaver = self_of_rank(1);
  const auto start = Clock::now();
  ASSERT_EQ(member("revoke " + leaver + " --notice 1").exit_code, 0);
  const auto failed = wait_for_event("failed", leaver);
  ASSERT_TRUE(failed) << agent_->output();
  EXPECT_GE(Clock::now() - start, 1s);
  EXPECT_TRUE(contains(failed->detail, "signal 15")) << failed->detail;
  EXPECT_TRUE(agent_->wait_for_match("kfrun: revoked " + leaver + R"( \(pid \d+\), notice 1s)"))
      << agent_->output();

  release(self_of_rank(0), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, RemovesAWorkerThatFails) {
  start_builtin(2, 2);
  const std::string failing = self_of_rank(0);
  release(failing, 3);
  const auto removed = wait_for_event("removed", failing);
  ASSERT_TRUE(removed) << agent_->output();
  EXPECT_EQ(removed->detail, "failed: exited with code 3");
  const auto failed = wait_for_event("failed", failing);
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->detail, "exited with code 3");
  EXPECT_LT(failed->seq, removed->seq);
  const kf::Cluster c = client().get_cluster();
  EXPECT_EQ(c.version, 2u);
  ASSERT_EQ(c.size(), 1);
  EXPECT_EQ(c.workers[0].endpoint.str(), self_of_rank(1));

  // The job went on without it and finishes: the failure was dealt with.
  release(self_of_rank(1), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, EndsWithOneWhenTheLastWorkerFails) {
  start_builtin(1, 1);
  const std::string only = self_of_rank(0);
  release(only, 4);
  EXPECT_EQ(wait_exit(), 1) << agent_->output();
  EXPECT_TRUE(contains(agent_->output(), "kfrun: error: " + only + " was the last worker"))
      << agent_->output();
}

TEST_F(KfrunWatch, FailsAWorkerBeyondItsSlots) {
  start_builtin(1, 1);
  const auto r = member("add");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // From kf-member's answer: the agent may have removed it again by the time we could read v2.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(v1 -> v2: added (\S+))"))) << r.output;
  const std::string extra = m[1].str();
  const auto failed = wait_for_event("failed", extra);
  ASSERT_TRUE(failed) << agent_->output();
  EXPECT_TRUE(contains(failed->detail, "no free slot")) << failed->detail;
  ASSERT_TRUE(wait_for_event("removed", extra)) << agent_->output();
  EXPECT_TRUE(agent_->wait_for_text("kfrun: error: cannot start " + extra)) << agent_->output();
  EXPECT_EQ(client().get_cluster().size(), 1);

  release(self_of_rank(0), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, KeepsItsWorkersWhileTheConfigServerRestarts) {
  std::ofstream(dir_ / "token") << "watch-e2e-token\n";
  // Only this user may read a token file (kf warns otherwise).
  std::filesystem::permissions(
      dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto server = std::make_unique<kf::test::ServerProcess>(dir_);
  ASSERT_FALSE(server->url().empty());
  url_ = server->url();
  token_file_ = (dir_ / "token").string();
  start({"--watch", "--config-server", url_, "--job-token-file", token_file_, "--slots", "2", "-np",
         "1"});
  ASSERT_TRUE(agent_->wait_for_workers(1)) << agent_->output();
  const std::string first = self_of_rank(0);
  EXPECT_EQ(agent_->workers().at(first).token_file, token_file_);

  const std::string address = server->address();
  EXPECT_EQ(server->terminate(), 0);
  ASSERT_TRUE(agent_->wait_for_text("kfrun: config service unreachable")) << agent_->output();
  server = std::make_unique<kf::test::ServerProcess>(dir_,
                                                     std::vector<std::string>{"--listen", address});
  ASSERT_EQ(server->url(), url_) << "the restarted server did not get its port back";
  ASSERT_TRUE(agent_->wait_for_text("kfrun: config service reachable again")) << agent_->output();

  ASSERT_EQ(member("add").exit_code, 0);
  ASSERT_TRUE(agent_->wait_for_workers(2)) << agent_->output();
  const kf::Cluster v2 = client().get_cluster();
  ASSERT_EQ(v2.size(), 2);
  EXPECT_EQ(agent_->workers().at(v2.workers[1].endpoint.str()).cluster.version, 2u);
  EXPECT_EQ(count_events("started", first), 1);

  release(first, 0);
  release(v2.workers[1].endpoint.str(), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

// An agent killed with SIGKILL leaves its workers running; the agent started in its place finds
// them (KF_AGENT_PID names a dead parent), adopts them instead of starting second copies, shows
// their output again and judges their exits from the document, as their exit status is unknown.
TEST_F(KfrunWatch, AdoptsTheWorkersOfAnAgentThatWasKilled) {
  std::ofstream(dir_ / "token") << "watch-e2e-token\n";
  // Only this user may read a token file (kf warns otherwise).
  std::filesystem::permissions(
      dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  kf::test::ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  url_ = server.url();
  token_file_ = (dir_ / "token").string();
  const std::vector<std::string> args{"--watch",   "--config-server", url_, "--job-token-file",
                                      token_file_, "--slots",         "2",  "-np",
                                      "2"};
  start(args);
  ASSERT_TRUE(agent_->wait_for_workers(2)) << agent_->output();
  const std::string a = self_of_rank(0), b = self_of_rank(1);
  ASSERT_EQ(::kill(agent_->pid(), SIGKILL), 0);
  ASSERT_EQ(agent_->wait_exit(Clock::now() + kWait), 128 + SIGKILL);
  const std::string first_output = agent_->output();

  start(args);
  for (const std::string& w : {a, b}) {
    EXPECT_TRUE(agent_->wait_for_text("kfrun: adopted " + w + " (pid ")) << agent_->output();
    ASSERT_TRUE(wait_for_event("adopted", w)) << agent_->output();
    // The first agent may have died before it reported the start.
    EXPECT_LE(count_events("started", w), 1) << "started twice: " << w;
  }
  EXPECT_FALSE(contains(agent_->output(), "kfrun: started ")) << agent_->output();
  EXPECT_EQ(client().get_cluster().size(), 2);

  // Still a member of a running job when it exits: a failure (its code is not known), removed.
  release(a, 3);
  const auto removed = wait_for_event("removed", a);
  ASSERT_TRUE(removed) << agent_->output();
  EXPECT_EQ(removed->detail, "failed: exited while a member (adopted)");
  // Its output reaches the new agent.
  EXPECT_TRUE(agent_->wait_for_text("[" + a + "] exiting|" + a + "|3")) << agent_->output();

  // The job marked finished, the other one's exit ends it: the agent exits 0.
  auto c = client();
  kf::Cluster cur = c.get_cluster();
  cur.settings["finished"] = true;
  c.put_cluster(cur);
  ASSERT_TRUE(agent_->wait_for_text("job finished")) << agent_->output();
  release(b, 0);
  EXPECT_EQ(wait_exit(), 0) << first_output << "\n--- the second agent\n" << agent_->output();
}

// A worker placed from another machine has a port nobody tested on its host; here it is in use
// (the test holds it). The agent moves the worker to a free port in the document and starts it
// there; the old address is never started.
TEST_F(KfrunWatch, MovesAWorkerWhosePortIsInUse) {
  start_builtin(3, 1);
  const int held = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  ASSERT_EQ(::bind(held, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(held, reinterpret_cast<sockaddr*>(&a), &length), 0);
  const std::string busy = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto c = client();
  kf::Cluster next = c.get_cluster();
  next.workers.push_back(kf::WorkerSpec{kf::Endpoint{"127.0.0.1", ntohs(a.sin_port)}, 1});
  c.put_cluster(next);

  ASSERT_TRUE(agent_->wait_for_text("is in use on this host: moving the worker to "))
      << agent_->output();
  const auto removed = wait_for_event("removed", busy);
  ASSERT_TRUE(removed) << agent_->output();
  EXPECT_TRUE(contains(removed->detail, "its port is in use on its host; moved to 127.0.0.1:"))
      << removed->detail;
  ASSERT_TRUE(agent_->wait_for_workers(2)) << agent_->output();
  const kf::Cluster moved = c.get_cluster();
  ASSERT_EQ(moved.size(), 2);
  const std::string fresh = moved.workers[1].endpoint.str();
  EXPECT_NE(fresh, busy);
  EXPECT_EQ(moved.workers[1].slot, 1);
  EXPECT_EQ(agent_->workers().count(fresh), 1u) << agent_->output();
  EXPECT_EQ(agent_->workers().count(busy), 0u) << agent_->output();
  EXPECT_EQ(count_events("started", busy), 0);
  ::close(held);

  release(self_of_rank(0), 0);
  release(fresh, 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
}

TEST_F(KfrunWatch, StopsItsWorkersOnSigtermWhenToldTo) {
  start_builtin(2, 2, {"--on-sigterm", "stop"});
  const auto start = Clock::now();
  ASSERT_EQ(::kill(agent_->pid(), SIGTERM), 0);
  EXPECT_EQ(wait_exit(), 128 + SIGTERM) << agent_->output();
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_TRUE(contains(agent_->output(), "kfrun: received SIGTERM; stopping the workers"))
      << agent_->output();
  for (const auto& [self, w] : agent_->workers()) {
    EXPECT_TRUE(contains(agent_->output(), "kfrun: failed " + self)) << agent_->output();
  }
}

struct UsageCase {
  std::vector<std::string> args;
  std::string names;  // the option the message must name
};

void PrintTo(const UsageCase& c, std::ostream* out) {
  for (const auto& a : c.args) *out << a << " ";
  *out << "(names " << c.names << ")";
}

class KfrunWatchUsage : public ::testing::TestWithParam<UsageCase> {};

TEST_P(KfrunWatchUsage, ExitsWithTwoAndNamesTheOption) {
  ASSERT_FALSE(env_or_empty("KFRUN").empty()) << "KFRUN is not set";
  std::vector<std::string> args = GetParam().args;
  args.insert(args.end(), {"--", "true"});
  KfrunProcess kfrun(args);
  const auto code = kfrun.wait_exit(Clock::now() + kWait);
  EXPECT_EQ(code, 2) << kfrun.output();
  EXPECT_TRUE(contains(kfrun.output(), GetParam().names)) << kfrun.output();
  EXPECT_FALSE(contains(kfrun.output(), "kfrun: started")) << kfrun.output();
}

INSTANTIATE_TEST_SUITE_P(
    BadArguments, KfrunWatchUsage,
    ::testing::Values(
        UsageCase{{"--watch", "--config-server", "builtin", "-np", "1"}, "--slots"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "0", "-np", "1"}, "--slots"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "2"}, "-np"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "2"}, "--slots"},
        UsageCase{{"--watch", "--slots", "1", "-np", "1"}, "--config-server"},
        UsageCase{{"--watch", "--config-server", "ftp://127.0.0.1:1", "--slots", "1",
                   "--job-token-file", "/dev/null"},
                  "--config-server"},
        UsageCase{{"--watch", "--config-server", "http://127.0.0.1:1", "--slots", "1",
                   "--job-token-file", "/nonexistent/kf-token"},
                  "--job-token-file"},
        UsageCase{{"--watch", "--config-server", "http://127.0.0.1:1", "--slots", "1"},
                  "--job-token-file"},
        UsageCase{{"--slots", "2", "-np", "1"}, "--watch"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1", "--orphans",
                   "adopt"},
                  "--orphans adopt needs an external config service"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1",
                   "--notice-signal", "KILL"},
                  "--notice-signal 'KILL'"},
        UsageCase{
            {"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1", "--grace", "0"},
            "--grace"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1",
                   "--on-sigterm", "ignore"},
                  "--on-sigterm"},
        UsageCase{{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1",
                   "--notice-file", ""},
                  "--notice-file"},
        UsageCase{{"--slots", "2", "-np", "1", "--notice-signal", "USR1"}, "--watch"}));

}  // namespace
}  // namespace kf::test::watch
