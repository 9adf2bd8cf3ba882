// SPDX-License-Identifier: Apache-2.0
// optimus: chooses the worker count by the marginal gain in remaining time, with Optimus's loss
// and speed models (§4.1 of Peng et al., EuroSys 2018).
//
// Observations, every step:
// - the step time and samples per configuration (workers, batch_size), after warmup_steps
//   discarded steps at each change, kept across resizes;
// - the `loss` metric with the progress k = samples processed / epoch_samples (fractional
//   epochs), averaged over each evaluation interval into one point weighted by its steps.
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
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "builtin_factories.hpp"
#include "builtin_model_support.hpp"
#include "builtin_params.hpp"
#include "kf/monitor/optimus.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "optimus";
/// epoch_samples when the job file gives none: this many steps at the first batch size.
constexpr std::int64_t kDefaultEpochSteps = 100;

struct Options : ModelOptions {
  double min_gain_seconds = 60.0;
  double convergence_delta = 1e-3;
  std::optional<std::int64_t> epoch_samples;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  read_model_schedule(r, o);
  o.min_gain_seconds = r.number("min_gain_seconds", o.min_gain_seconds, {0.0, 1e12, false, false});
  read_model_fit(r, o);
  o.convergence_delta =
      r.number("convergence_delta", o.convergence_delta, {0.0, 1e300, true, false});
  o.epoch_samples =
      r.optional_integer("epoch_samples", 1, std::numeric_limits<std::int64_t>::max());
  read_model_search(r, o);
  check_model_bounds(r, o);
  return o;
}

class Optimus final : public ModelPolicy {
 public:
  explicit Optimus(Options o) : ModelPolicy(kName, "loss model", o), o_(std::move(o)) {}

 private:
  void record(const PolicyContext& ctx) override {
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
    if (epoch_samples_ == 0.0) return;
    record_loss(ctx, samples_done_ / epoch_samples_, 0.0);
  }

  void evaluate(PolicyContext& ctx) override {
    const auto [lo, hi] = worker_bounds(ctx);
    double current_m = 0.0;
    const auto sf = fit_step_times<monitor::SpeedPoint>(
        ctx, "speed model", 3, lo, hi, current_m,
        [&](const std::vector<monitor::SpeedPoint>& points) {
          return monitor::fit_speed_model(points, {.max_relative_rms = o_.max_residual});
        });
    if (!sf || !enough_loss_points()) return;
    std::vector<double> k, l, weights;
    for (const auto& p : loss_points()) {
      k.push_back(p.x);
      l.push_back(p.loss);
      weights.push_back(p.weight);
    }
    const monitor::LossFit lf =
        monitor::fit_loss_model(k, l, weights, {.max_relative_rms = o_.max_residual});
    if (lf.status != monitor::FitStatus::ok) return;

    const double k_now = samples_done_ / epoch_samples_;
    std::string goal;
    double k_star = std::numeric_limits<double>::infinity();
    if (o_.target_loss) {
      k_star = lf.model.epochs_to_target(*o_.target_loss);
      goal = "target loss " + short_number(*o_.target_loss);
    }
    if (std::isinf(k_star)) {
      k_star = lf.model.epochs_to_convergence(o_.convergence_delta);
      goal = (o_.target_loss ? goal + " out of reach (floor " + short_number(lf.model.beta2) +
                                   "), so convergence at decrease < "
                             : std::string("convergence at decrease < ")) +
             short_number(o_.convergence_delta) + "/epoch";
    }
    const double epochs_left = monitor::remaining_epochs(k_star, k_now);
    const double q = epochs_left * epoch_samples_ / current_m;
    decide(ctx, sf->model, lf, q, current_m, lo, hi,
           goal + ": " + short_number(epochs_left) + " epochs left at k=" + short_number(k_now));
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
    propose(ctx, target,
            "loss model beta=(" + short_number(lf.model.beta0) + ", " +
                short_number(lf.model.beta1) + ", " + short_number(lf.model.beta2) + "), " + goal +
                ", Q=" + short_number(q) + " steps; speed model theta=(" + short_number(sm.theta0) +
                ", " + short_number(sm.theta1) + ", " + short_number(sm.theta3) +
                ") at M=" + short_number(m) + ": adding workers while each saves >= " +
                short_number(o_.min_gain_seconds) + " s gives w*=" + std::to_string(best) +
                " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; remaining time " +
                short_number(q * t_now) + " s -> " + short_number(q * t_target) +
                " s: " + std::to_string(w) + " -> " + std::to_string(target) + " workers");
  }

  Options o_;
  double epoch_samples_ = 0.0;  // N; fixed at the first step with samples
  double samples_done_ = 0.0;
};

}  // namespace

std::unique_ptr<Policy> make_optimus_policy(const nlohmann::json& params) {
  return std::make_unique<Optimus>(read_options(params));
}

}  // namespace kf::detail
