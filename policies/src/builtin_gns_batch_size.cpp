// SPDX-License-Identifier: Apache-2.0
// gns-batch-size: grows (or shrinks) the global batch with the gradient noise scale and sets the
// learning rate for the new batch in the same proposal.
//
// The target batch is the largest M whose Pollux statistical efficiency
//   E(M) = (φ + M0)/(φ + M),  φ = B_simple
// is still at least min_efficiency e:
//   M* = M0 + (1/e − 1)·(φ + M0)
// With the default e = 0.5 this is M* = φ + 2·M0: about B_simple once the noise scale is well above
// M0, which is McCandlish et al.'s critical batch (the balance of steps and examples).
// Noise-dominated gradients (φ = +∞) give E = 1 for every M, so M* is max_batch. M* is then clamped
// to [min_batch, max_batch] and rounded down to a multiple of multiple_of (up when that falls below
// min_batch).
//
// The learning rate for M* is η0 × factor(S), S = M*/M0, from the rule: linear S,
// sqrt √S, adascale r(S), adamscale √r(S), none (no LR change). The gain comes from the same φ:
// r(S) = S·E(M*) (the gain is S times the efficiency), so r = S when noise-dominated.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"
#include "kf/monitor/gns.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "gns-batch-size";
constexpr std::int64_t kMaxInt = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kMaxSteps = 1'000'000'000;
/// max_batch when the job file gives none: this many times the base batch.
constexpr std::int64_t kDefaultMaxScale = 32;

enum class LrRule { linear, sqrt, adascale, adamscale, none };

struct Options {
  std::int64_t every = 100;
  double min_efficiency = 0.5;
  LrRule lr_rule = LrRule::adascale;
  std::string lr_rule_name = "adascale";
  std::optional<std::int64_t> base_batch;
  std::optional<double> base_lr;
  std::optional<std::int64_t> min_batch;
  std::optional<std::int64_t> max_batch;
  std::int64_t multiple_of = 1;
  double margin = 0.1;
  std::int64_t patience = 3;
  std::int64_t cooldown = 500;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.every = r.integer("every", o.every, 1, kMaxSteps);
  o.min_efficiency = r.number("min_efficiency", o.min_efficiency, {0.0, 1.0, true, false});
  o.lr_rule_name =
      r.choice("lr_rule", o.lr_rule_name, {"linear", "sqrt", "adascale", "adamscale", "none"});
  o.lr_rule = o.lr_rule_name == "linear"      ? LrRule::linear
              : o.lr_rule_name == "sqrt"      ? LrRule::sqrt
              : o.lr_rule_name == "adascale"  ? LrRule::adascale
              : o.lr_rule_name == "adamscale" ? LrRule::adamscale
                                              : LrRule::none;
  o.base_batch = r.optional_integer("base_batch", 1, kMaxInt);
  o.base_lr = r.optional_number("base_lr", {0.0, 1e6, true, false});
  o.min_batch = r.optional_integer("min_batch", 1, kMaxInt);
  o.max_batch = r.optional_integer("max_batch", 1, kMaxInt);
  o.multiple_of = r.integer("multiple_of", o.multiple_of, 1, kMaxInt);
  o.margin = r.number("margin", o.margin, {0.0, 10.0, false, false});
  o.patience = r.integer("patience", o.patience, 1, 1'000'000);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  r.reject_unknown();
  r.require_ordered("min_batch", o.min_batch, "max_batch", o.max_batch);
  return o;
}

double lr_factor(LrRule rule, double scale, double gain) {
  switch (rule) {
    case LrRule::linear: return monitor::lr_factor(monitor::LrScaling::linear, scale, gain);
    case LrRule::sqrt: return monitor::lr_factor(monitor::LrScaling::square_root, scale, gain);
    case LrRule::adascale: return monitor::lr_factor(monitor::LrScaling::adascale, scale, gain);
    case LrRule::adamscale: return monitor::lr_factor(monitor::LrScaling::adamscale, scale, gain);
    case LrRule::none: break;
  }
  return 1.0;
}

class GnsBatchSize final : public Policy {
 public:
  explicit GnsBatchSize(Options o) : o_(std::move(o)) {}

  std::string name() const override { return kName; }

  void before_train(PolicyContext& ctx) override { resolve_base(ctx); }

  void after_step(PolicyContext& ctx) override {
    resolve_base(ctx);
    if (ctx.step() % o_.every != 0 || ctx.step() < quiet_until_) return;
    const std::optional<double> phi = noise_scale(ctx);
    if (!phi) {
      streak_ = 0;  // the validity gate: no decision, and the streak starts over
      return;
    }
    const std::int64_t current = current_batch(ctx);
    const std::int64_t target = target_batch(*phi);
    const double change = static_cast<double>(target - current) / static_cast<double>(current);
    if (std::fabs(change) <= o_.margin) {
      streak_ = 0;
      return;
    }
    const int direction = target > current ? 1 : -1;
    streak_ = direction == direction_ ? streak_ + 1 : 1;
    direction_ = direction;
    if (streak_ < o_.patience) return;
    propose(ctx, *phi, current, target, change);
  }

