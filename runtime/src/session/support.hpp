// SPDX-License-Identifier: Apache-2.0
// Small helpers shared by the units of kf::Session (session.cpp, step_boundary.cpp,
// membership.cpp, ...). Thread-safety: free functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "kf/cluster/cluster.hpp"
#include "kf/common/error.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/training_mode.hpp"

namespace kf::detail {

/// Wall-clock microseconds since the Unix epoch (comparable across processes on one host).
inline std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Failures a session recovers from: a peer lost or silent, or a peer that moved to another
/// cluster version (so this worker's collectives of the old one cannot finish).
inline bool is_peer_failure(const std::error_code& ec) {
  return ec == errcond::peer_failure || ec == errc::stale_version || ec == errc::closed;
}

/// Whether the workers' models may differ under the mode of these settings (then every change
/// of the cluster or of the mode makes them one again: docs/training-modes.md, "Switching").
inline bool modes_diverge(const nlohmann::json& settings) {
  const auto typed = parse_cluster_settings(settings).typed;
  return typed.mode && models_may_diverge(*typed.mode);
}

inline bool contains(const Cluster& c, const Endpoint& ep) { return c.rank_of(ep).has_value(); }

inline std::string join_endpoints(const std::vector<Endpoint>& eps) {
  std::string s;
  for (const auto& e : eps) s += (s.empty() ? "" : ", ") + e.str();
  return s;
}

}  // namespace kf::detail
