// SPDX-License-Identifier: Apache-2.0
// optimus: chooses the worker count by the marginal gain in remaining time, with Optimus's loss
// and speed models (adaptation-math.md §5.1, §5.2, §4.1 of Peng et al.; the control-loop rules of
// §8).
//
// Observations, every step:
// - the step time and samples per configuration (workers, batch_size), after warmup_steps
//   discarded steps at each change, kept across resizes (§8 rule 5);
// - the `loss` metric with the progress k = samples processed / epoch_samples (fractional
//   epochs, §5.1), averaged over each evaluation interval into one point weighted by its steps.
// Every `every` steps (outside the cool-down):
// 1. No `loss` reported yet: log it once and do nothing.
// 2. Fit the speed model t(w) = θ0·M/w + θ1 + θ3·w over the configurations with min_steps
//    steps. Until it fits (3 distinct configurations, full rank, residual ≤ max_residual) and
//    `explore` is on, propose the next unmeasured count `step` above (else below) the current one.
// 3. Fit the loss model to the points (at least min_loss_points, residual ≤ max_residual).
// 4. Remaining epochs to target_loss (or, without one or when it is out of reach, until the
//    per-epoch decrease falls below convergence_delta); Q = remaining epochs·epoch_samples/M
//    remaining steps.
// 5. w* = from min_workers, add a worker while it saves Q·(t(w) − t(w+1)) ≥ min_gain_seconds.
//    Growing needs a predicted saving of at least `margin` of the remaining time Q·t(w); giving
//    workers back needs nothing more (each saves less than min_gain_seconds). The proposal moves
//    at most `step` workers towards w*, within [min_workers, max_workers]; a cool-down of
//    `cooldown` steps follows every proposal.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "builtin_factories.hpp"
#include "builtin_model_support.hpp"
#include "builtin_params.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/optimus.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "optimus";
constexpr std::int64_t kMaxSteps = 1'000'000'000;
constexpr std::int64_t kMaxWorkers = 1'000'000;
constexpr std::size_t kMaxLossPoints = 400;
/// epoch_samples when the job file gives none: this many steps at the first batch size.
constexpr std::int64_t kDefaultEpochSteps = 100;

struct Options {
  std::int64_t every = 50;
  std::int64_t min_steps = 20;
  std::int64_t warmup_steps = 2;
  std::int64_t cooldown = 100;
  std::int64_t step = 2;
  double margin = 0.05;
  double min_gain_seconds = 60.0;
  double max_residual = 0.1;
  std::optional<double> target_loss;
  double convergence_delta = 1e-3;
  std::optional<std::int64_t> epoch_samples;
  std::int64_t min_loss_points = 5;
  bool explore = true;
  std::optional<std::int64_t> min_workers;
  std::optional<std::int64_t> max_workers;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.every = r.integer("every", o.every, 1, kMaxSteps);
  o.min_steps = r.integer("min_steps", o.min_steps, 1, kMaxSteps);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  o.step = r.integer("step", o.step, 1, kMaxWorkers);
  o.margin = r.number("margin", o.margin, {0.0, 1.0, false, true});
  o.min_gain_seconds = r.number("min_gain_seconds", o.min_gain_seconds, {0.0, 1e12, false, false});
  o.max_residual = r.number("max_residual", o.max_residual, {0.0, 10.0, true, false});
  o.target_loss = r.optional_number("target_loss", {-1e300, 1e300, false, false});
  o.convergence_delta =
      r.number("convergence_delta", o.convergence_delta, {0.0, 1e300, true, false});
  o.epoch_samples =
      r.optional_integer("epoch_samples", 1, std::numeric_limits<std::int64_t>::max());
  o.min_loss_points = r.integer("min_loss_points", o.min_loss_points, 3, 1'000'000);
  o.explore = r.choice("explore", "on", {"on", "off"}) == "on";
  o.min_workers = r.optional_integer("min_workers", 1, kMaxWorkers);
  o.max_workers = r.optional_integer("max_workers", 1, kMaxWorkers);
  r.reject_unknown();
  if (o.min_workers && o.max_workers && *o.min_workers > *o.max_workers) {
    r.fail("min_workers", "must not exceed max_workers (" + std::to_string(*o.min_workers) + " > " +
                              std::to_string(*o.max_workers) + ")");
  }
  return o;
}

