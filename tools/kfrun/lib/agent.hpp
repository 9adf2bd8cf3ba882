// SPDX-License-Identifier: Apache-2.0
// kfrun's watch mode: the per-host agent of an elastic job. It watches the cluster document held
// by the config service (an external kf-config-server, or one it runs itself), starts the workers
// the document places on its host, stops the ones that leave it (at once when killed, after a
// grace when revoked or removed), and reports every start and exit back as events; a worker that
// fails while a member is removed from the cluster. docs/kfrun.md gives the rules in full.
// Thread-safety: run_agent() installs process-wide signal handlers and starts helper threads for
// its duration; call it from one thread, one agent per process.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kfrun/lib/notice.hpp"
#include "kfrun/lib/ports.hpp"

namespace kf::tools {

/// What becomes of this host's workers when the agent dies without stopping them (kill -9, a
/// crash): `adopt`, they train on, and an agent restarted on the host takes them over
/// (adopt.hpp); `kill`, they get SIGKILL at once (the job counts them as lost). The default is
/// `adopt` with an external config service and `kill` with the builtin one, which dies with its
/// agent (nobody could adopt the workers, and they would train on for ever without a control
/// plane); `adopt` with the builtin service is a usage error.
enum class Orphans { adopt, kill };

struct AgentOptions {
  std::string config_server;       ///< "http://HOST:PORT", or "builtin" to run one in-process
  std::optional<int> slots;        ///< most workers running at once on this host, >= 1
  std::string host = "127.0.0.1";  ///< the agent owns the workers whose host is this
  std::optional<int> np;           ///< initial workers when the service holds no cluster
  /// With np: place the np workers on this host also when the service holds a cluster, unless
  /// it has workers here already (--join; --slurm sets it).
  bool join = false;
  PortRange ports;                            ///< where the initial workers' ports are picked from
  std::optional<std::string> job_token_file;  ///< required with an external service
  std::optional<std::string> job_id;          ///< else derived from the token
  std::optional<std::string> algorithm;       ///< initial settings, and KF_ALGORITHM
  std::optional<std::chrono::milliseconds> timeout;  ///< collective deadline (KF_TIMEOUT_MS)
  std::optional<std::uint16_t> metrics_port;         ///< see LaunchOptions::metrics_port
  /// With metrics_port above 0: this file lists the metrics endpoints of the workers this agent
  /// runs, for Prometheus's file-based discovery (file_sd_configs), rewritten atomically
  /// whenever they change.
  std::optional<std::string> metrics_sd_file;
  nlohmann::json settings = nlohmann::json::object();  ///< of the initial cluster it writes
  std::optional<std::string> job_file;                 ///< KF_JOB_FILE for the workers
  std::optional<std::string> state_file;               ///< builtin only
  /// How long a worker that left the cluster without a notice may keep running before SIGTERM.
  std::chrono::milliseconds leave_grace{30'000};
  /// Between SIGTERM and SIGKILL when kfrun itself is stopped (SIGINT, SIGTERM, an error).
  std::chrono::milliseconds stop_grace{2000};
  std::optional<Orphans> orphans;  ///< unset: the default above
  NoticeOptions notice;            ///< how a notice comes, and its grace
  /// --slurm --requeue: the allocation (SLURM_JOB_ID) that the agent asks Slurm to requeue
  /// (`scontrol requeue ID`) once its workers left on a notice that came by a signal other than
  /// SIGTERM (Slurm's preemption or time-limit signal), so that it runs again and rejoins.
  std::optional<std::string> requeue_job;
  std::vector<std::string> command;  ///< program and its arguments
  int out_fd = 1;                    ///< where the workers' tagged stdout goes
  int err_fd = 2;                    ///< their tagged stderr and kfrun's own messages
};

/// Runs the agent until the job is finished (a local worker exited 0 while still in the cluster,
/// or the cluster is marked finished, and no local worker runs any more) or kfrun is stopped,
/// and returns kfrun's exit code: 0 when the job finished and every local worker exited 0 or
/// left the cluster (a worker that failed during the job was dropped from the cluster: it left);
/// 128 + signal after SIGINT or SIGTERM (the workers get SIGTERM, then SIGKILL after
/// stop_grace); 1 when a local member failed after the job finished, when the last worker of the
/// cluster failed (the job cannot go on), or on a runtime error (the token rejected, the service
/// answering nonsense).
/// Throws: std::invalid_argument for a usage error, with a message naming the option (no
/// --slots, --slots < 1, builtin without -np, -np > --slots, a bad URL, an unreadable token file,
/// --state without builtin, no program, no free ports for -np); std::runtime_error for a corrupt
/// state file; std::system_error when the operating system refuses a pipe, thread or socket.
int run_agent(const AgentOptions& options);

}  // namespace kf::tools
