// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/policy_runner.hpp"

#include <stdexcept>

#include "kf/common/log.hpp"

namespace kf {

const char* to_string(PolicyHook h) noexcept {
  switch (h) {
    case PolicyHook::before_train: return "before_train";
    case PolicyHook::before_epoch: return "before_epoch";
    case PolicyHook::after_step: return "after_step";
    case PolicyHook::after_epoch: return "after_epoch";
    case PolicyHook::on_membership_change: return "on_membership_change";
  }
  return "?";
}

PolicyHook parse_policy_hook(const std::string& s) {
  for (auto h : {PolicyHook::before_train, PolicyHook::before_epoch, PolicyHook::after_step,
                 PolicyHook::after_epoch, PolicyHook::on_membership_change}) {
    if (s == to_string(h)) return h;
  }
  throw std::invalid_argument("unknown policy hook '" + s + "'");
}

void PolicyRunner::add(std::unique_ptr<Policy> policy) {
  if (!policy) throw std::invalid_argument("PolicyRunner::add: no policy");
  policies_.push_back(Entry{std::move(policy), true});
}

Proposal PolicyRunner::run(PolicyHook hook, const PolicyInputs& inputs) {
  Proposal merged;
  for (auto& e : policies_) {
    if (!e.enabled) continue;
    const std::string name = e.policy->name();
    PolicyContext ctx(inputs, name);
    try {
      switch (hook) {
        case PolicyHook::before_train: e.policy->before_train(ctx); break;
        case PolicyHook::before_epoch: e.policy->before_epoch(ctx); break;
        case PolicyHook::after_step: e.policy->after_step(ctx); break;
        case PolicyHook::after_epoch: e.policy->after_epoch(ctx); break;
        case PolicyHook::on_membership_change: e.policy->on_membership_change(ctx); break;
      }
    } catch (const std::exception& ex) {
      // Every worker runs the same policy on the same inputs, so every worker disables it at
      // the same step and their decisions stay the same.
      e.enabled = false;
      disabled_.push_back(name + ": " + ex.what());
      KF_LOG(err, "policy", "policy '{}' threw in {} at step {}: {}; it is disabled", name,
             to_string(hook), inputs.step, ex.what());
      continue;
    }
    merged.merge(ctx.proposal());
  }
  if (record_) {
    nlohmann::json line = {
        {"hook", to_string(hook)}, {"inputs", inputs.to_json()}, {"proposal", merged.to_json()}};
    *record_ << line.dump() << '\n';
    record_->flush();
    if (!*record_) throw std::runtime_error("cannot write policy record '" + record_path_ + "'");
  }
  return merged;
}

void PolicyRunner::record_to(const std::string& path) {
  std::ofstream out(path, std::ios::app);
  if (!out) throw std::runtime_error("cannot open policy record '" + path + "' for appending");
  record_.emplace(std::move(out));
  record_path_ = path;
}

}  // namespace kf
