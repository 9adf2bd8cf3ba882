// SPDX-License-Identifier: Apache-2.0
// Runs the processes of one benchmark job (kfrun, mpirun, or the ranks of a Gloo run) in a
// process group of their own, with each one's stdout and stderr captured, and ends the group at
// a deadline: SIGTERM first, so that kfrun and mpirun stop their own workers (which live in other
// process groups), then SIGKILL after a grace period. A member that fails ends the group the same
// way, since its peers would otherwise wait for it until their own timeouts. SIGINT and SIGTERM
// sent to this process while it waits end the group too, and are reported, not re-raised.
// Thread-safety: run_group() blocks the calling thread and changes its signal mask while it
// runs; call it from one thread at a time in a process that starts no other children.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kf::tools::bench {

/// Whether `path` is a regular file this process may execute.
bool executable_file(const std::filesystem::path& path);

/// A change to the child's environment: set `name` to `value`, or unset it (nullopt).
struct EnvChange {
  std::string name;
  std::optional<std::string> value;
};

/// One process to start. argv[0] is a path: there is no PATH search.
struct Command {
  std::vector<std::string> argv;
  std::vector<EnvChange> env;  ///< applied to this process's environment, in order
};

struct ProcessResult {
  int exit_code = -1;  ///< the exit status, or 128 + the signal that ended it
  std::string out;     ///< all of its stdout
  std::string err;     ///< all of its stderr, and why it could not start, if it could not
};

struct GroupResult {
  std::vector<ProcessResult> processes;  ///< in the order of the commands
  bool timed_out = false;                ///< the deadline passed before every process exited
  int interrupted_by = 0;                ///< SIGINT or SIGTERM received while waiting; else 0
  std::string error;                     ///< why the group could not be started (pipe, fork)

  /// Every process started, exited 0 and in time.
  bool ok() const noexcept;
};

struct GroupLimits {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  ///< from the start to SIGTERM
  std::chrono::milliseconds grace{std::chrono::seconds(10)};   ///< from SIGTERM to SIGKILL
};

/// Starts `commands` (at least one) in a new process group led by the first, stdin on /dev/null,
/// and returns when all have exited and their output has been read. Never throws for a failure
/// of the children; Throws: std::bad_alloc.
GroupResult run_group(const std::vector<Command>& commands, const GroupLimits& limits);

}  // namespace kf::tools::bench
