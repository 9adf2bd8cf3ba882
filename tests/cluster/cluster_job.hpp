// SPDX-License-Identifier: Apache-2.0
// Test hosts and jobs across them, for the cluster suite (hosts_test.cpp) and cluster-bench:
// Hosts (tests/cluster/hosts), a 3-member etcd on them (EtcdOnHosts), and ClusterJob: the config
// service on host 1 (or etcd), one `kfrun --watch` agent per host, elastic-worker processes.
// Uses GoogleTest's assertions. Thread-safety: one thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gtest/gtest.h>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kf/runtime/config_client.hpp"
#include "support/elastic_job.hpp"
#include "support/etcd_process.hpp"
#include "support/finish_soon.hpp"
#include "support/process.hpp"

namespace kf::test {
using namespace std::chrono_literals;

inline const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 1000";

// Test hosts for one test: made in the constructor, removed (with whatever still runs on them)
// in the destructor, also when the test fails.
class Hosts {
 public:
  Hosts(const std::string& name, int n) : name_(name), script_(env_or_empty("KF_CLUSTER_HOSTS")) {
    const Ran r = run_shell(script_ + " up " + name_ + " " + std::to_string(n));
    if (r.exit_code != 0) {
      error_ = r.output;
      return;
    }
    std::istringstream in(r.output);
    for (std::string word, ns, address; in >> word >> ns;) {
      if (word == "bridge") {
        bridge_ = ns;
        continue;
      }
      in >> address;
      addresses_.push_back(address);
    }
  }
  ~Hosts() { run_shell(script_ + " down " + name_); }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  /// Host i's address (1-based, like the hosts' names).
  const std::string& address(int i) const { return addresses_.at(static_cast<std::size_t>(i - 1)); }
  /// `command` (a shell command line) on host i.
  std::string on(int i, const std::string& command) const {
    return script_ + " exec " + name_ + " " + std::to_string(i) + " sh -c '" + command + "'";
  }
  Ran run(int i, const std::string& command) const { return run_shell(on(i, command)); }
  /// Starts `command` on host i in the background, its output in `log`.
  Child start(int i, const std::string& command, const std::filesystem::path& log) const {
    return spawn({"/bin/sh", "-c", "exec " + on(i, command) + " > " + log.string() + " 2>&1"},
                 {"KF_LOG_LEVEL=info"});
  }
  void vanish(int i) const { run_shell(script_ + " vanish " + name_ + " " + std::to_string(i)); }
  /// Drops all traffic between the hosts of `a` and those of `b` ("1", "2 3").
  Ran partition(const std::string& a, const std::string& b, const std::string& ports = "") const {
    return run_shell(script_ + " partition " + name_ + " '" + a + "' '" + b + "'" +
                     (ports.empty() ? "" : " '" + ports + "'"));
  }
  void heal() const { run_shell(script_ + " heal " + name_); }
  void link(int i, bool up) const {
    run_shell(script_ + " link " + name_ + " " + std::to_string(i) + (up ? " up" : " down"));
  }
  /// Limits every host's link to `rate` each way ("1gbit"), or lifts the limit ("off").
  Ran rate(const std::string& rate) const {
    return run_shell(script_ + " rate " + name_ + " '" + rate + "'");
  }

