// SPDX-License-Identifier: Apache-2.0
// hemingway: chooses the worker count that reaches a loss target soonest, or that ends a time
// budget with the lowest loss, with Hemingway's models (adaptation-math.md §6: Ernest's system
// model f(m), the convergence model g(i, m), h(t, m) = g(t/f(m), m); the control-loop rules of
// §8).
//
// Observations, every step:
// - the step time and samples per configuration (workers m, batch_size), after warmup_steps
//   discarded steps at each change, kept across resizes (§8 rule 5): the system model's points,
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
#include "kf/monitor/hemingway.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "hemingway";
constexpr std::int64_t kMaxSteps = 1'000'000'000;
constexpr std::int64_t kMaxWorkers = 1'000'000;
constexpr std::size_t kMaxLossPoints = 400;

struct Options {
  std::int64_t every = 50;
  std::int64_t min_steps = 20;
  std::int64_t warmup_steps = 2;
  std::int64_t cooldown = 100;
  std::int64_t step = 2;
  double margin = 0.05;
  double max_residual = 0.1;
  std::optional<double> target_loss;
  std::optional<double> time_budget;
  double loss_offset = 0.0;
  std::vector<monitor::ConvergenceTerm> terms = monitor::default_convergence_terms();
  std::int64_t min_loss_points = 5;
  bool explore = true;
  std::optional<std::int64_t> min_workers;
  std::optional<std::int64_t> max_workers;
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
  o.every = r.integer("every", o.every, 1, kMaxSteps);
  o.min_steps = r.integer("min_steps", o.min_steps, 1, kMaxSteps);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  o.step = r.integer("step", o.step, 1, kMaxWorkers);
  o.margin = r.number("margin", o.margin, {0.0, 1.0, false, true});
  o.max_residual = r.number("max_residual", o.max_residual, {0.0, 10.0, true, false});
  o.target_loss = r.optional_number("target_loss", {-1e300, 1e300, false, false});
  o.time_budget = r.optional_number("time_budget", {0.0, 1e12, true, false});
  o.loss_offset = r.number("loss_offset", o.loss_offset, {-1e300, 1e300, false, false});
  o.terms.clear();
  for (const std::string& t :
       r.choice_list("basis", {"inv_i", "m_over_i", "inv_i2"},
                     {"constant", "inv_i", "m_over_i", "inv_i2", "inv_sqrt_i"})) {
    o.terms.push_back(term_of(t));
  }
  o.min_loss_points = r.integer("min_loss_points", o.min_loss_points, 3, 1'000'000);
  o.explore = r.choice("explore", "on", {"on", "off"}) == "on";
  o.min_workers = r.optional_integer("min_workers", 1, kMaxWorkers);
  o.max_workers = r.optional_integer("max_workers", 1, kMaxWorkers);
  r.reject_unknown();
  if (o.target_loss && o.time_budget) {
    r.fail("time_budget", "cannot be given together with target_loss (choose one objective)");
  }
  if (o.target_loss && !(*o.target_loss > o.loss_offset)) {
    r.fail("target_loss", "must exceed loss_offset (" + format_number(o.loss_offset) + ")");
  }
  if (o.min_workers && o.max_workers && *o.min_workers > *o.max_workers) {
    r.fail("min_workers", "must not exceed max_workers (" + std::to_string(*o.min_workers) + " > " +
                              std::to_string(*o.max_workers) + ")");
  }
  return o;
}

class Hemingway final : public Policy {
 public:
  explicit Hemingway(Options o) : o_(std::move(o)), log_(o_.warmup_steps) {}

  std::string name() const override { return kName; }

  void after_step(PolicyContext& ctx) override {
    log_.observe(ctx);
    record(ctx);
    if (ctx.step() % o_.every != 0) return;
    flush_loss();
    if (ctx.step() < quiet_until_) return;
    if (!o_.target_loss && !o_.time_budget) {
      warn_once(no_target_warned_, "no target_loss or time_budget parameter: nothing to decide");
      return;
    }
    if (!loss_seen_) {
      warn_once(no_loss_warned_,
                "no 'loss' metric reported by step " + std::to_string(ctx.step()) +
                    ": the convergence model cannot fit, so the policy does nothing until the "
                    "program reports one");
      return;
    }
    evaluate(ctx);
  }

  void on_membership_change(PolicyContext&) override { flush_loss(); }

 private:
  static void warn_once(bool& flag, const std::string& what) {
    if (flag) return;
    KF_LOG(warn, "policy", "{}: {}", kName, what);
    flag = true;
  }

