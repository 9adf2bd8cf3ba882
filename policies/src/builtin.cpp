// SPDX-License-Identifier: Apache-2.0
#include "kf/policies/builtin.hpp"

#include "builtin_factories.hpp"

namespace kf {

void register_builtin_policies(PolicyRegistry& registry) {
  registry.add("gns-batch-size", detail::make_gns_batch_size_policy);
  registry.add("throughput-scaling", detail::make_throughput_scaling_policy);
  registry.add("algorithm-selection", detail::make_algorithm_selection_policy);
  registry.add("optimus", detail::make_optimus_policy);
  registry.add("hemingway", detail::make_hemingway_policy);
  registry.add("adaptive-sync", detail::make_adaptive_sync_policy);
  registry.add("compression-by-bandwidth", detail::make_compression_by_bandwidth_policy);
  registry.add("stragglers", detail::make_stragglers_policy);
}

}  // namespace kf
