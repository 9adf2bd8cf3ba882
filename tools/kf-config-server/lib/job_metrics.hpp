// SPDX-License-Identifier: Apache-2.0
// The job's own series, served by the config service at GET /metrics (docs/monitoring.md,
// "The config service's series"): what only the service sees whole — every event by type,
// membership changes by kind (join, leave, fail, revoke, preempt), the cluster document's
// version and size, and the learning rate with its scale against the one the job started with.
// Workers cannot tell a revocation from a preemption, nor count a failure once; the service
// reads every event in order, so it can.
// Thread-safety: none; the service calls it from its I/O thread only.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "kf/cluster/cluster.hpp"

namespace kf::config_server {

/// The kinds of kf_config_membership_events_total, in the order the docs list them.
inline constexpr std::string_view kMembershipKinds[] = {"join", "leave", "fail", "revoke",
                                                        "preempt"};

class JobMetrics {
 public:
  /// Counts one event of the audit trail ({"type", "worker"?, "detail"?, ...}). Events must come
  /// in their order (seq): the kinds depend on what came before.
  ///  - join: "joined" (a worker joined the job: one of its first, or one added later);
  ///  - leave: "left" (a worker left at a boundary: revoked, preempted or resized away);
  ///  - fail: "failed", once per worker until it joins again (its agent and its peers may each
  ///    report one loss);
  ///  - revoke: "revoked" of a worker whose host is not under notice;
  ///  - preempt: "revoked" of a worker whose host is under notice: a "notice" or "draining"
  ///    event named the host ("host H: ...") and no worker on H joined since.
  void count(const nlohmann::json& event);

  /// The Prometheus text (format 0.0.4) of every series, with the gauges read from `cluster`,
  /// the job's first learning rate `base_lr` (nullopt: none known) and `agents` alive.
  std::string render(const Cluster& cluster, std::optional<double> base_lr,
                     std::size_t agents) const;

  /// The count of events of `type` so far (0 for a type never seen).
  std::uint64_t events(const std::string& type) const;
  /// The count of membership changes of `kind` (one of kMembershipKinds) so far.
  std::uint64_t membership(std::string_view kind) const;

 private:
  std::map<std::string, std::uint64_t> by_type_;
  std::map<std::string, std::uint64_t, std::less<>> by_kind_;
  std::set<std::string> failed_;   // workers counted as failed and not joined since
  std::set<std::string> noticed_;  // hosts under notice, no worker joined on them since
};

/// The host named by a host event's detail, "host H: text" (kfrun and kf-member write it so);
/// nullopt when the detail does not start so.
std::optional<std::string> host_of_detail(std::string_view detail);

/// The `lr` of `settings` when it is a positive finite number, else nullopt.
std::optional<double> learning_rate_of(const nlohmann::json& settings);

}  // namespace kf::config_server
