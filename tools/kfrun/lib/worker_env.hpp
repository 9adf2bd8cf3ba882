// SPDX-License-Identifier: Apache-2.0
// The environment kfrun gives the workers it starts: the job (cluster, id, token, settings, and
// the config service in watch mode) and, per worker, its KF_SELF and rank, on top of kfrun's own
// environment. The
// variable names come from kf/common/env.hpp. Thread-safety: value types and free functions;
// current_environment() reads `environ` and must not race with setenv().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

/// What every worker of one job shares.
struct JobSpec {
  Cluster cluster;  ///< the initial cluster; worker i is workers[i]
  std::string job_id;
  std::optional<std::string> job_token_file;  ///< passed as KF_JOB_TOKEN_FILE when set
  std::optional<std::string> algorithm;
  std::optional<std::chrono::milliseconds> timeout;
  std::optional<std::string> config_server;  ///< passed as KF_CONFIG_SERVER when set (watch mode)
  /// KF_METRICS_PORT = metrics_port + the worker's slot (0 when past 65535, or when 0: the
  /// kernel picks).
  std::optional<std::uint16_t> metrics_port;
  std::optional<std::string> job_file;  ///< passed as KF_JOB_FILE when set (kfrun --job)
  /// Passed as KF_CLUSTER_FILE instead of KF_CLUSTER when set: a file holding `cluster`
  /// (write_cluster_file), for a document too large for the environment.
  std::optional<std::string> cluster_file;
};

/// The largest cluster document (JSON bytes) passed in the environment: Linux refuses an exec
/// with one string over 128 KiB, and the rest of the environment needs room too.
inline constexpr std::size_t kMaxClusterEnvBytes = 96 * 1024;
/// Whether `cluster`'s document fits the environment (kMaxClusterEnvBytes).
bool fits_environment(const Cluster& cluster);
/// Writes `cluster`'s document to DIR/cluster-vVERSION.json (0600; kept when it exists: one file
/// per version) and returns its path. Throws: std::system_error naming the file.
std::string write_cluster_file(const Cluster& cluster, const std::filesystem::path& dir);

/// The socket to hand the worker listening at `self` (ports.hpp bind_worker_port): its port,
/// bound on this machine. Throws: ExecError (worker_process.hpp) when the port is in use or
/// `self`'s host is not an address of this machine.
UniqueFd worker_listener(const Endpoint& self);
/// `env` with KF_LISTEN_FD naming `fd` (a worker_listener(), which WorkerProcess::spawn hands
/// down) in place of any it had.
void add_listen_fd(std::vector<std::string>& env, int fd);

/// The cluster of a static job: version 1, one worker per port on `host` in rank order with
/// slot = rank, and settings {"algorithm": algorithm} when an algorithm is given.
Cluster static_cluster(const std::string& host, const std::vector<std::uint16_t>& ports,
                       const std::optional<std::string>& algorithm);

/// The environment ("NAME=VALUE" strings) of worker `rank`: `base` without the KF_* variables
/// kfrun sets (so that a value from an enclosing job cannot leak in), followed by KF_SELF,
/// KF_CLUSTER (or KF_CLUSTER_FILE), KF_JOB_ID, KF_JOB_TOKEN_FILE, KF_RANK, KF_SIZE and, when set,
/// KF_ALGORITHM, KF_TIMEOUT_MS, KF_CONFIG_SERVER, KF_METRICS_PORT and KF_JOB_FILE. An inherited
/// KF_CONFIG_SERVER is replaced only when job.config_server is set (a static job leaves it alone).
/// Requires: 0 <= rank < job.cluster.size().
std::vector<std::string> worker_environment(const JobSpec& job, int rank,
                                            const std::vector<std::string>& base);
/// The same for the hot spare `spare` of job.cluster (docs/elastic.md, "Hot spares"): KF_SELF is
/// the spare's address, and there is no KF_RANK (a spare has none until it is moved in).
/// Requires: job.cluster.is_spare(spare.endpoint).
std::vector<std::string> spare_environment(const JobSpec& job, const WorkerSpec& spare,
                                           const std::vector<std::string>& base);

/// A copy of this process's environment.
std::vector<std::string> current_environment();

/// `count_bytes` random bytes from OpenSSL's CSPRNG, as 2 * count_bytes lowercase hex digits.
/// Throws: std::runtime_error when the generator fails.
std::string random_hex(std::size_t count_bytes);

}  // namespace kf::tools