class Optimus final : public Policy {
 public:
  explicit Optimus(Options o) : o_(o), log_(o.warmup_steps) {}

  std::string name() const override { return kName; }

  void after_step(PolicyContext& ctx) override {
    log_.observe(ctx);
    record_progress(ctx);
    if (ctx.step() % o_.every != 0) return;
    flush_loss();
    if (ctx.step() < quiet_until_) return;
    if (!loss_seen_) {
      if (!warned_no_loss_) {
        KF_LOG(warn, "policy",
               "{}: no 'loss' metric reported by step {}: the loss model cannot "
               "fit, so the policy does nothing until the program reports one",
               kName, ctx.step());
        warned_no_loss_ = true;
      }
      return;
    }
    evaluate(ctx);
  }

  void on_membership_change(PolicyContext&) override { flush_loss(); }

 private:
  void record_progress(const PolicyContext& ctx) {
    const double m = ctx.metric("samples", 0.0);
    if (ctx.has_metric("samples") && std::isfinite(m) && m > 0.0) {
      if (epoch_samples_ == 0.0) {
        const std::int64_t batch = ConfigLog::batch_of(ctx);
        epoch_samples_ = o_.epoch_samples ? static_cast<double>(*o_.epoch_samples)
                                          : static_cast<double>(kDefaultEpochSteps) *
                                                (batch > 0 ? static_cast<double>(batch) : m);
      }
      samples_done_ += m;
    }
    if (!ctx.has_metric("loss") || epoch_samples_ == 0.0) return;
    const double loss = ctx.metric("loss");
    if (!std::isfinite(loss)) return;  // §1 rule 3: skip a non-finite step, reset nothing
    loss_seen_ = true;
    if (interval_.workers() != 0 && interval_.workers() != ctx.workers()) flush_loss();
    interval_.add(samples_done_ / epoch_samples_, loss, ctx.workers());
  }

  void flush_loss() {
    if (auto p = interval_.flush()) {
      points_.push_back(*p);
      model_compact(points_, kMaxLossPoints);
    }
  }

  void evaluate(PolicyContext& ctx) {
    const int w = ctx.workers();
    const std::int64_t batch = ConfigLog::batch_of(ctx);
    const auto [lo, hi] = model_worker_bounds(o_.min_workers, o_.max_workers, ctx.settings());

    std::vector<monitor::SpeedPoint> speed;
    double current_m = 0.0;
    for (const auto& [key, s] : log_.measured(o_.min_steps)) {
      const double n = static_cast<double>(s.steps);
      speed.push_back({static_cast<double>(key.first), s.samples / n, s.seconds / n, n});
      if (key == ConfigLog::Key{w, batch}) current_m = s.samples / n;
    }
    if (current_m == 0.0) return;  // the current configuration is not measured yet
    const monitor::SpeedFit sf =
        monitor::fit_speed_model(speed, {.max_relative_rms = o_.max_residual});
    if (sf.status != monitor::FitStatus::ok) {
      explore(ctx, sf, lo, hi);
      return;
    }

    std::vector<double> k, l, weights;
    for (const auto& p : points_) {
      k.push_back(p.x);
      l.push_back(p.loss);
      weights.push_back(p.weight);
    }
    if (static_cast<std::int64_t>(points_.size()) < o_.min_loss_points) return;
    const monitor::LossFit lf =
        monitor::fit_loss_model(k, l, weights, {.max_relative_rms = o_.max_residual});
    if (lf.status != monitor::FitStatus::ok) return;

    const double k_now = samples_done_ / epoch_samples_;
    std::string goal;
    double k_star = std::numeric_limits<double>::infinity();
    if (o_.target_loss) {
      k_star = lf.model.epochs_to_target(*o_.target_loss);
      goal = "target loss " + model_num(*o_.target_loss);
    }
    if (std::isinf(k_star)) {
      k_star = lf.model.epochs_to_convergence(o_.convergence_delta);
      goal = (o_.target_loss ? goal + " out of reach (floor " + model_num(lf.model.beta2) +
                                   "), so convergence at decrease < "
                             : std::string("convergence at decrease < ")) +
             model_num(o_.convergence_delta) + "/epoch";
    }
    const double epochs_left = monitor::remaining_epochs(k_star, k_now);
    const double q = epochs_left * epoch_samples_ / current_m;
    decide(ctx, sf.model, lf, q, current_m, lo, hi,
           goal + ": " + model_num(epochs_left) + " epochs left at k=" + model_num(k_now));
  }

