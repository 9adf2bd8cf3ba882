// SPDX-License-Identifier: Apache-2.0
// hemingway: chooses the worker count that reaches a loss target soonest, or that ends a time
// budget with the lowest loss, with Hemingway's models (Ernest's system
// model f(m), the convergence model g(i, m), h(t, m) = g(t/f(m), m); Pan et al. 2016).
//
// Observations, every step:
// - the step time and samples per configuration (workers m, batch_size), after warmup_steps
//   discarded steps at each change, kept across resizes: the system model's points,
//   with size = the samples per step;
// - the `loss` metric minus loss_offset at iteration i = the job's step, averaged over each
//   evaluation interval at one worker count into a point (i, m, loss) weighted by its steps;
// - the elapsed time Σ step_time, for a time budget.
// Every `every` steps (outside the cool-down):
// 1. No target (neither target_loss nor time_budget) or no `loss` reported: log it once, do
//    nothing.
// 2. Fit f(m) over the configurations with min_steps steps. Until it fits (4 distinct
//    configurations, full rank, residual ≤ max_residual) and `explore` is on, propose the next
//    unmeasured count `step` above (else below) the current one.
// 3. Fit g over the loss points (at least min_loss_points and as many as basis terms, full rank,
//    which needs two worker counts for m/i, residual ≤ max_residual).
// 4. With i0 = the current step: for target_loss ε, m* = argmin_m max(0, i_ε(m) − i0)·f(m); for a
//    budget B, m* = argmin_m g(i0 + R/f(m), m) with R = B − elapsed. Act when m* beats the current
//    m by `margin` (relative), moving at most `step` workers towards m*, within
//    [min_workers, max_workers]; a cool-down of `cooldown` steps follows every proposal.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "builtin_factories.hpp"
#include "builtin_model_support.hpp"
#include "builtin_params.hpp"
#include "kf/monitor/hemingway.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "hemingway";

struct Options : ModelOptions {
  std::optional<double> time_budget;
  double loss_offset = 0.0;
  std::vector<monitor::ConvergenceTerm> terms = monitor::default_convergence_terms();
};

monitor::ConvergenceTerm term_of(const std::string& name) {
  if (name == "constant") return monitor::ConvergenceTerm::constant;
  if (name == "inv_i") return monitor::ConvergenceTerm::inv_i;
  if (name == "m_over_i") return monitor::ConvergenceTerm::m_over_i;
  if (name == "inv_i2") return monitor::ConvergenceTerm::inv_i2;
  return monitor::ConvergenceTerm::inv_sqrt_i;
}

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  read_model_schedule(r, o);
  read_model_fit(r, o);
  o.time_budget = r.optional_number("time_budget", {0.0, 1e12, true, false});
  o.loss_offset = r.number("loss_offset", o.loss_offset, {-1e300, 1e300, false, false});
  o.terms.clear();
  for (const std::string& t :
       r.choice_list("basis", {"inv_i", "m_over_i", "inv_i2"},
                     {"constant", "inv_i", "m_over_i", "inv_i2", "inv_sqrt_i"})) {
    o.terms.push_back(term_of(t));
  }
  read_model_search(r, o);
  if (o.target_loss && o.time_budget) {
    r.fail("time_budget", "cannot be given together with target_loss (choose one objective)");
  }
  if (o.target_loss && !(*o.target_loss > o.loss_offset)) {
    r.fail("target_loss", "must exceed loss_offset (" + format_number(o.loss_offset) + ")");
  }
  check_model_bounds(r, o);
  return o;
}

class Hemingway final : public ModelPolicy {
 public:
  explicit Hemingway(Options o) : ModelPolicy(kName, "convergence model", o), o_(std::move(o)) {}

 private:
  bool ready() override {
    if (o_.target_loss || o_.time_budget) return true;
    warn_once(no_target_warned_, "no target_loss or time_budget parameter: nothing to decide");
    return false;
  }

  void record(const PolicyContext& ctx) override {
    const double t = ctx.metric("step_time", 0.0);
    if (ctx.has_metric("step_time") && std::isfinite(t) && t > 0.0) elapsed_ += t;
    if (ctx.step() < 1) return;
    record_loss(ctx, static_cast<double>(ctx.step()), o_.loss_offset);
  }

