// SPDX-License-Identifier: Apache-2.0
// Every KF_* environment variable kf reads, declared once and parsed once. kfrun sets them for the
// workers it starts; a worker reads them all through Env::from_environment() into typed fields,
// and nothing else in kf calls getenv for a KF_* variable (env::get is the one raw reader, for
// the few variables a process reads before it is a worker, such as KF_LOG_LEVEL). Which source
// wins when a variable, the job file and the cluster settings all give a value is decided in one
// place, the runtime's worker configuration (docs/configuration.md).
// Thread-safety: value type and free functions (the environment must not change meanwhile).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kf/cluster/cluster.hpp"

namespace kf {

namespace env {
inline constexpr const char* kSelf = "KF_SELF";  ///< host:port this worker listens on
/// A descriptor number: a TCP socket its launcher bound to KF_SELF's port and handed down, so
/// that the port is held from the moment it is picked (the worker listens on it).
inline constexpr const char* kListenFd = "KF_LISTEN_FD";
inline constexpr const char* kCluster = "KF_CLUSTER";  ///< initial cluster, JSON
/// A file holding the initial cluster, instead of KF_CLUSTER (kfrun uses it for a document too
/// large for the environment).
inline constexpr const char* kClusterFile = "KF_CLUSTER_FILE";
inline constexpr const char* kJobId = "KF_JOB_ID";        ///< job id (part of the handshake)
inline constexpr const char* kJobToken = "KF_JOB_TOKEN";  ///< job token (secret)
inline constexpr const char* kJobTokenFile = "KF_JOB_TOKEN_FILE";  ///< file holding the token
inline constexpr const char* kConfigServer = "KF_CONFIG_SERVER";   ///< URL of the config service
inline constexpr const char* kAlgorithm = "KF_ALGORITHM";          ///< job default algorithm
inline constexpr const char* kTimeoutMs = "KF_TIMEOUT_MS";         ///< collective deadline, ms
inline constexpr const char* kHeartbeatMs = "KF_HEARTBEAT_MS";     ///< silent-peer timeout, ms
/// How long a new connection may take to open and authenticate, ms.
inline constexpr const char* kConnectTimeoutMs = "KF_CONNECT_TIMEOUT_MS";
inline constexpr const char* kSpinUs = "KF_SPIN_US";              ///< I/O polling window, us
inline constexpr const char* kExpressBytes = "KF_EXPRESS_BYTES";  ///< express allreduce limit
inline constexpr const char* kTransport =
    "KF_TRANSPORT";  ///< auto | unix | tcp (see kf::Transport)
inline constexpr const char* kDeviceBackend =
    "KF_DEVICE_BACKEND";  ///< auto | nccl | staging (see kf::DeviceBackend)
inline constexpr const char* kFrameAuth =
    "KF_FRAME_AUTH";  ///< on | off | openssl: MACs on frames between hosts
                      ///< (PeerOptions::frame_auth)
inline constexpr const char* kLogLevel = "KF_LOG_LEVEL";     ///< trace|debug|info|warn|error
inline constexpr const char* kCheckpoint = "KF_CHECKPOINT";  ///< kf::Session checkpoint file
inline constexpr const char* kCheckpointEvery = "KF_CHECKPOINT_EVERY";  ///< commits between saves
inline constexpr const char* kAgentPid = "KF_AGENT_PID";  ///< the kfrun agent that started it
inline constexpr const char* kNoProgressTimeoutMs =
    "KF_NO_PROGRESS_TIMEOUT_MS";  ///< no commit this long while membership churns: stop, ms
inline constexpr const char* kServiceTimeoutMs =
    "KF_SERVICE_TIMEOUT_MS";  ///< recovery's longest wait for the config service, ms
inline constexpr const char* kRecoveryWriterWaitMs =
    "KF_RECOVERY_WRITER_WAIT_MS";  ///< a survivor's wait for the one that writes, ms
inline constexpr const char* kRecoveryJoinerWaitMs =
    "KF_RECOVERY_JOINER_WAIT_MS";  ///< a recovery's wait for joiners to be reached, ms
inline constexpr const char* kSpareSyncMs =
    "KF_SPARE_SYNC_MS";  ///< least time between the commits rank 0 sends a hot spare, ms
inline constexpr const char* kBoundaryIntervalMs =
    "KF_BOUNDARY_INTERVAL_MS";  ///< most time between boundaries on change, ms
inline constexpr const char* kSummaryIntervalMs =
    "KF_SUMMARY_INTERVAL_MS";  ///< least time between rank 0's summaries for the dashboard, ms
inline constexpr const char* kJobFile = "KF_JOB_FILE";          ///< the job file (docs/job-file.md)
inline constexpr const char* kGnsTheta = "KF_GNS_THETA";        ///< θ0 of the GNS averages
inline constexpr const char* kMonitors = "KF_MONITORS";         ///< 0: no built-in monitors
inline constexpr const char* kMetricsPort = "KF_METRICS_PORT";  ///< Prometheus endpoint port
inline constexpr const char* kMetricsHost = "KF_METRICS_HOST";  ///< ... and address
inline constexpr const char* kMetricsJsonl = "KF_METRICS_JSONL";  ///< metrics JSON-lines file
inline constexpr const char* kMetricsEvery = "KF_METRICS_EVERY";  ///< steps between lines
inline constexpr const char* kRank = "KF_RANK";                   ///< informational: initial rank
inline constexpr const char* kSize = "KF_SIZE";                   ///< informational: initial size

/// The value of variable `name`; nullopt when it is unset or empty.
std::optional<std::string> get(const char* name);
}  // namespace env

/// The settings a worker takes from its environment, each parsed once. An optional field is
/// unset when its variable is unset or empty.
struct Env {
  Endpoint self;
  std::optional<int> listen_fd;  ///< KF_LISTEN_FD, >= 3
  Cluster cluster;
  std::string job_id;
  std::string job_token;
  std::optional<std::string> config_server;
  std::optional<std::string> algorithm;
  std::optional<std::string> transport;
  std::optional<std::string> device_backend;  ///< KF_DEVICE_BACKEND
  std::optional<std::string> frame_auth;      ///< KF_FRAME_AUTH
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<std::chrono::microseconds> spin;
  std::optional<std::size_t> express_bytes;
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
  std::optional<std::chrono::milliseconds> connect_timeout;  ///< KF_CONNECT_TIMEOUT_MS
  std::optional<std::string> job_file;                       ///< KF_JOB_FILE
  std::optional<std::string> checkpoint;                     ///< KF_CHECKPOINT
  std::optional<std::int64_t> checkpoint_every;              ///< KF_CHECKPOINT_EVERY, >= 1
  std::optional<bool> monitors;                              ///< KF_MONITORS, 0 or 1
  std::optional<double> gns_theta;                           ///< KF_GNS_THETA, in (0, 1)
  std::optional<std::uint16_t> metrics_port;  ///< KF_METRICS_PORT, 0-65535 (0: any port)
  std::optional<std::string> metrics_host;    ///< KF_METRICS_HOST
  std::optional<std::string> metrics_jsonl;   ///< KF_METRICS_JSONL
  std::optional<std::int64_t> metrics_every;  ///< KF_METRICS_EVERY, >= 1
  std::optional<std::chrono::milliseconds> service_timeout;       ///< KF_SERVICE_TIMEOUT_MS, >= 1
  std::optional<std::chrono::milliseconds> recovery_writer_wait;  ///< KF_RECOVERY_WRITER_WAIT_MS
  std::optional<std::chrono::milliseconds> recovery_joiner_wait;  ///< KF_RECOVERY_JOINER_WAIT_MS
  std::optional<std::chrono::milliseconds> spare_sync;            ///< KF_SPARE_SYNC_MS
  std::optional<std::chrono::milliseconds> boundary_interval;     ///< KF_BOUNDARY_INTERVAL_MS
  std::optional<std::chrono::milliseconds> summary_interval;      ///< KF_SUMMARY_INTERVAL_MS
  std::optional<std::int64_t> agent_pid;                          ///< KF_AGENT_PID, >= 1
  std::optional<std::chrono::milliseconds> no_progress_timeout;   ///< KF_NO_PROGRESS_TIMEOUT_MS

  /// Reads the KF_* variables. Throws: std::invalid_argument naming the variable that is missing
  /// or malformed (e.g. "KF_CLUSTER: workers[1].port must be an integer in 1-65535").
  static Env from_environment();
};

/// Reads a job token file: its content up to the first newline (trailing spaces and CR dropped).
/// Warns (once per file and process) when users other than the owner may read it. Throws:
/// std::runtime_error when the file cannot be read, is not a regular file, is empty, or its
/// first line is longer than 4096 bytes.
std::string read_token_file(const std::string& path);

}  // namespace kf
