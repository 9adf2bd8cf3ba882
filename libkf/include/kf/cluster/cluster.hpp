// SPDX-License-Identifier: Apache-2.0
// The cluster model: the versioned list of workers (a worker's rank is its index) plus the job's
// shared settings, as held by the config service and passed to workers in KF_CLUSTER.
// Thread-safety: a value type; distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kf {

/// Where a worker listens for its peers.
struct Endpoint {
  std::string host;
  std::uint16_t port = 0;

  std::string str() const { return host + ":" + std::to_string(port); }
  /// Parses "host:port"; an IPv6 host may be in brackets ("[::1]:4000" is host "::1", as str()
  /// prints it "::1:4000", which parses back the same). The host must pass kf::host_problem.
  /// Throws: std::invalid_argument naming what is wrong.
  static Endpoint parse(std::string_view s);
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

struct WorkerSpec {
  Endpoint endpoint;
  int slot = 0;  ///< local slot on its host (which of the agent's workers it is)
  friend bool operator==(const WorkerSpec&, const WorkerSpec&) = default;
};

struct Cluster {
  std::uint64_t version = 0;
  std::vector<WorkerSpec> workers;
  /// Hot spares (docs/elastic.md, "Hot spares"): workers started and connected but not members;
  /// they hold the latest commit that rank 0 sends them, and a loss or a notice moves one into
  /// `workers`. No endpoint is both a worker and a spare.
  std::vector<WorkerSpec> spares;
  std::vector<Endpoint> agents;
  nlohmann::json settings = nlohmann::json::object();

  int size() const noexcept { return static_cast<int>(workers.size()); }
  /// The rank of the worker listening at `self`, or nullopt when it is not a member.
  std::optional<int> rank_of(const Endpoint& self) const noexcept;
  /// Whether the worker listening at `self` is one of the spares.
  bool is_spare(const Endpoint& self) const noexcept;

  /// Checks the invariants every cluster must hold: no duplicate workers, ports in 1..65535,
  /// hosts that are host names or IP addresses without brackets (kf::host_problem), for workers
  /// and agents alike. Returns an empty string when valid, otherwise the reason.
  std::string validate() const;

  nlohmann::json to_json() const;
  /// Throws: std::invalid_argument naming the first field that is missing, of the wrong type,
  /// or unknown.
  static Cluster from_json(const nlohmann::json& j);
};

/// Moves up to `count` spares of `cluster` into its workers (appended, in the spares' order),
/// skipping spares on `avoid_hosts` (a host that is going away). Returns the promoted ones.
/// Whoever removes workers that did not mean to leave (a failure, a notice) calls it in the same
/// edit, so that the job keeps its size (docs/elastic.md, "Hot spares").
std::vector<WorkerSpec> promote_spares(Cluster& cluster, std::size_t count,
                                       const std::vector<std::string>& avoid_hosts = {});

}  // namespace kf