 private:
  // M0 and η0: the parameters, else the settings when first seen (before_train normally).
  void resolve_base(const PolicyContext& ctx) {
    if (base_batch_ > 0) return;
    const std::int64_t m0 = o_.base_batch ? *o_.base_batch : current_batch(ctx);
    double lr0 = 0.0;
    if (o_.lr_rule != LrRule::none) {
      if (o_.base_lr) {
        lr0 = *o_.base_lr;
      } else {
        const auto& s = ctx.settings();
        if (!s.contains("lr") || !s["lr"].is_number() || !(s["lr"].get<double>() > 0.0)) {
          throw std::runtime_error(std::string(kName) + ": the settings have no positive 'lr' " +
                                   "and no base_lr parameter is given (lr_rule " + o_.lr_rule_name +
                                   " scales it)");
        }
        lr0 = s["lr"].get<double>();
      }
    }
    min_batch_ = o_.min_batch.value_or(m0);
    max_batch_ = o_.max_batch.value_or(std::max(min_batch_, kDefaultMaxScale * m0));
    if (min_batch_ > max_batch_) {
      throw std::runtime_error(std::string(kName) + ": min_batch " + std::to_string(min_batch_) +
                               " exceeds max_batch " + std::to_string(max_batch_));
    }
    const std::int64_t q = o_.multiple_of;
    if ((min_batch_ + q - 1) / q * q > max_batch_) {
      throw std::runtime_error(std::string(kName) + ": no multiple of " + std::to_string(q) +
                               " lies in [" + std::to_string(min_batch_) + ", " +
                               std::to_string(max_batch_) + "]");
    }
    base_batch_ = m0;
    base_lr_ = lr0;
  }

  static std::int64_t current_batch(const PolicyContext& ctx) {
    const auto& s = ctx.settings();
    if (!s.contains("batch_size") || !s["batch_size"].is_number_integer() ||
        s["batch_size"].get<std::int64_t>() < 1) {
      throw std::runtime_error(std::string(kName) +
                               ": the settings have no positive integer 'batch_size'");
    }
    return s["batch_size"].get<std::int64_t>();
  }

  // φ = B_simple when the estimate is valid; +∞ when noise-dominated; nullopt otherwise.
  static std::optional<double> noise_scale(const PolicyContext& ctx) {
    if (ctx.metric("gns.valid") != 1.0) return std::nullopt;
    if (ctx.metric("gns.noise_dominated") == 1.0) return std::numeric_limits<double>::infinity();
    if (!ctx.has_metric("gns.b_simple")) return std::nullopt;
    const double phi = ctx.metric("gns.b_simple");
    if (!std::isfinite(phi) || phi < 0.0) return std::nullopt;
    return phi;
  }

  std::int64_t target_batch(double phi) const {
    const auto lo = static_cast<double>(min_batch_);
    const auto hi = static_cast<double>(max_batch_);
    double m = hi;
    if (std::isfinite(phi)) {
      const auto m0 = static_cast<double>(base_batch_);
      m = std::clamp(m0 + (1.0 / o_.min_efficiency - 1.0) * (phi + m0), lo, hi);
    }
    const std::int64_t q = o_.multiple_of;
    std::int64_t t = static_cast<std::int64_t>(std::floor(m)) / q * q;
    if (t < min_batch_) t = (min_batch_ + q - 1) / q * q;
    return t;
  }

  void propose(PolicyContext& ctx, double phi, std::int64_t current, std::int64_t target,
               double change) {
    const auto m0 = static_cast<double>(base_batch_);
    const double eff = monitor::efficiency(phi, m0, static_cast<double>(target));
    std::string why =
        "B_simple=" + (std::isfinite(phi) ? short_number(phi) : "inf (noise-dominated)") +
        ", M0=" + std::to_string(base_batch_) + ": target " + std::to_string(target) +
        " (E=" + short_number(eff) + ", min_efficiency " + short_number(o_.min_efficiency) +
        ", bounds [" + std::to_string(min_batch_) + ", " + std::to_string(max_batch_) +
        "], multiple of " + std::to_string(o_.multiple_of) + ") is " + (change > 0 ? "+" : "") +
        short_number(100.0 * change) + "% from " + std::to_string(current) + " for " +
        std::to_string(streak_) + " evaluations";
    ctx.set_batch_size(target, why);
    if (o_.lr_rule != LrRule::none) {
      const double scale = static_cast<double>(target) / m0;
      const double gain = scale * eff;  // r(S) = S·E(M)
      const double factor = lr_factor(o_.lr_rule, scale, gain);
      ctx.set_learning_rate(base_lr_ * factor, o_.lr_rule_name + ": S=" + short_number(scale) +
                                                   ", r(S)=" + short_number(gain) +
                                                   ", lr=" + short_number(base_lr_) + " x " +
                                                   short_number(factor));
    }
    quiet_until_ = ctx.step() + o_.cooldown;
    streak_ = 0;
    direction_ = 0;
  }

  Options o_;
  std::int64_t base_batch_ = 0;  // M0; 0 until resolved
  double base_lr_ = 0.0;         // η0
  std::int64_t min_batch_ = 0;
  std::int64_t max_batch_ = 0;
  std::int64_t quiet_until_ = 0;  // no evaluation before this step (the cool-down)
  std::int64_t streak_ = 0;       // consecutive evaluations beyond the margin, same direction
  int direction_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_gns_batch_size_policy(const nlohmann::json& params) {
  return std::make_unique<GnsBatchSize>(read_options(params));
}

}  // namespace kf::detail
