// SPDX-License-Identifier: Apache-2.0
#include "kf/policies/builtin.hpp"

#include "builtin_factories.hpp"

namespace kf {

void register_builtin_policies(PolicyRegistry& registry) {
  registry.add("gns-batch-size", detail::make_gns_batch_size_policy);
}

}  // namespace kf
