// SPDX-License-Identifier: Apache-2.0
// The commands of kf-member: read the cluster document from the config service, edit it and write
// it back by compare-and-swap (re-reading and re-applying the edit after a conflict), then record
// what happened in the service's event log. Output goes to a stream so tests can read it.
// Thread-safety: free functions; a CommandContext is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/ports.hpp"

namespace kf::member {

/// A WORKER argument that names no member of the cluster (exit code 1).
class UnknownWorker : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommandContext {
  ConfigClient& client;
  std::ostream& out;
  int max_attempts = 20;  ///< compare-and-swap attempts before giving up
};

/// An event to record after a change (its version is the stored one).
struct PendingEvent {
  std::string type;
  std::string worker;
  std::string detail;
};

/// What an edit did: `summary` is empty when it changed nothing.
struct Edit {
  std::string summary;
  std::vector<PendingEvent> events;
};

/// Edits a copy of the current cluster in place. Called again after each conflict.
using Mutator = std::function<Edit(Cluster&)>;

/// Applies `mutate` by compare-and-swap: read, edit, PUT; on a 409 re-applies the edit to the
/// current document from the answer, up to ctx.max_attempts times with a short random back-off.
/// Prints "vA -> vB: SUMMARY" (or "vA: no change", and "vA: conflict, vC is current; re-applying"
/// for each conflict) and posts the edit's events; an event that cannot be posted after the
/// change was stored (the service is gone with the job the change ended) is a printed note, not an
/// error. Returns the stored cluster. Throws: kf::Error
/// (errc::conflict when out of attempts; see ConfigClient), UnknownWorker or std::invalid_argument
/// from `mutate`.
Cluster mutate(CommandContext& ctx, const Mutator& mutate);

/// Checks `cluster` against the job's bounds, settings "min_workers" and "max_workers" (integers;
/// absent: no bound). Throws: std::runtime_error naming the bound, e.g. "5 workers would exceed
/// settings.max_workers = 4"; std::invalid_argument when a bound is not a positive integer.
/// add, revoke and resize check it; kill does not (a failure drill may go below the minimum).
void check_bounds(const Cluster& cluster);

/// The rank of WORKER, given as a rank ("0") or "host:port". Throws: UnknownWorker.
int find_worker(const Cluster& cluster, std::string_view spec);

/// Reads KEY=VALUE assignments of cluster settings: VALUE is JSON when it parses as a number,
/// true, false or a quoted string, and text otherwise ("mode=sma:period=4", "lr=0.05"). Each
/// key must be one kf reads (docs/configuration.md, "Cluster settings") with a valid value.
/// Throws: std::invalid_argument naming the assignment and what was wrong.
nlohmann::json parse_assignments(const std::vector<std::string>& assignments);

/// Sets the settings `values` by compare-and-swap and records a "note" event naming them; a
/// policy's or another writer's change in between is kept. Prints as mutate() does.
void set_settings(CommandContext& ctx, const nlohmann::json& values);

/// "version V: N workers" then one line per worker "RANK HOST:PORT slot S".
std::string format_cluster(const Cluster& cluster);

struct AddOptions {
  std::string host = "127.0.0.1";
  int count_workers = 1;
  tools::PortRange ports;  ///< where the workers' ports are picked from
};

/// Appends `options.count_workers` workers on `options.host` with ports not already in the
/// cluster, slots continuing after the host's highest slot. On this machine the ports are
/// test-bound free ones; for another host they are drawn from the range unchecked, and that
/// host's agent moves a worker whose port is in use there (tools::pick_ports_for). Returns the
/// added workers; `*ports_checked` (when given) says which. Throws: std::invalid_argument when
/// the host does not resolve or the range is exhausted.
std::vector<WorkerSpec> add_workers(Cluster& cluster, const AddOptions& options,
                                    bool* ports_checked = nullptr);

void list(CommandContext& ctx);
void add(CommandContext& ctx, const AddOptions& options);
/// Removes WORKER with a `revoked` event whose detail records the notice.
void revoke(CommandContext& ctx, const std::string& worker, std::optional<int> notice_seconds);
/// A notice that `target` goes away in `in_seconds`. A host with workers of the job: all of them
/// are revoked in one change, with a `notice` event for the host (its agent then starts nothing
/// more and ends once they left) and a `revoked` event with the notice for each. Otherwise a
/// worker (rank or host:port), revoked with the notice. The job's bounds are not checked (the
/// machine goes anyway). Throws: UnknownWorker when `target` is neither; std::runtime_error when
/// nothing of the job would be left.
void notice(CommandContext& ctx, const std::string& target, int in_seconds);
/// Removes WORKER with a `killed` event.
void kill(CommandContext& ctx, const std::string& worker);
/// Adds (with `options`) or removes workers at the end until there are `count_workers`.
void resize(CommandContext& ctx, int count_workers, const AddOptions& options);
/// Prints the current version, then each new version as it appears; stops after `count_changes`
/// changes (never when 0).
void watch(CommandContext& ctx, int count_changes);

/// The job's events and a sample of its steps as a Chrome trace (the JSON that Perfetto and
/// chrome://tracing open): one process "kf job" with three tracks, "membership" (each event of
/// the audit trail, an instant with its worker, detail and version), "changes" (each change's
/// phases, as spans ending at the change's event) and "steps" (a step from each of the job's
/// summaries, as a span of its step time). Times are microseconds since the epoch.
nlohmann::json make_trace(const std::vector<ConfigEvent>& events, const nlohmann::json& summaries);
/// kf-member trace: make_trace of what the service holds, to `out`.
void trace(CommandContext& ctx);

}  // namespace kf::member
