// SPDX-License-Identifier: Apache-2.0
// kfrun --watch end to end: the real kfrun ($KFRUN) runs as the agent of an elastic job, with its
// builtin config service or an external kf-config-server ($CONFIG_SERVER_EXE), and the real
// kf-member ($KF_MEMBER) changes the cluster. The workers are /bin/sh scripts that print their
// environment and then block reading a FIFO of their own until the test writes the exit code they
// should end with, or until a signal ends them. Every wait polls a condition with a deadline.
#include "kf/runtime/config_client.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kf/common/env.hpp"
#include "support/config_server_process.hpp"
#include "support/process.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Generous for a loaded 2-core machine; a passing run takes a fraction of it.
constexpr auto kWait = 20s;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What a worker printed when it started.
struct WorkerInfo {
  std::string self;
  int rank = -1;
  int size = -1;
  std::string server;
  std::string job_id;
  std::string token_file;
  kf::Cluster cluster;
};

// The worker: makes its FIFO, prints its environment on one line, and exits with the code the
// test writes into the FIFO, saying so first ("exiting|SELF|CODE").
std::string worker_script(const fs::path& dir) {
  return "f=\"" + dir.string() +
         "/fifo-$KF_SELF\"; mkfifo \"$f\" || exit 100; "
         "echo \"ready|$KF_SELF|$KF_RANK|$KF_SIZE|$KF_CONFIG_SERVER|$KF_JOB_ID|"
         "$KF_JOB_TOKEN_FILE|$KF_CLUSTER\"; "
         "read code < \"$f\"; echo \"exiting|$KF_SELF|$code\"; exit \"$code\"";
}

// A running kfrun, its stdout and stderr merged on one pipe that the test reads.
class KfrunProcess {
 public:
  explicit KfrunProcess(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    std::vector<std::string> argv{env_or_empty("KFRUN")};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      std::vector<char*> c_argv;
      for (auto& a : argv) c_argv.push_back(a.data());
      c_argv.push_back(nullptr);
      ::execv(c_argv[0], c_argv.data());
      ::_exit(126);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~KfrunProcess() {
    // SIGTERM first: kfrun then stops its workers, which live in process groups of their own.
    if (!status_ && pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (!wait_exit(Clock::now() + 10s)) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
      }
    }
    if (fd_ >= 0) ::close(fd_);
  }
  KfrunProcess(const KfrunProcess&) = delete;
  KfrunProcess& operator=(const KfrunProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads what kfrun wrote, waiting at most `period` for it.
  void pump(std::chrono::milliseconds period) {
    if (fd_ < 0) return;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(period.count())) <= 0) return;
    char buffer[4096];
    const auto n = ::read(fd_, buffer, sizeof buffer);
    if (n > 0) {
      output_.append(buffer, static_cast<std::size_t>(n));
    } else {
      ::close(fd_);
      fd_ = -1;
    }
  }

  // Polls `condition`, reading kfrun's output in between, until it holds or `deadline` passes.
  bool eventually(const std::function<bool()>& condition, Clock::time_point deadline) {
    for (;;) {
      if (condition()) return true;
      if (Clock::now() >= deadline) return false;
      pump(20ms);
    }
  }
  bool wait_for_text(const std::string& text, std::chrono::seconds within = kWait) {
    return eventually([&] { return contains(output_, text); }, Clock::now() + within);
  }
  bool wait_for_match(const std::string& pattern) {
    const std::regex re(pattern);
    return eventually([&] { return std::regex_search(output_, re); }, Clock::now() + kWait);
  }

  // kfrun's exit code (128 + signal when a signal ended it), or nullopt at the deadline.
  std::optional<int> wait_exit(Clock::time_point deadline) {
    if (status_) return status_;
    eventually(
        [&] {
          int status = 0;
          if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
          status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        deadline);
    while (status_ && fd_ >= 0) pump(1000ms);  // the rest of the output
    return status_;
  }

  // The workers that have announced themselves, by "host:port".
  std::map<std::string, WorkerInfo> workers() const {
    std::map<std::string, WorkerInfo> found;
    std::istringstream in(output_);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("] ready|");
      if (!line.starts_with("[") || at == std::string::npos) continue;
      std::vector<std::string> f;
      std::istringstream fields(line.substr(at + 8));
      for (std::string field; std::getline(fields, field, '|');) f.push_back(field);
      if (f.size() != 7) continue;
      WorkerInfo w{f[0],
                   std::stoi(f[1]),
                   std::stoi(f[2]),
                   f[3],
                   f[4],
                   f[5],
                   kf::Cluster::from_json(nlohmann::json::parse(f[6]))};
      found[w.self] = w;
    }
    return found;
  }
  bool wait_for_workers(std::size_t count) {
    return eventually([&] { return workers().size() >= count; }, Clock::now() + kWait);
  }

  // The value after "kfrun: PREFIX" on a line of its own, or "".
  std::string value_after(const std::string& prefix) const {
    const std::regex re("kfrun: " + prefix + "(\\S+)");
    std::smatch m;
    return std::regex_search(output_, m, re) ? m[1].str() : "";
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
  std::optional<int> status_;
};

