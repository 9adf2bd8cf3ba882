// SPDX-License-Identifier: Apache-2.0
// Autoscale's decision (docs/autoscale.md): given the cluster, the slots the live agents offer
// and the job's `autoscale` setting, which workers to place and which to give up. A pure
// function, so that every rule is tested without processes; the Autoscaler (autoscaler.hpp)
// runs it in the agents and writes what it decides.
// Thread-safety: free functions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::tools {

/// Ports for `count` new workers on `host`, none of them in `taken` (pick_ports_for, or a fake
/// in tests).
using PortChooser = std::function<std::vector<std::uint16_t>(
    const std::string& host, int count, const std::vector<std::uint16_t>& taken)>;

struct AutoscalePlan {
  Cluster next;                      ///< the current cluster with the workers (or spares) changed
  std::vector<WorkerSpec> placed;    ///< appended to the workers (or spares)
  std::vector<WorkerSpec> released;  ///< removed (they leave at their next boundary)
  std::string cause;                 ///< why, for the events and the log
};

/// The workers the job should have, with `offers` from the live agents less those on `avoid`
/// (hosts that just lost workers, whose agents may be gone with them):
///  - each offered host holds at most cap = min(its slots, per_host) workers; those above the
///    cap are released, the newest first;
///  - the count wanted is the target (or every slot offered plus the workers on hosts that offer
///    none), kept within [min, max] and within what can be placed;
///  - more: new workers go to the offered hosts that already run workers of the job first, then
///    to the others, by host, each on the lowest slot number below the host's slots not in use;
///  - fewer: the newest workers are released.
/// Workers on hosts that offer nothing are never moved or released by this rule (their agent
/// may be restarting); they count toward the total. Slots that hold hot spares are not offered
/// to workers. Returns nullopt when nothing changes.
std::optional<AutoscalePlan> plan_autoscale(const Cluster& current,
                                            const std::vector<AgentOffer>& offers,
                                            const AutoscaleSettings& settings,
                                            const std::set<std::string>& avoid,
                                            const PortChooser& ports);

/// The hot spares the job should have (docs/elastic.md, "Hot spares"): `want` of them
/// (settings "spares"), on the slots of `offers` (less `avoid`) that hold neither a worker nor
/// a spare:
///  - more: each new spare goes to the host with the fewest workers of the job (a machine that
///    goes away takes its spares with it), by host within a count, on the lowest free slot;
///  - fewer: the newest spares are released.
/// Spares on hosts that offer nothing stay. `short_by` (when given) is set to how many spares
/// found no free slot. Returns nullopt when nothing changes.
std::optional<AutoscalePlan> plan_spares(const Cluster& current,
                                         const std::vector<AgentOffer>& offers, std::int64_t want,
                                         const std::set<std::string>& avoid,
                                         const PortChooser& ports,
                                         std::int64_t* short_by = nullptr);

}  // namespace kf::tools
