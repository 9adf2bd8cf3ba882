// SPDX-License-Identifier: Apache-2.0
#include "builtin_model_support.hpp"

#include <cmath>

#include "kf/common/log.hpp"

namespace kf::detail {

namespace {

constexpr std::int64_t kMaxSteps = 1'000'000'000;
constexpr std::int64_t kMaxWorkers = 1'000'000;
constexpr std::size_t kMaxLossPoints = 400;

}  // namespace

void read_model_schedule(ParamReader& r, ModelOptions& o) {
  o.every = r.integer("every", o.every, 1, kMaxSteps);
  o.min_steps = r.integer("min_steps", o.min_steps, 1, kMaxSteps);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  o.step = r.integer("step", o.step, 1, kMaxWorkers);
  o.margin = r.number("margin", o.margin, {0.0, 1.0, false, true});
}

void read_model_fit(ParamReader& r, ModelOptions& o) {
  o.max_residual = r.number("max_residual", o.max_residual, {0.0, 10.0, true, false});
  o.target_loss = r.optional_number("target_loss", {-1e300, 1e300, false, false});
}

void read_model_search(ParamReader& r, ModelOptions& o) {
  o.min_loss_points = r.integer("min_loss_points", o.min_loss_points, 3, 1'000'000);
  o.explore = r.choice("explore", "on", {"on", "off"}) == "on";
  o.min_workers = r.optional_integer("min_workers", 1, kMaxWorkers);
  o.max_workers = r.optional_integer("max_workers", 1, kMaxWorkers);
  r.reject_unknown();
}

void check_model_bounds(const ParamReader& r, const ModelOptions& o) {
  r.require_ordered("min_workers", o.min_workers, "max_workers", o.max_workers);
}

ModelPolicy::ModelPolicy(const char* name, const char* loss_model, const ModelOptions& o)
    : name_(name), loss_model_(loss_model), common_(o), log_(o.warmup_steps) {}

void ModelPolicy::after_step(PolicyContext& ctx) {
  log_.observe(ctx);
  record(ctx);
  if (ctx.step() % common_.every != 0) return;
  flush_loss();
  if (ctx.step() < quiet_until_) return;
  if (!ready()) return;
  if (!loss_seen_) {
    warn_once(no_loss_warned_, "no 'loss' metric reported by step " + std::to_string(ctx.step()) +
                                   ": the " + loss_model_ +
                                   " cannot fit, so the policy does nothing until the program "
                                   "reports one");
    return;
  }
  evaluate(ctx);
}

void ModelPolicy::record_loss(const PolicyContext& ctx, double x, double offset) {
  if (!ctx.has_metric("loss")) return;
  const double loss = ctx.metric("loss");
  if (!std::isfinite(loss)) return;  // skip a non-finite step, reset nothing
  loss_seen_ = true;
  if (interval_.workers() != 0 && interval_.workers() != ctx.workers()) flush_loss();
  interval_.add(x, loss - offset, ctx.workers());
}

void ModelPolicy::warn_once(bool& flag, const std::string& what) const {
  if (flag) return;
  KF_LOG(warn, "policy", "{}: {}", name_, what);
  flag = true;
}

std::pair<int, int> ModelPolicy::worker_bounds(const PolicyContext& ctx) const {
  return model_worker_bounds(common_.min_workers, common_.max_workers, ctx.settings());
}

void ModelPolicy::explore(PolicyContext& ctx, std::string_view model, std::size_t configurations,
                          std::string_view status, int needs, int lo, int hi) {
  if (!common_.explore) return;
  const int w = ctx.workers();
  const std::optional<int> next = model_exploration_target(log_, w, ConfigLog::batch_of(ctx),
                                                           common_.step, common_.min_steps, lo, hi);
  if (!next) return;
  propose(ctx, *next,
          "exploring: the " + std::string(model) + " has " + std::to_string(configurations) +
              " measured configuration(s) (" + std::string(status) + "), needs " +
              std::to_string(needs) + ": " + std::to_string(w) + " -> " + std::to_string(*next) +
              " workers");
}

void ModelPolicy::propose(PolicyContext& ctx, int target, const std::string& why) {
  ctx.resize(target, why);
  quiet_until_ = ctx.step() + common_.cooldown;
}

void ModelPolicy::flush_loss() {
  if (auto p = interval_.flush()) {
    points_.push_back(*p);
    model_compact(points_, kMaxLossPoints);
  }
}

}  // namespace kf::detail