  void explore(PolicyContext& ctx, const monitor::SpeedFit& sf, int lo, int hi) {
    if (!o_.explore) return;
    const int w = ctx.workers();
    const std::optional<int> next =
        model_exploration_target(log_, w, ConfigLog::batch_of(ctx), o_.step, o_.min_steps, lo, hi);
    if (!next) return;
    ctx.resize(*next, "exploring: the speed model has " + std::to_string(sf.configurations) +
                          " measured configuration(s) (" +
                          std::string(monitor::to_string(sf.status)) + "), needs 3: " +
                          std::to_string(w) + " -> " + std::to_string(*next) + " workers");
    quiet_until_ = ctx.step() + o_.cooldown;
  }

  void decide(PolicyContext& ctx, const monitor::SpeedModel& sm, const monitor::LossFit& lf,
              double q, double m, int lo, int hi, const std::string& goal) {
    const int w = ctx.workers();
    const int best = monitor::workers_by_marginal_gain(sm, m, {lo, hi}, q, o_.min_gain_seconds);
    if (best == w) return;
    const double t_now = sm.step_time(m, w);
    const double t_best = sm.step_time(m, best);
    if (best > w && !(q * (t_now - t_best) >= o_.margin * q * t_now)) return;
    const int target = model_step_towards(w, best, o_.step);
    const double t_target = sm.step_time(m, target);
    ctx.resize(target,
               "loss model beta=(" + model_num(lf.model.beta0) + ", " + model_num(lf.model.beta1) +
                   ", " + model_num(lf.model.beta2) + "), " + goal + ", Q=" + model_num(q) +
                   " steps; speed model theta=(" + model_num(sm.theta0) + ", " +
                   model_num(sm.theta1) + ", " + model_num(sm.theta3) + ") at M=" + model_num(m) +
                   ": adding workers while each saves >= " + model_num(o_.min_gain_seconds) +
                   " s gives w*=" + std::to_string(best) + " in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "]; remaining time " + model_num(q * t_now) + " s -> " +
                   model_num(q * t_target) + " s: " + std::to_string(w) + " -> " +
                   std::to_string(target) + " workers");
    quiet_until_ = ctx.step() + o_.cooldown;
  }

  Options o_;
  ConfigLog log_;
  LossInterval interval_;
  std::vector<LossInterval::Point> points_;  // (k, mean loss, steps), kept across resizes
  double epoch_samples_ = 0.0;               // N; fixed at the first step with samples
  double samples_done_ = 0.0;
  bool loss_seen_ = false;
  bool warned_no_loss_ = false;
  std::int64_t quiet_until_ = 0;  // no evaluation before this step (the cool-down)
};

}  // namespace

std::unique_ptr<Policy> make_optimus_policy(const nlohmann::json& params) {
  return std::make_unique<Optimus>(read_options(params));
}

}  // namespace kf::detail
