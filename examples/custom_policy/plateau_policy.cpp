// SPDX-License-Identifier: Apache-2.0
// A user policy in its own shared library, loaded by kf at start (docs/policies.md):
// "lr-plateau" halves the learning rate when the loss (the step metric "loss", averaged over the
// workers) has not improved by `min_delta` for `patience` steps, down to `min_lr`. Parameters:
// patience (100), min_delta (1e-4), min_lr (1e-5), lr (the starting rate, used while the
// cluster settings hold none; 0: wait for one there).
//
// Build against an installed kf:
//   c++ -std=c++20 -shared -fPIC plateau_policy.cpp -o libplateau_policy.so
//       $(pkg-config --cflags --libs kf)          (one command line)
// and name it in the job file:  plugins: [./libplateau_policy.so]
//                               policies: [{name: lr-plateau, params: {patience: 200}}]
#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include <kf/policies/policy.hpp>

namespace {

class LrPlateau : public kf::Policy {
 public:
  explicit LrPlateau(const nlohmann::json& params)
      : patience_(params.value("patience", 100)),
        min_delta_(params.value("min_delta", 1e-4)),
        min_lr_(params.value("min_lr", 1e-5)),
        lr_(params.value("lr", 0.0)) {
    for (const auto& [key, value] : params.items()) {
      if (key != "patience" && key != "min_delta" && key != "min_lr" && key != "lr") {
        throw std::invalid_argument("lr-plateau: unknown parameter '" + key + "'");
      }
    }
    if (patience_ < 1) throw std::invalid_argument("lr-plateau: patience must be >= 1");
    if (!(min_lr_ > 0)) throw std::invalid_argument("lr-plateau: min_lr must be > 0");
  }

  std::string name() const override { return "lr-plateau"; }

  // Every worker calls this with the same inputs, so every worker keeps the same state and
  // proposes the same change at the same step.
  void after_step(kf::PolicyContext& ctx) override {
    if (!ctx.has_metric("loss")) return;
    const double loss = ctx.metric("loss");
    if (loss < best_ - min_delta_) {
      best_ = loss;
      since_best_ = 0;
      return;
    }
    if (++since_best_ < patience_) return;
    since_best_ = 0;
    // The job's learning rate: the cluster settings' when a change was made or the job file set
    // it there, else the `lr` parameter (the program's starting rate).
    const double lr = ctx.settings().value("lr", lr_);
    if (lr <= min_lr_) return;
    ctx.set_learning_rate(std::max(lr / 2, min_lr_),
                          "loss has not improved for " + std::to_string(patience_) + " steps");
  }

 private:
  int patience_;
  double min_delta_;
  double min_lr_;
  double lr_;
  double best_ = std::numeric_limits<double>::infinity();
  int since_best_ = 0;
};

}  // namespace

KF_POLICY_PLUGIN(registry) {
  registry->add("lr-plateau",
                [](const nlohmann::json& params) { return std::make_unique<LrPlateau>(params); });
}
