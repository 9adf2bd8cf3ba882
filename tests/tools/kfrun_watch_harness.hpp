// SPDX-License-Identifier: Apache-2.0
// The harness of the kfrun --watch tests (kfrun_watch_test.cpp, kfrun_notice_test.cpp): the real
// kfrun ($KFRUN) runs as the agent of an elastic job, with its builtin config service or an
// external kf-config-server ($CONFIG_SERVER_EXE), and the real kf-member ($KF_MEMBER) changes the
// cluster. The workers are /bin/sh scripts that print their environment and then block reading a
// FIFO of their own until the test writes the exit code they should end with, or until a signal
// ends them. Every wait polls a condition with a deadline.
#pragma once

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

namespace kf::test::watch {

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
    // SIGINT first: kfrun then stops its workers, which live in process groups of their own
    // (SIGTERM would be a notice, and the workers would get their whole grace).
    if (!status_ && pid_ > 0) {
      ::kill(pid_, SIGINT);
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

}  // namespace kf::test::watch
