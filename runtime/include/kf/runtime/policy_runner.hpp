// SPDX-License-Identifier: Apache-2.0
// kf::PolicyRunner: runs the job's policies at each hook with the same inputs on every worker,
// merges their proposals (a later policy's field replaces an earlier one's), disables a policy
// that throws (logged; the job goes on), and can record every run as a JSON line so that
// kf-policy-replay can run the policies again offline. Thread-safety: the training thread only.
#pragma once

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kf/policies/policy.hpp"

namespace kf {

enum class PolicyHook { before_train, before_epoch, after_step, after_epoch, on_membership_change };
const char* to_string(PolicyHook h) noexcept;
/// Throws: std::invalid_argument naming the string.
PolicyHook parse_policy_hook(const std::string& s);

class PolicyRunner {
 public:
  PolicyRunner() = default;
  void add(std::unique_ptr<Policy> policy);
  bool empty() const noexcept { return policies_.empty(); }

  /// Runs `hook` of every enabled policy. Returns the merged proposal (possibly empty).
  Proposal run(PolicyHook hook, const PolicyInputs& inputs);

  /// Appends {"hook", "inputs", "proposal"} for every run from now on to `path` (JSON lines).
  /// Throws: std::runtime_error naming the file when it cannot be opened.
  void record_to(const std::string& path);

  /// Names of the policies disabled because they threw, with the reason.
  const std::vector<std::string>& disabled() const noexcept { return disabled_; }

 private:
  struct Entry {
    std::unique_ptr<Policy> policy;
    bool enabled = true;
  };
  std::vector<Entry> policies_;
  std::vector<std::string> disabled_;
  std::optional<std::ofstream> record_;
  std::string record_path_;
};

}  // namespace kf
