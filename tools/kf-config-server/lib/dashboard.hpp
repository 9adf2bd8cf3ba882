// SPDX-License-Identifier: Apache-2.0
// The job's dashboard (docs/monitoring.md, "The dashboard"): one HTML page with its script,
// served at / by the config service. It reads what any reader of the service may (the cluster
// document by long-poll, the events, the agents, the job's summaries) and changes nothing.
// Thread-safety: a constant.
#pragma once

#include <string_view>

namespace kf::config_server {

/// The page: members, the timeline of cluster versions and their causes, and charts (when
/// /chart.js serves Chart.js) of samples/s, step time, the gradient noise scale, the batch and
/// the learning rate with the policies' decisions marked, and the phases of each change.
std::string_view dashboard_page() noexcept;

}  // namespace kf::config_server