class KfrunWatch : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"KFRUN", "KF_MEMBER", "CONFIG_SERVER_EXE"}) {
      ASSERT_FALSE(env_or_empty(name).empty()) << name << " is not set";
    }
    std::string pattern = (fs::temp_directory_path() / "kfrun-watch-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    agent_.reset();
    fs::remove_all(dir_);
  }

  // Starts kfrun --watch with the builtin service, `np` initial workers and `extra` options, and
  // waits until it told the service's URL and token file and its workers announced themselves.
  void start_builtin(int slots, int np, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--watch",         "--config-server",     "builtin",
                                  "--slots",         std::to_string(slots), "-np",
                                  std::to_string(np)};
    args.insert(args.end(), extra.begin(), extra.end());
    start(args);
    ASSERT_TRUE(agent_->wait_for_text("kfrun: job token file ")) << agent_->output();
    url_ = agent_->value_after("config server ");
    token_file_ = agent_->value_after("job token file ");
    ASSERT_FALSE(url_.empty()) << agent_->output();
    ASSERT_TRUE(agent_->wait_for_workers(static_cast<std::size_t>(np))) << agent_->output();
  }
  void start(std::vector<std::string> args) {
    for (const std::string& a :
         {std::string("--"), std::string("/bin/sh"), std::string("-c"), worker_script(dir_)}) {
      args.push_back(a);
    }
    agent_ = std::make_unique<KfrunProcess>(args);
    ASSERT_GT(agent_->pid(), 0);
  }

  kf::ConfigClient client() const {
    return kf::ConfigClient(url_, kf::read_token_file(token_file_));
  }
  kf::test::Ran member(const std::string& args) const {
    return kf::test::run_shell("timeout 30 " + env_or_empty("KF_MEMBER") + " --server " + url_ +
                               " --token-file " + token_file_ + " " + args);
  }
  // Tells the worker at `self` to exit with `code`.
  void release(const std::string& self, int code) const {
    const auto fifo = dir_ / ("fifo-" + self);
    const auto r = kf::test::run_shell("timeout 20 sh -c 'echo " + std::to_string(code) + " > \"" +
                                       fifo.string() + "\"'");
    EXPECT_EQ(r.exit_code, 0) << "cannot release " << self << ": " << r.output;
  }
  // The self of the worker with initial rank `rank`.
  std::string self_of_rank(int rank) const {
    for (const auto& [self, w] : agent_->workers()) {
      if (w.rank == rank) return self;
    }
    return "";
  }

  // Waits until the service holds an event of `type` for `worker` and returns it.
  std::optional<kf::ConfigEvent> wait_for_event(const std::string& type, const std::string& worker,
                                                std::chrono::seconds within = kWait) {
    std::optional<kf::ConfigEvent> found;
    auto c = client();
    agent_->eventually(
        [&] {
          for (const auto& e : c.get_events()) {
            if (e.type == type && e.worker == worker) found = e;
          }
          return found.has_value();
        },
        Clock::now() + within);
    return found;
  }
  int count_events(const std::string& type, const std::string& worker) {
    int n = 0;
    for (const auto& e : client().get_events()) n += e.type == type && e.worker == worker;
    return n;
  }

  std::optional<int> wait_exit() { return agent_->wait_exit(Clock::now() + kWait); }

  fs::path dir_;
  std::unique_ptr<KfrunProcess> agent_;
  std::string url_;
  std::string token_file_;
};

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
// workers' output); a worker gets none of them.
TEST_F(KfrunWatch, AWorkerInheritsNothingOfTheAgent) {
  agent_ = std::make_unique<KfrunProcess>(
      std::vector<std::string>{"--watch", "--config-server", "builtin", "--slots", "1", "-np", "1",
                               "--", "ls", "-l", "/proc/self/fd/"});
  ASSERT_GT(agent_->pid(), 0);
  EXPECT_EQ(wait_exit(), 0) << agent_->output();
  const auto listed = kf::test::listed_fds(agent_->output());
  EXPECT_EQ(listed.fds, (std::set<int>{0, 1, 2, 3})) << agent_->output();
  EXPECT_FALSE(listed.socket) << agent_->output();
}

// With --orphans kill, workers do not outlive an agent killed with kill -9 (without it they
// do, and the next agent adopts them: AdoptsTheWorkersOfAnAgentThatWasKilled).
TEST_F(KfrunWatch, WithOrphansKillTheWorkersDieWithTheAgent) {
  start_builtin(2, 2, {"--orphans", "kill"});
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

TEST_F(KfrunWatch, StopsItsWorkersOnSigterm) {
  start_builtin(2, 2);
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
        UsageCase{{"--slots", "2", "-np", "1"}, "--watch"}));

}  // namespace
