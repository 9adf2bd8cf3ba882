// SPDX-License-Identifier: Apache-2.0
// The one place that decides a worker's configuration from all its sources, with one precedence
// (docs/configuration.md): defaults < job file < cluster settings < environment < command line.
// kfrun turns its command line into KF_* variables for the workers it starts, so a worker sees the
// last two as one: its environment. Every source arrives here already parsed into typed fields
// (kf::Env, kf::JobFile, kf::ClusterSettings); this function only merges them, without I/O, so the
// precedence has unit tests.
// Thread-safety: free functions and value types.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kf/common/env.hpp"
#include "kf/peer.hpp"
#include "kf/runtime/job_file.hpp"
#include "kf/runtime/session.hpp"

namespace kf::detail {

/// A worker's configuration, merged.
struct WorkerConfig {
  PeerOptions peer;
  SessionOptions session;
  /// The cluster to start with: the environment's, with the settings that passed
  /// parse_cluster_settings (the others are in `settings_errors`).
  Cluster cluster;
  /// One message per cluster setting that was ignored (see kf/runtime/cluster_settings.hpp).
  std::vector<std::string> settings_errors;
};

/// Merges the sources. `job` is the job file named by KF_JOB_FILE, already loaded.
/// Throws: std::invalid_argument naming a variable whose value is not valid (KF_ALGORITHM,
/// KF_TRANSPORT).
WorkerConfig resolve_worker_config(const Env& env, const std::optional<JobFile>& job);

}  // namespace kf::detail
