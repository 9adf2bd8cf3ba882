// SPDX-License-Identifier: Apache-2.0
// The config service's durable state: the cluster document and the append-only audit trail of
// events, kept in two files. FILE is a snapshot: written whole to a fresh temporary
// (kf/runtime/atomic_file.hpp), fsynced, renamed over FILE, the directory fsynced, so that a
// crash leaves either the old or the new one. FILE.log holds the records since: one JSON line
// per event ({"event": {...}} plus "cluster" when the event changed the document), appended and
// fsynced before the change is answered. A change thus costs one short append, not a rewrite of
// the whole history; every kSnapshotEvery records the service writes a new snapshot and empties
// the log. Thread-safety: value types and free functions; the files must have one writer at a
// time.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"

namespace kf::config_server {

struct State {
  Cluster cluster;                     ///< version 0 and no workers until the first PUT
  std::vector<nlohmann::json> events;  ///< each {"seq", "time", "type", ...}, seq increasing
  std::uint64_t next_seq = 1;
  /// The first positive `lr` the cluster document's settings had (the learning rate the job
  /// started with): the base of kf_config_learning_rate_scale. Kept in the snapshot; a state
  /// written without it takes the current document's when loaded.
  std::optional<double> base_lr;
  std::size_t logged = 0;  ///< records load_state read from FILE.log (not in to_json)
  bool torn = false;       ///< FILE.log ended in a record cut short (not in to_json)

  nlohmann::json to_json() const;
  /// Throws: std::invalid_argument naming the first field that is wrong.
  static State from_json(const nlohmann::json& j);
  /// Sets base_lr from the cluster's settings when it is not set yet.
  void note_base_lr();
};

/// Records appended to FILE.log between snapshots.
inline constexpr std::size_t kSnapshotEvery = 1000;

/// FILE.log, the log beside the snapshot `file`.
std::filesystem::path log_file(const std::filesystem::path& file);

/// Reads the snapshot (absent: the initial State) and then the log's records after it: records
/// the snapshot holds already are skipped (a crash between a snapshot and emptying the log), a
/// last line cut short by a crash is ignored. Throws: std::runtime_error "state file F: ..."
/// (F the snapshot or the log) when either cannot be read or is corrupt, a record missing
/// included.
State load_state(const std::filesystem::path& file);

/// Writes `state` as the snapshot `file`, atomically and durably (see above), then empties the
/// log (failing that is only a warning: its records are in the snapshot now).
/// Throws: std::runtime_error "state file F: <problem>" naming the step that failed.
void save_state(const std::filesystem::path& file, const State& state);

/// Appends the record of `event` (stamped, its seq the state's next_seq), with `cluster` when
/// given, to FILE.log and fsyncs it (and the directory, when it made the log). On failure the
/// log is cut back to where it was. Throws: std::runtime_error "state file F.log: <problem>".
void append_record(const std::filesystem::path& file, const nlohmann::json& event,
                   const Cluster* cluster);

/// "2025-01-31T09:15:02.137Z": RFC 3339, UTC, milliseconds.
std::string format_rfc3339_ms(std::chrono::system_clock::time_point t);

}  // namespace kf::config_server
