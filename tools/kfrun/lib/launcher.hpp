// SPDX-License-Identifier: Apache-2.0
// kfrun's static mode: start N workers of one job on this host, tag their output with their rank,
// and stop the whole job as soon as one worker fails. Thread-safety: run_static() installs
// process-wide signal handlers for its duration; call it from one thread, one job at a time.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kfrun/lib/binding.hpp"
#include "kfrun/lib/ports.hpp"

namespace kf::tools {

struct LaunchOptions {
  int np = 0;                                        ///< number of workers, >= 1
  std::string host = "127.0.0.1";                    ///< where the workers listen (KF_SELF host)
  PortRange ports;                                   ///< where their ports are picked from
  std::optional<std::string> job_token_file;         ///< else a random token is made
  std::optional<std::string> job_id;                 ///< else a random id is made
  std::optional<std::string> algorithm;              ///< job default algorithm (KF_ALGORITHM)
  std::optional<std::chrono::milliseconds> timeout;  ///< collective deadline (KF_TIMEOUT_MS)
  /// Worker in slot i serves its metrics on metrics_port + i (KF_METRICS_PORT); 0: each on a
  /// port the kernel picks.
  std::optional<std::uint16_t> metrics_port;
  /// Added to the cluster's settings (kfrun --job: min/max workers, batch size, learning rate).
  nlohmann::json settings = nlohmann::json::object();
  std::optional<std::string> job_file;  ///< KF_JOB_FILE for the workers
  std::vector<std::string> command;     ///< program and its arguments
  /// Whether worker i is held to one core (binding.hpp): with `automatic`, when np is more
  /// than the cores kfrun may use.
  Bind bind = Bind::automatic;
  /// How long stopped workers get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace{2000};
  int out_fd = 1;  ///< where the workers' tagged stdout goes
  int err_fd = 2;  ///< where their tagged stderr and kfrun's own messages go
};

/// Runs a static job and returns kfrun's exit code:
///  1. Checks the options and picks `np` free ports of `ports` on `host`.
///  2. Builds the job: cluster version 1 with worker i at host:ports[i], slot i; the job id; the
///     token file (KF_JOB_TOKEN_FILE: the one given, else a fresh random token in a 0600 file of a
///     private temporary directory, removed when kfrun returns).
///  3. Starts the workers, rank 0 first, each with its KF_* environment on top of kfrun's, with
///     none of kfrun's descriptors but stdin, stdout and stderr, and SIGKILL should kfrun die
///     (even by kill -9: no worker outlives it), in a
///     process group of its own, stdin on /dev/null.
///  4. Copies each line a worker writes to its stdout (stderr) to out_fd (err_fd), prefixed with
///     "[rank] "; a final line without newline is completed at end of stream.
///  5. Forwards SIGINT that kfrun receives to every running worker (their exits decide the
///     outcome). On SIGTERM, stops the job as in step 6 and returns 128 + SIGTERM.
///  6. When a worker exits non-zero or is killed by a signal, sends SIGTERM to the process
///     groups of the others and SIGKILL to those still running `grace` later.
/// Returns 0 when every worker exited 0; else the exit code of the first worker that failed
/// (128 + signal when killed by one); 127 when the program cannot be executed.
/// Throws: std::invalid_argument for a usage error (np < 1, no program, an unreadable token
/// file, a bad host, a port range short of free ports), with a message that says what to fix;
/// std::system_error when the operating system refuses a pipe, fork or signal handler.
int run_static(const LaunchOptions& options);

}  // namespace kf::tools
