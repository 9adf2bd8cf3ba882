// SPDX-License-Identifier: Apache-2.0
// A policy plugin for the Python tests: "batch-at-step" sets the global batch to `batch` after
// step `step` (parameters {"step": N, "batch": B}).
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "kf/policies/policy.hpp"

namespace {

class BatchAtStep : public kf::Policy {
 public:
  explicit BatchAtStep(const nlohmann::json& params) {
    if (!params.contains("step") || !params["step"].is_number_integer() ||
        !params.contains("batch") || !params["batch"].is_number_integer()) {
      throw std::invalid_argument("batch-at-step: needs integer parameters step and batch");
    }
    step_ = params["step"].get<std::int64_t>();
    batch_ = params["batch"].get<std::int64_t>();
  }
  std::string name() const override { return "batch-at-step"; }
  void after_step(kf::PolicyContext& ctx) override {
    if (ctx.step() == step_) ctx.set_batch_size(batch_, "step " + std::to_string(step_));
  }

 private:
  std::int64_t step_ = 0, batch_ = 0;
};

}  // namespace

KF_POLICY_PLUGIN(registry) {
  registry->add("batch-at-step",
                [](const nlohmann::json& params) { return std::make_unique<BatchAtStep>(params); });
}