 private:
  std::string name_, script_, error_, bridge_;
  std::vector<std::string> addresses_;
};

// A 3-member etcd cluster, one member on each of hosts 1-3 (client port 2379, peer port 2380),
// its data under `dir`. error() says why there is none.
class EtcdOnHosts {
 public:
  EtcdOnHosts(const Hosts& hosts, const std::filesystem::path& dir) : hosts_(hosts), dir_(dir) {
    const std::string exe = etcd_executable();
    if (exe.empty()) {
      error_ = "no etcd here (install etcd-server, or set ETCD_EXE)";
      return;
    }
    std::string initial;
    for (int i = 1; i <= 3; ++i) {
      initial += (i > 1 ? "," : "") + name(i) + "=http://" + hosts.address(i) + ":2380";
      url_ += (i > 1 ? "," : "etcd://") + hosts.address(i) + ":2379";
    }
    for (int i = 1; i <= 3; ++i) {
      const std::string a = hosts.address(i);
      members_.push_back(hosts.start(
          i,
          exe + " --name " + name(i) + " --data-dir " + (dir_ / name(i)).string() +
              " --listen-client-urls http://" + a + ":2379 --advertise-client-urls http://" + a +
              ":2379 --listen-peer-urls http://" + a +
              ":2380 --initial-advertise-peer-urls http://" + a + ":2380 --initial-cluster " +
              initial + " --initial-cluster-state new --initial-cluster-token kf-test",
          dir_ / (name(i) + ".log")));
    }
    ConfigClient c(url_, "probe", ConfigClientOptions{1000ms});
    if (!eventually(
            [&] {
              try {
                c.get_cluster();
                return true;
              } catch (const std::exception&) {
                return false;
              }
            },
            30s)) {
      error_ = "the etcd cluster did not answer within 30 s";
    }
  }
  ~EtcdOnHosts() {
    for (auto& m : members_) {
      if (m.pid > 0) {
        ::kill(m.pid, SIGKILL);
        ::waitpid(m.pid, nullptr, 0);
      }
      if (m.out_fd >= 0) ::close(m.out_fd);
    }
  }
  EtcdOnHosts(const EtcdOnHosts&) = delete;
  EtcdOnHosts& operator=(const EtcdOnHosts&) = delete;

  const std::string& error() const { return error_; }
  /// "etcd://A1:2379,A2:2379,A3:2379".
  const std::string& url() const { return url_; }
  /// The URL for processes on host i: its own member first, as a real deployment lists them.
  std::string url_for(int i) const {
    std::string u = "etcd://" + hosts_.address(i) + ":2379";
    for (int j = 1; j <= 3; ++j) {
      if (j != i) u += "," + hosts_.address(j) + ":2379";
    }
    return u;
  }
  /// The host whose member leads now (etcdctl endpoint status), 0 when none is known.
  int leader() const {
    std::string endpoints;
    for (int i = 1; i <= 3; ++i) endpoints += (i > 1 ? "," : "") + hosts_.address(i) + ":2379";
    const Ran r = run_shell("ETCDCTL_API=3 etcdctl --endpoints=" + endpoints +
                            " endpoint status -w json 2>/dev/null");
    const auto j = nlohmann::json::parse(r.output, nullptr, false);
    if (!j.is_array()) return 0;
    for (const auto& s : j) {
      const auto& st = s.value("Status", nlohmann::json::object());
      const auto id = st.value("header", nlohmann::json::object()).value("member_id", 0ull);
      if (id != 0 && id == st.value("leader", 0ull)) {
        const std::string ep = s.value("Endpoint", std::string());
        for (int i = 1; i <= 3; ++i) {
          if (ep == hosts_.address(i) + ":2379") return i;
        }
      }
    }
    return 0;
  }
  /// SIGKILL to the member on host i alone.
  void kill(int i) {
    auto& m = members_.at(static_cast<std::size_t>(i - 1));
    const Ran pids = run_shell(env_or_empty("KF_CLUSTER_HOSTS") + " pids " + hosts_.name() + " " +
                               std::to_string(i));
    std::istringstream in(pids.output);
    for (long pid = 0; in >> pid;) {
      if (slurp("/proc/" + std::to_string(pid) + "/comm") == "etcd\n") {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
      }
    }
    if (m.pid > 0) ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }

