// SPDX-License-Identifier: Apache-2.0
// Test and benchmark helper: an elastic job on 127.0.0.1 made of a kf-config-server (its own
// process, restartable), one `kfrun --watch` agent and elastic-worker processes, with the paths
// of the executables from the environment (KFRUN, KF_ELASTIC_WORKER, KF_MEMBER,
// CONFIG_SERVER_EXE). The agent's stdout and stderr go to files in the job's directory.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kf/runtime/config_client.hpp"
#include "support/config_server_process.hpp"
#include "support/finish_soon.hpp"
#include "support/process.hpp"

namespace kf::test {

using namespace std::chrono_literals;

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The committed step count a worker wrote to `path` (elastic-worker --progress-file), -1 before
/// the first.
inline long read_progress(const std::filesystem::path& path) {
  std::ifstream in(path);
  long s = -1;
  in >> s;
  return in ? s : -1;
}

/// For benchmarks run by hand: KFRUN, KF_ELASTIC_WORKER, KF_MEMBER and CONFIG_SERVER_EXE, where
/// not set, name the executables of the build tree the running program is in (two levels up).
inline void use_build_tree_executables() {
  const auto build = std::filesystem::canonical("/proc/self/exe").parent_path() / ".." / "..";
  const std::pair<const char*, std::filesystem::path> defaults[] = {
      {"KFRUN", build / "tools/kfrun/kfrun"},
      {"KF_ELASTIC_WORKER", build / "tests/multiproc/elastic-worker"},
      {"KF_MEMBER", build / "tools/kf-member/kf-member"},
      {"CONFIG_SERVER_EXE", build / "tools/kf-config-server/kf-config-server"}};
  for (const auto& [name, path] : defaults) ::setenv(name, path.lexically_normal().c_str(), 0);
}

class ElasticJob {
 public:
  /// With `service_url` (an etcd:// URL) the job uses that service instead of starting a
  /// kf-config-server of its own.
  explicit ElasticJob(const std::string& name, const std::string& service_url = "")
      : service_url_(service_url) {
    dir_ = std::filesystem::temp_directory_path() /
           ("kf-elastic-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "token") << "elastic-test-token\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(
        dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    if (service_url_.empty()) server_ = std::make_unique<ServerProcess>(dir_);
  }
  ~ElasticJob() {
    for (Child& other : other_agents_) {
      if (other.pid <= 0) continue;
      ::kill(other.pid, SIGKILL);
      ::waitpid(other.pid, nullptr, 0);
    }
    if (agent_.pid > 0) {
      ::kill(agent_.pid, SIGKILL);
      ::waitpid(agent_.pid, nullptr, 0);
      // The workers are in process groups of their own; kfrun is gone, so stop them by name.
      run_shell("pkill -KILL -f '" + program_ + "' || true");
    }
    // Workers of a killed agent that are still running: this job's only (their progress file).
    if (orphans_) run_shell("pkill -KILL -f '" + (dir_ / "progress").string() + "' || true");
    if (agent_.out_fd >= 0) ::close(agent_.out_fd);
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  static bool HasFailure() { return ::testing::Test::HasFailure(); }

  std::string url() const { return service_url_.empty() ? server_->url() : service_url_; }
  const std::filesystem::path& dir() const { return dir_; }
  ConfigClient client() const { return ConfigClient(url(), "elastic-test-token"); }

  /// Starts `kfrun --watch` with `np` initial workers running elastic-worker `args`; `env`
  /// ("NAME=VALUE") is added to the agent's environment, and so to its workers'.
  void start(int np, const std::string& args, const std::vector<std::string>& env = {}) {
    start_program(np, env_or_empty("KF_ELASTIC_WORKER"), worker_args(args), env);
  }

  /// Options for the first agent's command line (before "--"), for start().
  void set_agent_options(std::string options) { agent_options_ = std::move(options); }

  /// Starts `kfrun --watch` with `np` initial workers running `program args`.
  void start_program(int np, const std::string& program, const std::string& args,
                     const std::vector<std::string>& env = {}) {
    program_ = program;
    args_ = args;
    const std::string cmd = "exec " + env_or_empty("KFRUN") + " --watch --config-server " + url() +
                            " --slots 8 -np " + std::to_string(np) + " --job-token-file " +
                            (dir_ / "token").string() + " --leave-grace-ms 20000 " +
                            agent_options_ + " -- " + program + " " + args + " > " +
                            (dir_ / "out").string() + " 2> " + (dir_ / "err").string();
    std::vector<std::string> full{"KF_LOG_LEVEL=info"};
    full.insert(full.end(), env.begin(), env.end());
    agent_ = spawn({"/bin/sh", "-c", cmd}, full);
  }

  /// Starts one more agent of the job, on `host` (another loopback address, such as
  /// 127.0.0.2, stands for another machine), with `options` and the first agent's program; its
  /// output goes to out-HOST and err-HOST. Call after start(). Returns its index for
  /// wait_other_agent(). `env` ("NAME=VALUE") is added to its environment and its workers'.
  std::size_t start_other_agent(const std::string& host, const std::string& options,
                                const std::vector<std::string>& env = {}) {
    const std::string cmd = "exec " + env_or_empty("KFRUN") + " --watch --config-server " + url() +
                            " --host " + host + " --slots 8 --job-token-file " +
                            (dir_ / "token").string() + " " + options + " -- " + program_ + " " +
                            args_ + " > " + (dir_ / ("out-" + host)).string() + " 2> " +
                            (dir_ / ("err-" + host)).string();
    std::vector<std::string> full{"KF_LOG_LEVEL=info"};
    full.insert(full.end(), env.begin(), env.end());
    other_agents_.push_back(spawn({"/bin/sh", "-c", cmd}, full));
    return other_agents_.size() - 1;
  }
  pid_t other_agent_pid(std::size_t index) const { return other_agents_.at(index).pid; }
  /// Its exit code (-1 on timeout).
  int wait_other_agent(std::size_t index, std::chrono::seconds timeout = 60s) {
    Child& c = other_agents_.at(index);
    auto st = wait_exit(c, std::chrono::steady_clock::now() + timeout);
    c.pid = -1;
    if (!st) return -1;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
  }
  std::string other_err(const std::string& host) const { return slurp(dir_ / ("err-" + host)); }
  std::string other_out(const std::string& host) const { return slurp(dir_ / ("out-" + host)); }

  pid_t agent_pid() const { return agent_.pid; }

  /// Kills the first agent with SIGKILL (its workers live on: they are orphans).
  void kill_agent() {
    ::kill(agent_.pid, SIGKILL);
    ::waitpid(agent_.pid, nullptr, 0);
    agent_.pid = -1;
    orphans_ = true;
  }

  /// Committed steps so far (rank 0 writes them after each step), -1 before the first.
  long progress() const { return read_progress(dir_ / "progress"); }

  bool wait_progress(long past, std::chrono::milliseconds timeout = 60s) const {
    return eventually([&] { return progress() > past; }, timeout);
  }

  std::vector<ConfigEvent> events() const {
    try {
      return client().get_events();
    } catch (const std::exception&) {
      return {};
    }
  }

  bool has_event(const std::function<bool(const ConfigEvent&)>& pred) const {
    for (const auto& e : events()) {
      if (pred(e)) return true;
    }
    return false;
  }
  /// Waits up to `timeout` for an event of `type` about `worker`.
  bool wait_event(const std::string& type, const std::string& worker,
                  std::chrono::milliseconds timeout = 30s) const {
    return eventually(
        [&] {
          return has_event(
              [&](const ConfigEvent& e) { return e.type == type && e.worker == worker; });
        },
        timeout);
  }

  /// Waits until a change to `workers` workers has taken effect in the job: rank 0's record of
  /// the switch ("v1 -> v2 (2 -> 4 workers, resize): ..."), not kf-member's note of the request
  /// ("2 -> 4 workers"), which comes before any worker switched.
  bool wait_size(int workers, std::chrono::milliseconds timeout = 60s) const {
    const std::string needle = "-> " + std::to_string(workers) + " workers, ";
    return eventually(
        [&] {
          return has_event([&](const ConfigEvent& e) {
            return e.type == "resized" && e.detail.find(needle) != std::string::npos;
          });
        },
        timeout);
  }

  /// Ends the job `extra` epochs from now (settings "epochs", written by compare-and-swap).
  void finish_soon() {
    auto c = client();
    kf::test::finish_soon(c);
  }

  /// Waits for kfrun to exit and returns its exit code (-1 on timeout).
  int wait(std::chrono::seconds timeout = 120s) {
    auto st = wait_exit(agent_, std::chrono::steady_clock::now() + timeout);
    agent_.pid = -1;
    if (!st) return -1;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
  }

  std::string out() const { return slurp(dir_ / "out"); }
  std::string err() const { return slurp(dir_ / "err"); }

  /// Lines of the workers' and kfrun's log (stderr) that contain `needle`.
  int err_lines_with(const std::string& needle) const {
    std::istringstream in(err());
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
    return n;
  }

  /// After one worker's loss: at most one survivor wrote the successor cluster (none when the
  /// lost worker's agent removed it first) and the other `survivors - 1` took it from the
  /// config service, so that a failure costs the service one write from the job.
  void expect_one_recovery_write(int survivors) const {
    EXPECT_LE(err_lines_with(": wrote v"), 1) << err();
    EXPECT_EQ(err_lines_with(": took v"), survivors - 1) << err();
  }

  /// The "final" lines: one per worker that finished the job.
  std::vector<std::string> finals() const {
    std::vector<std::string> v;
    std::istringstream in(out());
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("final step=");
      if (at != std::string::npos) v.push_back(line.substr(at));
    }
    return v;
  }

  /// Checks what every elastic run must end with; `workers` is the expected final size.
  void expect_clean_finish(int exit_code, int workers) {
    SCOPED_TRACE("job directory " + dir_.string());
    EXPECT_EQ(exit_code, 0) << "kfrun stderr:\n" << err() << "\nstdout:\n" << out();
    EXPECT_EQ(out().find("BROKEN"), std::string::npos) << out();
    const auto f = finals();
    ASSERT_EQ(static_cast<int>(f.size()), workers) << out();
    std::set<std::string> hashes;
    for (const auto& line : f) {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(line, m, std::regex("workers=(\\d+) hash=([0-9a-f]+)")))
          << line;
      EXPECT_EQ(std::stoi(m[1]), workers) << line;
      hashes.insert(m[2]);
    }
    EXPECT_EQ(hashes.size(), 1u) << "survivors differ:\n" << out();
  }

  /// kill -9 of a worker of the current cluster drawn by `gen`: its endpoint, or empty (and a
  /// test failure) when it has no started event or cannot be killed.
  std::string kill_random_worker(std::mt19937& gen) const {
    const auto c = client().get_cluster();
    const auto victim =
        c.workers[std::uniform_int_distribution<std::size_t>(0, c.workers.size() - 1)(gen)]
            .endpoint.str();
    const pid_t pid = worker_pid(victim);
    if (pid <= 0 || ::kill(pid, SIGKILL) != 0) {
      ADD_FAILURE() << "cannot kill " << victim << " (pid " << pid << ")";
      return {};
    }
    return victim;
  }

  pid_t worker_pid(const std::string& endpoint) const {
    for (const auto& e : events()) {
      if (e.type != "started" || e.worker != endpoint) continue;
      std::smatch m;
      if (std::regex_search(e.detail, m, std::regex("pid (\\d+)"))) return std::stoi(m[1]);
    }
    return -1;
  }

  Ran member(const std::string& args) const {
    return run_shell(env_or_empty("KF_MEMBER") + " --server " + url() + " --token-file " +
                     (dir_ / "token").string() + " " + args);
  }

  ServerProcess& server() { return *server_; }
  void restart_server(const std::string& address) {
    server_.reset();
    server_ = std::make_unique<ServerProcess>(dir_, std::vector<std::string>{"--listen", address});
  }
  void stop_server() { server_->terminate(); }

 private:
  std::string service_url_;
  std::filesystem::path dir_;
  std::unique_ptr<ServerProcess> server_;
  std::string worker_args(const std::string& args) const {
    return "--progress-file " + (dir_ / "progress").string() + " " + args;
  }

  std::string program_;
  std::string args_;
  std::string agent_options_;
  Child agent_;
  std::vector<Child> other_agents_;
  bool orphans_ = false;  // kill_agent() left workers running
};

/// 2 -> 3 -> 2 while training: starts 2 workers of elastic-worker `args`, grows to 3 after a
/// number of steps drawn from `seed`, then kill -9s a worker drawn from `seed` at a drawn step,
/// and checks that the 2 survivors finish with identical parameters (the workers check that
/// every sample was used once and no commit was lost).
inline void grow_then_kill(const std::string& name, const std::string& args, unsigned seed) {
  std::mt19937 gen(seed);
  ElasticJob job(name);
  job.start(2, args);
  const long grow_at = std::uniform_int_distribution<long>(3, 60)(gen);
  ASSERT_TRUE(job.wait_progress(grow_at)) << job.err();
  auto r = job.member("resize 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  const long kill_at = job.progress() + std::uniform_int_distribution<long>(1, 60)(gen);
  ASSERT_TRUE(job.wait_progress(kill_at)) << job.err();
  const std::string victim = job.kill_random_worker(gen);
  ASSERT_FALSE(victim.empty());
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
  job.expect_one_recovery_write(2);
  EXPECT_TRUE(job.has_event(
      [&](const ConfigEvent& e) { return e.type == "failed" && e.worker == victim; }));
}

}  // namespace kf::test