  void record(const PolicyContext& ctx) {
    const double t = ctx.metric("step_time", 0.0);
    if (ctx.has_metric("step_time") && std::isfinite(t) && t > 0.0) elapsed_ += t;
    if (!ctx.has_metric("loss") || ctx.step() < 1) return;
    const double loss = ctx.metric("loss");
    if (!std::isfinite(loss)) return;  // §1 rule 3: skip a non-finite step, reset nothing
    loss_seen_ = true;
    if (interval_.workers() != 0 && interval_.workers() != ctx.workers()) flush_loss();
    interval_.add(static_cast<double>(ctx.step()), loss - o_.loss_offset, ctx.workers());
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

    std::vector<monitor::SystemPoint> system;
    double size = 0.0;
    for (const auto& [key, s] : log_.measured(o_.min_steps)) {
      const double n = static_cast<double>(s.steps);
      system.push_back({static_cast<double>(key.first), s.samples / n, s.seconds / n, n});
      if (key == ConfigLog::Key{w, batch}) size = s.samples / n;
    }
    if (size == 0.0) return;  // the current configuration is not measured yet
    const monitor::SystemFit sf =
        monitor::fit_system_model(system, {.max_relative_rms = o_.max_residual});
    if (sf.status != monitor::FitStatus::ok) {
      explore(ctx, sf, lo, hi);
      return;
    }

    if (static_cast<std::int64_t>(points_.size()) < o_.min_loss_points) return;
    std::vector<monitor::ConvergencePoint> conv;
    for (const auto& p : points_) {
      conv.push_back({p.x, static_cast<double>(p.workers), p.loss, p.weight});
    }
    const monitor::ConvergenceFit cf = monitor::fit_convergence_model(
        conv, {.terms = o_.terms, .max_relative_rms = o_.max_residual});
    if (cf.status != monitor::FitStatus::ok) return;

    monitor::CombinedModel model;
    model.system = sf.model;
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

  void explore(PolicyContext& ctx, const monitor::SystemFit& sf, int lo, int hi) {
    if (!o_.explore) return;
    const int w = ctx.workers();
    const std::optional<int> next =
        model_exploration_target(log_, w, ConfigLog::batch_of(ctx), o_.step, o_.min_steps, lo, hi);
    if (!next) return;
    ctx.resize(*next, "exploring: the system model has " + std::to_string(sf.configurations) +
                          " measured configuration(s) (" +
                          std::string(monitor::to_string(sf.status)) + "), needs 4: " +
                          std::to_string(w) + " -> " + std::to_string(*next) + " workers");
    quiet_until_ = ctx.step() + o_.cooldown;
  }

  void decide_for_target(PolicyContext& ctx, const monitor::CombinedModel& model) {
    const int w = ctx.workers();
    const double eps = *o_.target_loss - o_.loss_offset;
    const double now = model.time_to(eps, w);
    if (now == 0.0) return;  // the model says the target is reached: nothing left to speed up
    const monitor::MachineChoice best = monitor::best_machines_for_target(model, eps);
    if (best.machines == 0) {
      warn_once(unreachable_warned_, "target_loss " + model_num(*o_.target_loss) +
                                         " is out of reach of the fitted convergence model");
      return;
    }
    if (best.machines == w || !(best.value <= (1.0 - o_.margin) * now)) return;
    propose(ctx, model, best.machines,
            "to reach loss " + model_num(*o_.target_loss) +
                ": m*=" + std::to_string(best.machines) + " needs " + model_num(best.iterations) +
                " more iterations, " + model_num(best.value) + " s, against " + model_num(now) +
                " s at " + std::to_string(w));
  }

  void decide_for_budget(PolicyContext& ctx, const monitor::CombinedModel& model) {
    const int w = ctx.workers();
    const double left = *o_.time_budget - elapsed_;
    if (!(left > 0.0)) {
      warn_once(budget_spent_warned_,
                "the time budget of " + model_num(*o_.time_budget) + " s is spent");
      return;
    }
    const double now = model.loss_after(left, w);
    const monitor::MachineChoice best = monitor::best_machines_for_time(model, left);
    if (best.machines == w || !(best.value <= (1.0 - o_.margin) * now)) return;
    propose(ctx, model, best.machines,
            "for the " + model_num(left) +
                " s left of the budget: m*=" + std::to_string(best.machines) +
                " ends at predicted loss " + model_num(best.value + o_.loss_offset) + ", against " +
                model_num(now + o_.loss_offset) + " at " + std::to_string(w));
  }

  void propose(PolicyContext& ctx, const monitor::CombinedModel& model, int best,
               const std::string& why) {
    const int w = ctx.workers();
    const int target = model_step_towards(w, best, o_.step);
    const auto& s = model.system;
    std::string lambda;
    for (std::size_t j = 0; j < model.convergence.lambda.size(); ++j) {
      lambda += (j == 0 ? "" : ", ") + std::string(monitor::to_string(model.convergence.terms[j])) +
                ": " + model_num(model.convergence.lambda[j]);
    }
    ctx.resize(target, "system model theta=(" + model_num(s.theta0) + ", " + model_num(s.theta1) +
                           ", " + model_num(s.theta2) + ", " + model_num(s.theta3) + ") at size " +
                           model_num(model.size) + ", convergence model {" + lambda + "} at step " +
                           model_num(model.start_iterations) + "; " + why + " (margin " +
                           model_num(o_.margin) + ", bounds [" +
                           std::to_string(model.min_machines) + ", " +
                           std::to_string(model.max_machines) + "]): " + std::to_string(w) +
                           " -> " + std::to_string(target) + " workers");
    quiet_until_ = ctx.step() + o_.cooldown;
  }

  Options o_;
  ConfigLog log_;
  LossInterval interval_;
  std::vector<LossInterval::Point> points_;  // (i, mean loss − offset, steps, m), across resizes
  double elapsed_ = 0.0;                     // Σ step_time seen
  bool loss_seen_ = false;
  bool no_target_warned_ = false;
  bool no_loss_warned_ = false;
  bool unreachable_warned_ = false;
  bool budget_spent_warned_ = false;
  std::int64_t quiet_until_ = 0;  // no evaluation before this step (the cool-down)
};

}  // namespace

std::unique_ptr<Policy> make_hemingway_policy(const nlohmann::json& params) {
  return std::make_unique<Hemingway>(read_options(params));
}

}  // namespace kf::detail