 private:
  static std::string name(int i) { return "e" + std::to_string(i); }
  const Hosts& hosts_;
  std::filesystem::path dir_;
  std::string error_;
  std::string url_;
  std::vector<Child> members_;
};

// The job: the config service on host 1 (or the given service URL: etcd) and an agent on each
// host.
class ClusterJob {
 public:
  /// `url_for(i)`, when given, is the service URL of the processes on host i (etcd).
  ClusterJob(const Hosts& hosts, const std::string& name, int n_hosts,
             std::function<std::string(int)> url_for = {})
      : hosts_(hosts), url_for_(std::move(url_for)) {
    dir_ = job_dir(name);
    // A job of kf-config-server starts from nothing; an etcd job's directory holds the etcd
    // members' data already (made afresh by its test).
    if (!url_for_) std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "token") << "cluster-test-token\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(
        dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    n_hosts_ = n_hosts;
    if (url_for_) {
      url_ = url_for_(1);
      return;
    }
    url_ = "http://" + hosts.address(1) + ":7070";
    server_ = hosts.start(1,
                          env_or_empty("CONFIG_SERVER_EXE") + " --listen " + hosts.address(1) +
                              ":7070 --token-file " + (dir_ / "token").string() + " --state " +
                              (dir_ / "state.json").string(),
                          dir_ / "server.log");
  }
  /// The job's directory (made afresh by the first ClusterJob of that name).
  static std::filesystem::path job_dir(const std::string& name) {
    return std::filesystem::temp_directory_path() /
           ("kf-cluster-" + name + "-" + std::to_string(::getpid()));
  }
  ~ClusterJob() {
    for (auto& c : agents_) stop(c);
    if (server_.pid > 0) stop(server_);
    std::error_code ignored;  // workers on the hosts may still be writing there
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ignored);
  }
  ClusterJob(const ClusterJob&) = delete;
  ClusterJob& operator=(const ClusterJob&) = delete;

  ConfigClient client() const { return ConfigClient(url_, "cluster-test-token"); }

  /// One agent per host, host 1's with `np` initial workers.
  void start_agents(int np, const std::string& args) {
    args_ = args;
    for (int i = 1; i <= n_hosts_; ++i) {
      agents_.push_back(hosts_.start(i, agent_command(i, i == 1 ? np : 0), log(i)));
    }
  }
  /// SIGKILL to host i's agent alone (its workers run on), then a new agent in its place, with
  /// the same command line and its own log (restarted_log).
  void restart_agent(int i) {
    const Ran pids = run_shell(env_or_empty("KF_CLUSTER_HOSTS") + " pids " + hosts_.name() + " " +
                               std::to_string(i));
    std::istringstream in(pids.output);
    int killed = 0;
    for (long pid = 0; in >> pid;) {
      if (slurp("/proc/" + std::to_string(pid) + "/comm") == "kfrun\n" &&
          ::kill(static_cast<pid_t>(pid), SIGKILL) == 0) {
        ++killed;
      }
    }
    ASSERT_EQ(killed, 1) << "host " << i << " runs no agent: " << pids.output;
    stop(agents_.at(static_cast<std::size_t>(i - 1)));
    agents_[static_cast<std::size_t>(i - 1)] =
        hosts_.start(i, agent_command(i, 0), restarted_log(i));
  }
  std::filesystem::path log(int host) const {
    return dir_ / ("agent" + std::to_string(host) + ".log");
  }
  std::filesystem::path restarted_log(int host) const {
    return dir_ / ("agent" + std::to_string(host) + "-restarted.log");
  }
  std::string logs() const {
    std::string s;
    for (int i = 1; i <= n_hosts_; ++i) {
      s += "== host " + std::to_string(i) + "\n" + slurp(log(i));
      if (std::filesystem::exists(restarted_log(i))) {
        s += "== host " + std::to_string(i) + ", restarted agent\n" + slurp(restarted_log(i));
      }
    }
    return s + "== server\n" + slurp(dir_ / "server.log");
  }
  /// The cluster_changed events: each version must appear once (no change applied twice) and
  /// the last must be the document's.
  void expect_each_change_once() const {
    std::set<std::uint64_t> versions;
    int changes = 0;
    for (const auto& e : client().get_events()) {
      if (e.type != "cluster_changed") continue;
      ++changes;
      versions.insert(e.version.value_or(0));
    }
    EXPECT_EQ(static_cast<std::size_t>(changes), versions.size()) << "a change was applied twice";
    ASSERT_FALSE(versions.empty());
    EXPECT_EQ(client().get_cluster().version, *versions.rbegin());
    EXPECT_EQ(*versions.begin(), 1u);
    EXPECT_EQ(versions.size(), *versions.rbegin()) << "a committed change is missing";
  }

  long progress() const { return read_progress(dir_ / "progress"); }
  bool wait_progress(long past, std::chrono::milliseconds timeout = 60s) const {
    return eventually([&] { return progress() > past; }, timeout);
  }
  /// 2 workers on host 1, then `kf-member add --host` run on host 1 for hosts 2 and 3 (2 workers
  /// each; their ports are picked unchecked there and their agents move any that is in use),
  /// each grow in effect before the next; then 20 more steps.
  void grow_to_two_per_host() {
    start_agents(2, kArgs);
    ASSERT_TRUE(wait_progress(20)) << logs();
    for (int host = 2; host <= n_hosts_; ++host) {
      const Ran r = member(1, "add --host " + hosts_.address(host) + " --count 2");
      EXPECT_NE(r.output.find("ports not checked"), std::string::npos) << r.output;
      ASSERT_EQ(r.exit_code, 0) << r.output;
      ASSERT_TRUE(wait_size(2 * host)) << logs();
    }
    ASSERT_TRUE(wait_progress(progress() + 20)) << logs();
  }
  /// `kf-member ARGS` run on host i.
  Ran member(int i, const std::string& args) const {
    return hosts_.run(i, env_or_empty("KF_MEMBER") + " --server " + url_of(i) + " --token-file " +
                             (dir_ / "token").string() + " " + args);
  }
  /// Workers of the current cluster per host address.
  std::map<std::string, int> per_host() const {
    std::map<std::string, int> m;
    try {
      for (const auto& w : client().get_cluster().workers) ++m[w.endpoint.host];
    } catch (const std::exception&) {
    }
    return m;
  }
  /// Waits until the job switched to `n` workers: rank 0's "resized" event, not the document.
  bool wait_size(int n, std::chrono::milliseconds timeout = 60s) const {
    const std::string needle = "-> " + std::to_string(n) + " workers, ";
    return eventually(
        [&] {
          try {
            for (const auto& e : client().get_events()) {
              if (e.type == "resized" && e.detail.find(needle) != std::string::npos) return true;
            }
          } catch (const std::exception&) {
          }
          return false;
        },
        timeout);
  }
  bool wait_workers(int n, std::chrono::milliseconds timeout = 60s) const {
    return eventually(
        [&] {
          try {
            return client().get_cluster().size() == n && progress() >= 0;
          } catch (const std::exception&) {
            return false;
          }
        },
        timeout);
  }
  void finish_soon() {
    auto c = client();
    kf::test::finish_soon(c);
  }
  /// Waits for the agents of hosts `alive` to exit; every one must exit 0.
  void expect_agents_exit(const std::vector<int>& alive) {
    for (int i : alive) {
      auto st = wait_exit(agents_.at(static_cast<std::size_t>(i - 1)),
                          std::chrono::steady_clock::now() + 120s);
      agents_[static_cast<std::size_t>(i - 1)].pid = -1;
      ASSERT_TRUE(st.has_value()) << "the agent of host " << i << " did not exit\n" << logs();
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << "the agent of host " << i << " exited with " << *st << "\n"
          << logs();
    }
  }
  /// The "final step=... workers=N hash=H" lines of every log: `workers` of them, one hash.
  void expect_identical_finals(int workers) const {
    const std::string all = logs();
    EXPECT_EQ(all.find("BROKEN"), std::string::npos) << all;
    std::set<std::string> hashes;
    int finals = 0;
    const std::regex re("final step=\\d+ workers=(\\d+) hash=([0-9a-f]+)");
    for (auto it = std::sregex_iterator(all.begin(), all.end(), re); it != std::sregex_iterator();
         ++it) {
      ++finals;
      EXPECT_EQ(std::stoi((*it)[1]), workers);
      hashes.insert((*it)[2]);
    }
    EXPECT_EQ(finals, workers) << all;
    EXPECT_EQ(hashes.size(), 1u) << "the workers finished with different parameters\n" << all;
  }

 private:
  static void stop(Child& c) {
    if (c.pid > 0) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      c.pid = -1;
    }
    if (c.out_fd >= 0) ::close(c.out_fd);
    c.out_fd = -1;
  }
  std::string url_of(int host) const { return url_for_ ? url_for_(host) : url_; }
  std::string agent_command(int i, int np) const {
    std::string cmd = env_or_empty("KFRUN") + " --watch --config-server " + url_of(i) +
                      " --job-token-file " + (dir_ / "token").string() + " --host " +
                      hosts_.address(i) + " --slots 4 --leave-grace-ms 20000";
    if (np > 0) cmd += " -np " + std::to_string(np);
    return cmd + " -- " + env_or_empty("KF_ELASTIC_WORKER") + " --progress-file " +
           (dir_ / "progress").string() + " " + args_;
  }

  const Hosts& hosts_;
  std::function<std::string(int)> url_for_;
  std::string args_;
  std::filesystem::path dir_;
  std::string url_;
  int n_hosts_ = 0;
  Child server_;
  std::vector<Child> agents_;
};

inline int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

inline std::string unique_name(const char* what) {
  return std::string(what) + std::to_string(::getpid() % 10000);
}

}  // namespace kf::test
