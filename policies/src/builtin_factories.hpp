// SPDX-License-Identifier: Apache-2.0
// The factories of the built-in policies, one per policies/src/builtin_<name>.cpp, gathered by
// register_builtin_policies (builtin.cpp). Each reads its JSON params and throws
// std::invalid_argument naming a bad or unknown parameter (see builtin_params.hpp).
// Thread-safety: the factories are pure functions of their params.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "kf/policies/policy.hpp"

namespace kf::detail {

std::unique_ptr<Policy> make_gns_batch_size_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_throughput_scaling_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_algorithm_selection_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_optimus_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_hemingway_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_adaptive_sync_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_compression_by_bandwidth_policy(const nlohmann::json& params);
std::unique_ptr<Policy> make_stragglers_policy(const nlohmann::json& params);

}  // namespace kf::detail
