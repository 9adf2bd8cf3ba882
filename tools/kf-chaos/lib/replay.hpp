// SPDX-License-Identifier: Apache-2.0
// kf-replay: replays an availability trace (trace.hpp) against an elastic job on this host (a
// kf-config-server and one `kfrun --watch` agent, job.hpp), or on Slurm nodes (one allocation
// per worker, slurm_fleet.hpp): first it measures the job's
// steady-state throughput at every size the trace will ask for, then it resizes the job as the
// trace's nodes come and go, compressed in time, removals as revokes with a notice or, for a
// drawn fraction, as kill -9. It reports the throughput retained: the samples the job committed
// during the replay divided by what it would have committed at each moment's size, at the
// measured rates. Thread-safety: replay() is called by one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kf-chaos/lib/slurm_fleet.hpp"

namespace kf::chaos {

struct ReplayOptions {
  std::filesystem::path trace;
  double speed = 60;         ///< trace time / replay time
  int max_workers = 4;       ///< the most nodes ever up in the trace become this many workers
  int notice_s = 2;          ///< a revoke's notice
  double kill_fraction = 0;  ///< of the removals, this share are kill -9 (drawn with the seed)
  std::uint64_t seed = 0;
  std::chrono::milliseconds settle{1000};     ///< after a resize, before measuring
  std::chrono::milliseconds calibrate{3000};  ///< how long each size is measured
  std::chrono::milliseconds tail{2000};       ///< after the trace's last row
  int metrics_every = 10;                     ///< KF_METRICS_EVERY for the job
  std::optional<std::string> finish_with;     ///< as kf-chaos's
  std::chrono::seconds finish_timeout{120};
  std::optional<std::filesystem::path> dir;
  std::string kfrun = "kfrun";
  std::string config_server = "kf-config-server";
  std::vector<std::string> command;
  /// Through Slurm: each worker an allocation of one of these nodes, removals real preemptions
  /// (docs/chaos.md, "Through Slurm"). Unset: one agent on this host, removals by kf-member.
  std::optional<SlurmOptions> slurm;
  std::string listen = "127.0.0.1";  ///< the config service's address (the nodes must reach it)
};

/// Checks `o`. Throws: std::invalid_argument saying what is wrong.
void check(const ReplayOptions& o);

/// Runs the job, the calibration and the replay; writes one line per change and a summary to
/// `out`. Returns 0 when the job kept its guarantees (verdict.hpp) and 1 when not, or when it
/// hung or failed. Throws: TraceError for a trace that cannot be used; std::runtime_error when
/// the job cannot be started or makes no progress.
int replay(const ReplayOptions& o, std::ostream& out);

}  // namespace kf::chaos
