// SPDX-License-Identifier: Apache-2.0
// adaptive-sync: moves a job between synchronous SGD and synchronous model averaging (sma), and
// changes the averaging period, from what the job measures (docs/policies.md, "adaptive-sync").
//
// In sync-sgd, with B the global batch and B_simple the gradient noise scale (gns.b_simple):
// once B > noise_ratio * B_simple at `patience` consecutive steps where the estimate is valid,
// the large batch buys little per sample, and the job switches to sma with `period`: each
// worker then steps on its own share, which makes more progress per sample.
// In sma, at each step that averaged the models (sma.averaged = 1), with D the models' relative
// divergence (sma.divergence, mean_r |w_r - w|^2 / |w|^2):
//   D > high: the models drift apart between averages: the period is halved, and below 2 the
//             job returns to sync-sgd;
//   D < low:  they hardly differ: the period is doubled, up to max_period.
// After a proposal, none for `cooldown` steps (the change takes a step boundary to arrive, and
// the next measurement must be of the new setting).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "adaptive-sync";
constexpr std::int64_t kMaxSteps = 1'000'000'000;

struct Options {
  std::int64_t period = 4;
  std::int64_t max_period = 32;
  double noise_ratio = 1.0;
  std::int64_t patience = 10;
  double high = 1e-3;
  double low = 1e-5;
  std::int64_t cooldown = 50;
};

class AdaptiveSync final : public Policy {
 public:
  explicit AdaptiveSync(Options o) : o_(o) {}
  std::string name() const override { return kName; }

  void after_step(PolicyContext& c) override {
    if (c.step() < quiet_until_) return;
    ModeSpec mode;
    if (c.settings().contains("mode") && c.settings()["mode"].is_string()) {
      try {
        mode = parse_mode(c.settings()["mode"].get<std::string>());
      } catch (const std::invalid_argument&) {
        return;  // a bad setting is the config service's to refuse; nothing to adapt from
      }
    }
    if (mode.mode == TrainingMode::sync_sgd) {
      sync_step(c);
    } else if (mode.mode == TrainingMode::sma) {
      sma_step(c, mode);
    }
  }

 private:
  void sync_step(PolicyContext& c) {
    if (c.metric("gns.valid") < 1 || !c.has_metric("gns.b_simple") ||
        !c.settings().contains("batch_size") || !c.settings()["batch_size"].is_number()) {
      return;
    }
    const double batch = c.settings()["batch_size"].get<double>();
    const double b_simple = c.metric("gns.b_simple");
    if (b_simple > 0 && batch > o_.noise_ratio * b_simple) {
      if (++above_ < o_.patience) return;
      propose(c, "sma:period=" + std::to_string(o_.period),
              "global batch " + std::to_string(static_cast<long long>(batch)) +
                  " > noise_ratio x noise scale " + std::to_string(b_simple));
    } else {
      above_ = 0;
    }
  }

  void sma_step(PolicyContext& c, const ModeSpec& mode) {
    if (c.metric("sma.averaged") < 1) return;
    const double d = c.metric("sma.divergence");
    if (d > o_.high) {
      const int half = mode.period / 2;
      propose(c, half < 2 ? "sync-sgd" : with_period(mode, half),
              "divergence " + std::to_string(d) + " > high");
    } else if (d < o_.low && mode.period < o_.max_period) {
      const auto doubled = std::min<std::int64_t>(o_.max_period, std::int64_t{mode.period} * 2);
      propose(c, with_period(mode, static_cast<int>(doubled)),
              "divergence " + std::to_string(d) + " < low");
    }
  }

  static std::string with_period(ModeSpec mode, int period) {
    mode.period = period;
    return mode.str();
  }

  void propose(PolicyContext& c, const std::string& mode, const std::string& why) {
    c.set_mode(mode, why);
    above_ = 0;
    quiet_until_ = c.step() + o_.cooldown;
  }

  Options o_;
  std::int64_t above_ = 0;        // consecutive valid steps with B > noise_ratio x B_simple
  std::int64_t quiet_until_ = 0;  // no proposal before this step
};

}  // namespace

std::unique_ptr<Policy> make_adaptive_sync_policy(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.period = r.integer("period", o.period, 2, 1'000'000);
  o.max_period = r.integer("max_period", o.max_period, 2, 1'000'000);
  o.noise_ratio = r.number("noise_ratio", o.noise_ratio, {0.0, 1e9, true, false});
  o.patience = r.integer("patience", o.patience, 1, kMaxSteps);
  o.high = r.number("high", o.high, {0.0, 1e9, true, false});
  o.low = r.number("low", o.low, {0.0, 1e9, false, false});
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  r.reject_unknown();
  if (o.period > o.max_period) r.fail("period", "must not exceed max_period");
  if (o.low >= o.high) r.fail("low", "must be below high");
  return std::make_unique<AdaptiveSync>(o);
}

}  // namespace kf::detail