  void evaluate(PolicyContext& ctx) override {
    const auto [lo, hi] = worker_bounds(ctx);
    double size = 0.0;
    const auto sf = fit_step_times<monitor::SystemPoint>(
        ctx, "system model", 4, lo, hi, size, [&](const std::vector<monitor::SystemPoint>& points) {
          return monitor::fit_system_model(points, {.max_relative_rms = o_.max_residual});
        });
    if (!sf || !enough_loss_points()) return;
    std::vector<monitor::ConvergencePoint> conv;
    for (const auto& p : loss_points()) {
      conv.push_back({p.x, static_cast<double>(p.workers), p.loss, p.weight});
    }
    const monitor::ConvergenceFit cf = monitor::fit_convergence_model(
        conv, {.terms = o_.terms, .max_relative_rms = o_.max_residual});
    if (cf.status != monitor::FitStatus::ok) return;

    monitor::CombinedModel model;
    model.system = sf->model;
    model.convergence = cf.model;
    model.size = size;
    model.min_machines = lo;
    model.max_machines = hi;
    model.start_iterations = static_cast<double>(ctx.step());
    if (o_.target_loss) {
      decide_for_target(ctx, model);
    } else {
      decide_for_budget(ctx, model);
    }
  }

  void decide_for_target(PolicyContext& ctx, const monitor::CombinedModel& model) {
    const int w = ctx.workers();
    const double eps = *o_.target_loss - o_.loss_offset;
    const double now = model.time_to(eps, w);
    if (now == 0.0) return;  // the model says the target is reached: nothing left to speed up
    const monitor::MachineChoice best = monitor::best_machines_for_target(model, eps);
    if (best.machines == 0) {
      warn_once(unreachable_warned_, "target_loss " + short_number(*o_.target_loss) +
                                         " is out of reach of the fitted convergence model");
      return;
    }
    if (best.machines == w || !(best.value <= (1.0 - o_.margin) * now)) return;
    propose_towards(ctx, model, best.machines,
                    "to reach loss " + short_number(*o_.target_loss) + ": m*=" +
                        std::to_string(best.machines) + " needs " + short_number(best.iterations) +
                        " more iterations, " + short_number(best.value) + " s, against " +
                        short_number(now) + " s at " + std::to_string(w));
  }

  void decide_for_budget(PolicyContext& ctx, const monitor::CombinedModel& model) {
    const int w = ctx.workers();
    const double left = *o_.time_budget - elapsed_;
    if (!(left > 0.0)) {
      warn_once(budget_spent_warned_,
                "the time budget of " + short_number(*o_.time_budget) + " s is spent");
      return;
    }
    const double now = model.loss_after(left, w);
    const monitor::MachineChoice best = monitor::best_machines_for_time(model, left);
    if (best.machines == w || !(best.value <= (1.0 - o_.margin) * now)) return;
    propose_towards(ctx, model, best.machines,
                    "for the " + short_number(left) + " s left of the budget: m*=" +
                        std::to_string(best.machines) + " ends at predicted loss " +
                        short_number(best.value + o_.loss_offset) + ", against " +
                        short_number(now + o_.loss_offset) + " at " + std::to_string(w));
  }

  void propose_towards(PolicyContext& ctx, const monitor::CombinedModel& model, int best,
                       const std::string& why) {
    const int w = ctx.workers();
    const int target = model_step_towards(w, best, o_.step);
    const auto& s = model.system;
    std::string lambda;
    for (std::size_t j = 0; j < model.convergence.lambda.size(); ++j) {
      lambda += (j == 0 ? "" : ", ") + std::string(monitor::to_string(model.convergence.terms[j])) +
                ": " + short_number(model.convergence.lambda[j]);
    }
    propose(ctx, target,
            "system model theta=(" + short_number(s.theta0) + ", " + short_number(s.theta1) + ", " +
                short_number(s.theta2) + ", " + short_number(s.theta3) + ") at size " +
                short_number(model.size) + ", convergence model {" + lambda + "} at step " +
                short_number(model.start_iterations) + "; " + why + " (margin " +
                short_number(o_.margin) + ", bounds [" + std::to_string(model.min_machines) + ", " +
                std::to_string(model.max_machines) + "]): " + std::to_string(w) + " -> " +
                std::to_string(target) + " workers");
  }

  Options o_;
  double elapsed_ = 0.0;  // Σ step_time seen
  bool no_target_warned_ = false;
  bool unreachable_warned_ = false;
  bool budget_spent_warned_ = false;
};

}  // namespace

std::unique_ptr<Policy> make_hemingway_policy(const nlohmann::json& params) {
  return std::make_unique<Hemingway>(read_options(params));
}

}  // namespace kf::detail
