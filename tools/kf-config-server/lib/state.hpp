// SPDX-License-Identifier: Apache-2.0
// The config service's durable state: the cluster document and the append-only audit trail of
// events, and the state file that holds both. A save writes a fresh temporary
// (kf/runtime/atomic_file.hpp), fsyncs it, renames it over FILE and fsyncs the directory, so that a
// crash leaves either the old or the new state. Thread-safety: value types and free functions; a
// file must have one writer at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"

namespace kf::config_server {

struct State {
  Cluster cluster;                     ///< version 0 and no workers until the first PUT
  std::vector<nlohmann::json> events;  ///< each {"seq", "time", "type", ...}, seq increasing
  std::uint64_t next_seq = 1;

  nlohmann::json to_json() const;
  /// Throws: std::invalid_argument naming the first field that is wrong.
  static State from_json(const nlohmann::json& j);
};

/// Reads the state file; a file that does not exist gives the initial State.
/// Throws: std::runtime_error "state file F: <problem>" when it cannot be read or is corrupt.
State load_state(const std::filesystem::path& file);

/// Writes `state` to `file` atomically and durably (see above).
/// Throws: std::runtime_error "state file F: <problem>" naming the step that failed.
void save_state(const std::filesystem::path& file, const State& state);

/// "2025-01-31T09:15:02.137Z": RFC 3339, UTC, milliseconds.
std::string format_rfc3339_ms(std::chrono::system_clock::time_point t);

}  // namespace kf::config_server
