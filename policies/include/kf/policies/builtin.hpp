// SPDX-License-Identifier: Apache-2.0
// The built-in policies (docs/policies.md "Built-in policies"): every place that makes a job's
// policies from their names (the session for a job file, kf-policy-replay, the test workers) starts
// from a registry holding these, then loads the job's plugins on top. Each built-in lives in
// policies/src/builtin_<name>.cpp and reads its parameters from the job file's `params`, rejecting
// unknown or out-of-range ones.
// Thread-safety: register_builtin_policies mutates the registry it is given; call it before the
// registry is shared.
#pragma once

#include "kf/policies/policy.hpp"

namespace kf {

/// Registers every built-in policy by its job-file name: gns-batch-size, throughput-scaling,
/// algorithm-selection, optimus, hemingway.
/// Throws: std::invalid_argument when one of those names is already registered.
void register_builtin_policies(PolicyRegistry& registry);

}  // namespace kf
