// SPDX-License-Identifier: Apache-2.0
// An elastic job on this host, run by kf-chaos and kf-replay: a kf-config-server and one
// `kfrun --watch` agent, both children of this process, with a random job token in the work
// directory and their output in files there. It knows the pid of every worker the agents
// started (their `started` and `adopted` events) and kills them all when it goes.
// Thread-safety: one thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::chaos {

using Clock = std::chrono::steady_clock;

struct JobSpec {
  std::string kfrun = "kfrun";
  std::string config_server = "kf-config-server";
  int np = 1;                        ///< initial workers
  int slots = 1;                     ///< the agent's --slots: the most workers at once
  std::vector<std::string> command;  ///< the worker program and its arguments
  std::vector<std::string> env;      ///< "NAME=VALUE" added to the agent's (and workers') own
  std::string host = "127.0.0.1";    ///< where the config service listens
};

/// A tool's work directory: the one the user gave (created if need be, always kept), or a fresh
/// private one under $TMPDIR, removed when this goes unless kept after a failure.
class WorkDir {
 public:
  explicit WorkDir(const std::optional<std::filesystem::path>& given);
  ~WorkDir();
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  /// After a failure: a private directory moves to $TMPDIR/TOOL-SEED-PID and stays. Returns
  /// where the job's output is now.
  std::string keep(const std::string& tool, std::uint64_t seed);

 private:
  std::filesystem::path path_;
  bool own_ = false;
};

/// `name` next to the running executable (installed), in the build tree's sibling folder
/// (tools/NAME/NAME), or else the bare name (looked up on PATH when started).
std::string default_tool(const std::string& name);

class Job {
 public:
  /// Writes the token and picks the service's port; starts nothing. Throws: std::system_error
  /// when the token file cannot be written, std::invalid_argument when no port is free.
  Job(JobSpec spec, std::filesystem::path dir);
  /// Kills the agent, every worker it knows of and the service.
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const std::string& url() const noexcept { return url_; }
  const std::filesystem::path& token_file() const noexcept { return token_file_; }
  ConfigClient client() const;

  /// Starts the config service (same port and state file every time) and waits until it
  /// answers. Throws: std::runtime_error naming what it said when it exits or stays silent 30 s.
  void start_server();
  void kill_server();  ///< kill -9
  void stop_server();  ///< SIGTERM
  void start_agent();
  void kill_agent();  ///< kill -9 (its workers run on, to be adopted)
  /// kfrun's exit code once it has exited, waiting until `until` at most.
  std::optional<int> agent_exit(Clock::time_point until);

  /// Learns the pids of the workers started since the last call (from the service's events).
  void refresh_pids();
  /// The members of `c` whose process runs, with their pids (refresh_pids first).
  std::map<std::string, pid_t> live_members(const Cluster& c);
  /// Whether `worker` has joined the running job (its `joined` event came): it holds the job's
  /// state, which a worker still joining does not.
  bool has_joined(const std::string& worker) const { return joined_.contains(worker); }
  /// kill -9 of every worker ever started that still runs.
  void kill_workers();
  /// Waits until the agent started last has started or adopted every member of the current
  /// cluster whose process runs (what a worker writes before that is lost: nobody reads it),
  /// until `until` at most. Returns whether it has.
  bool wait_agent_attached(Clock::time_point until);

  std::string agent_output() const;
  std::string agent_errors() const;

 private:
  JobSpec spec_;
  std::filesystem::path dir_;
  std::filesystem::path token_file_;
  std::string token_;
  std::uint16_t port_ = 0;
  std::string url_;
  pid_t server_ = 0;
  pid_t agent_ = 0;
  std::optional<int> agent_code_;
  std::uint64_t last_seq_ = 0;
  std::map<std::string, pid_t> pids_;  // every worker ever started, by endpoint
  std::uint64_t agent_seq_ = 0;        // the last event before the agent started last
  std::set<std::string> attached_;     // workers it started or adopted since
  std::set<std::string> joined_;       // workers that joined the running job
};

/// Writes settings[KEY] = VALUE into the cluster document by compare-and-swap, for
/// `assignment` "KEY=VALUE" (VALUE as JSON when it parses as JSON, else as a string); the job's
/// workers see it at a step boundary. Throws: ConflictError after 50 lost races, kf::Error.
void write_setting(ConfigClient& c, const std::string& assignment);

/// Whether process `pid` runs (not gone, not a zombie).
bool running(pid_t pid);
/// The last `count` lines of `text`.
std::string last_lines(const std::string& text, int count);
/// The whole of file `p`; empty when it cannot be read (a worker that has not written it yet).
std::string slurp(const std::filesystem::path& p);

}  // namespace kf::chaos
