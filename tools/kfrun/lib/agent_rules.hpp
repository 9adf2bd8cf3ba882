// SPDX-License-Identifier: Apache-2.0
// The pure rules of kfrun's watch mode (the per-host agent of an elastic job, agent.hpp): which
// workers of a cluster document a host owns, the initial cluster, how a worker left the cluster
// (killed, revoked with notice, removed) as the config service's events tell it, and the default
// job id. No I/O; the agent and its service link apply them. Thread-safety: free functions and
// value types.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::tools {

/// The ranks of the workers of `cluster` on `host` (the ones that host's agent starts), in rank
/// order.
std::vector<int> owned_ranks(const Cluster& cluster, const std::string& host);

/// The cluster an agent proposes when the service holds none: `ports.size()` workers on `host`,
/// slots 0..K-1, settings {"algorithm": A} when given, and version 0 (the version it replaces).
Cluster initial_cluster(const std::string& host, const std::vector<std::uint16_t>& ports,
                        const std::optional<std::string>& algorithm);

/// Whether the job is marked finished: settings {"finished": true}, which kf::Session::finish()
/// writes after the last step. Agents start no more workers then.
bool marked_finished(const Cluster& cluster);

/// Whether the job is suspended: settings {"suspended": true}, which an agent writes when a
/// notice reaches every worker of the job (docs/elastic.md, "Suspend and resume").
bool marked_suspended(const Cluster& cluster);

/// `current` suspended: the same workers (the job keeps at least one), settings "suspended".
Cluster suspended_cluster(Cluster current);

/// The suspended `current` resumed by the agent of `host`: its workers at `ports` (local ranks in
/// order) replace those of the suspension, no spares, "suspended" dropped; the version stays
/// (the write is a compare-and-swap on it). The workers form the job anew and load its checkpoint.
Cluster resumed_cluster(Cluster current, const std::string& host,
                        const std::vector<std::uint16_t>& ports);

/// The hot spares of `cluster` on `host` (its agent starts them too; docs/elastic.md).
std::vector<WorkerSpec> owned_spares(const Cluster& cluster, const std::string& host);

/// Whether `worker` ("host:port") is in `cluster`: a worker or a hot spare (either runs, and its
/// agent keeps it running while it is listed).
bool is_member(const Cluster& cluster, const std::string& worker);

/// `cluster` without `worker`, as a worker or a spare (unchanged when it is not there).
Cluster without_worker(Cluster cluster, const std::string& worker);

/// How a worker left the cluster document.
struct Departure {
  enum class Kind {
    killed,   ///< `killed` event (kf-member kill): no notice, SIGKILL at once
    revoked,  ///< `revoked` event (kf-member revoke): finish the step and exit
    removed,  ///< `removed` or `released` event (kf-member resize, a policy, an agent, autoscale)
    unknown,  ///< no event names it (the document was edited directly)
  };
  Kind kind = Kind::unknown;
  /// The notice of a revoke whose detail says "notice Ns".
  std::optional<std::chrono::seconds> notice;
};

/// "killed", "revoked", "removed" or "unknown".
const char* to_string(Departure::Kind kind) noexcept;

/// The notice in an event detail such as "kf-member revoke, notice 30s": the number before "s"
/// after the last "notice ". nullopt when there is none ("..., no notice").
std::optional<std::chrono::seconds> parse_notice(std::string_view detail);

/// Whether `type` is an event type that explains a departure (killed, revoked, removed,
/// released).
bool is_departure_event(const std::string& type) noexcept;

/// The newest departure event naming `worker` among `events` whose cluster version is greater
/// than `after_version` (the last version in which the agent saw the worker as a member; events
/// without a version count too). nullopt when there is none yet.
std::optional<Departure> find_departure(const std::vector<ConfigEvent>& events,
                                        const std::string& worker, std::uint64_t after_version);

/// How long a worker that left the cluster may keep running before it gets SIGTERM: the notice
/// of its revoke, else `leave_grace`; zero for a killed worker.
std::chrono::milliseconds grace_for(const Departure& departure,
                                    std::chrono::milliseconds leave_grace);

/// The job id agents use when none is given: "kf-" and 16 hex digits of a SHA-256 of the job
/// token, so that every agent of a job (they share the token) gives its workers the same id
/// without talking to each other, and the id does not reveal the token. Throws:
/// std::runtime_error when OpenSSL fails.
std::string job_id_for_token(const std::string& token);

}  // namespace kf::tools
