// SPDX-License-Identifier: Apache-2.0
// What the two model-based built-ins (optimus, hemingway) share: the per-configuration step-time
// log kept across resizes, the worker bounds, the exploration move
// that collects the configurations a model needs before it can fit ("Optimus runs a few
// steps at several configurations"), the loss points averaged over an interval, the parameters
// both read, and ModelPolicy, their common control loop (observe every step; every `every`
// steps outside the cool-down, gate on a reported loss and let the policy fit and decide).
// Thread-safety: none; each policy owns its objects and is called from the training thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "builtin_params.hpp"
#include "kf/monitor/optimus.hpp"
#include "kf/policies/policy.hpp"

namespace kf::detail {

/// The largest worker count searched when neither the parameters nor the settings bound it.
inline constexpr std::int64_t kModelMaxWorkers = 1024;

/// [lo, hi]: each bound from the parameter, else the setting (max_workers ≤ 0 there means none),
/// else 1 and kModelMaxWorkers.
inline std::pair<int, int> model_worker_bounds(const std::optional<std::int64_t>& min_param,
                                               const std::optional<std::int64_t>& max_param,
                                               const nlohmann::json& settings) {
  auto setting = [&](const char* key) -> std::optional<std::int64_t> {
    if (settings.contains(key) && settings[key].is_number_integer()) {
      return settings[key].get<std::int64_t>();
    }
    return std::nullopt;
  };
  std::int64_t lo = min_param ? *min_param : setting("min_workers").value_or(1);
  std::int64_t hi = kModelMaxWorkers;
  if (max_param) {
    hi = *max_param;
  } else if (const auto s = setting("max_workers"); s && *s > 0) {
    hi = *s;
  }
  constexpr std::int64_t kLimit = 1'000'000;  // the parameters' range
  lo = std::clamp<std::int64_t>(lo, 1, kLimit);
  hi = std::clamp<std::int64_t>(hi, lo, kLimit);
  return {static_cast<int>(lo), static_cast<int>(hi)};
}

/// A move of at most `step` workers from `current` towards `target`.
inline int model_step_towards(int current, int target, std::int64_t step) {
  const auto delta = std::clamp<std::int64_t>(target - current, -step, step);
  return current + static_cast<int>(delta);
}

/// Step times per configuration (worker count, global batch), after discarding `warmup` steps at
/// every change of either; kept across resizes so that the models see every configuration tried.
class ConfigLog {
 public:
  struct Stats {
    std::int64_t steps = 0;
    double seconds = 0.0;
    double samples = 0.0;
  };
  using Key = std::pair<int, std::int64_t>;  // workers, batch_size setting (0 when unknown)

  explicit ConfigLog(std::int64_t warmup) : warmup_(warmup) {}

  /// Takes this step's step_time and samples; returns false when the step did not count (no or
  /// invalid metrics, or a warm-up step).
  bool observe(const PolicyContext& ctx) {
    const Key key{ctx.workers(), batch_of(ctx)};
    if (!current_ || *current_ != key) discard_ = warmup_;
    current_ = key;
    if (!ctx.has_metric("step_time") || !ctx.has_metric("samples")) return false;
    const double t = ctx.metric("step_time");
    const double m = ctx.metric("samples");
    if (!std::isfinite(t) || t <= 0.0 || !std::isfinite(m) || m <= 0.0) return false;
    if (discard_ > 0) {
      --discard_;
      return false;
    }
    Stats& s = log_[key];
    ++s.steps;
    s.seconds += t;
    s.samples += m;
    return true;
  }

  /// The configurations with at least `min_steps` counted steps.
  std::vector<std::pair<Key, Stats>> measured(std::int64_t min_steps) const {
    std::vector<std::pair<Key, Stats>> out;
    for (const auto& [k, s] : log_) {
      if (s.steps >= min_steps) out.emplace_back(k, s);
    }
    return out;
  }

  /// Whether `workers` was measured for min_steps steps at `batch`.
  bool has(int workers, std::int64_t batch, std::int64_t min_steps) const {
    const auto it = log_.find({workers, batch});
    return it != log_.end() && it->second.steps >= min_steps;
  }

  static std::int64_t batch_of(const PolicyContext& ctx) {
    const auto& s = ctx.settings();
    if (s.contains("batch_size") && s["batch_size"].is_number_integer()) {
      return s["batch_size"].get<std::int64_t>();
    }
    return 0;
  }

 private:
  std::int64_t warmup_;
  std::int64_t discard_ = 0;
  std::optional<Key> current_;
  std::map<Key, Stats> log_;
};

/// The worker count to measure next while a model lacks configurations: `step` above the current
/// one, else `step` below (clamped to [lo, hi], and at most `step` away), whichever is not yet
/// measured at this batch; nullopt when neither is.
inline std::optional<int> model_exploration_target(const ConfigLog& log, int current,
                                                   std::int64_t batch, std::int64_t step,
                                                   std::int64_t min_steps, int lo, int hi) {
  for (const std::int64_t direction : {1, -1}) {
    // Into the range first when outside it, never more than `step` at a time.
    const int w = model_step_towards(
        current, static_cast<int>(std::clamp<std::int64_t>(current + direction * step, lo, hi)),
        step);
    if (w != current && !log.has(w, batch, min_steps)) return w;
  }
  return std::nullopt;
}

/// The loss averaged over an interval at one worker count: its mean position (progress or step),
/// mean loss and the number of steps averaged (the point's weight).
class LossInterval {
 public:
  struct Point {
    double x = 0.0;
    double loss = 0.0;
    double weight = 0.0;
    int workers = 0;
  };

  void add(double x, double loss, int workers) {
    if (count_ > 0 && workers != workers_) return;  // the caller flushes at a resize first
    workers_ = workers;
    sum_x_ += x;
    sum_loss_ += loss;
    ++count_;
  }

  /// The interval's point (nullopt when it is empty), and a fresh interval.
  std::optional<Point> flush() {
    if (count_ == 0) return std::nullopt;
    const auto n = static_cast<double>(count_);
    Point p{sum_x_ / n, sum_loss_ / n, n, workers_};
    *this = LossInterval();
    return p;
  }

  int workers() const { return count_ > 0 ? workers_ : 0; }

 private:
  double sum_x_ = 0.0;
  double sum_loss_ = 0.0;
  std::int64_t count_ = 0;
  int workers_ = 0;
};

/// Keeps at most `cap` points by merging neighbours pairwise (weighted means) when full, so that
/// a long job keeps its whole history at a coarser grain.
inline void model_compact(std::vector<LossInterval::Point>& points, std::size_t cap) {
  if (points.size() <= cap) return;
  std::vector<LossInterval::Point> merged;
  for (std::size_t i = 0; i < points.size(); i += 2) {
    if (i + 1 == points.size() || points[i].workers != points[i + 1].workers) {
      merged.push_back(points[i]);
      if (i + 1 < points.size()) merged.push_back(points[i + 1]);
      continue;
    }
    const auto& a = points[i];
    const auto& b = points[i + 1];
    const double w = a.weight + b.weight;
    merged.push_back({(a.x * a.weight + b.x * b.weight) / w,
                      (a.loss * a.weight + b.loss * b.weight) / w, w, a.workers});
  }
  points = std::move(merged);
}

/// The parameters both model-based policies read, with their common defaults.
struct ModelOptions {
  std::int64_t every = 50;
  std::int64_t min_steps = 20;
  std::int64_t warmup_steps = 2;
  std::int64_t cooldown = 100;
  std::int64_t step = 2;
  double margin = 0.05;
  double max_residual = 0.1;
  std::optional<double> target_loss;
  std::int64_t min_loss_points = 5;
  bool explore = true;
  std::optional<std::int64_t> min_workers;
  std::optional<std::int64_t> max_workers;
};

// The shared parameters in three groups, so that each policy reads its own ones in between and
// every parameter keeps its place in the order of reading (the first bad one is reported):
/// every, min_steps, warmup_steps, cooldown, step, margin.
void read_model_schedule(ParamReader& r, ModelOptions& o);
/// max_residual, target_loss.
void read_model_fit(ParamReader& r, ModelOptions& o);
/// min_loss_points, explore, min_workers, max_workers; then rejects unknown parameters.
void read_model_search(ParamReader& r, ModelOptions& o);
/// Fails when min_workers exceeds max_workers (the policy's last check).
void check_model_bounds(const ParamReader& r, const ModelOptions& o);

/// The control loop of a model-based policy. Every step: the step time goes to the
/// configuration log and record() takes the policy's observations (the loss through
/// record_loss()). Every `every` steps, unless in the cool-down: the interval's loss point is
/// kept, ready() may decline (with its own warning), a policy without a finite `loss` yet warns
/// once, and evaluate() fits and decides. A membership change closes the loss interval.
class ModelPolicy : public Policy {
 public:
  std::string name() const final { return name_; }
  void after_step(PolicyContext& ctx) final;
  void on_membership_change(PolicyContext&) final { flush_loss(); }

 protected:
  /// `loss_model` names the model that needs the loss, in the warning without one.
  ModelPolicy(const char* name, const char* loss_model, const ModelOptions& o);

  virtual void record(const PolicyContext& ctx) = 0;
  /// Whether the policy has something to decide (false: it warned why not).
  virtual bool ready() { return true; }
  virtual void evaluate(PolicyContext& ctx) = 0;

  /// Adds this step's finite `loss` minus `offset` at position `x` to the interval (a resize
  /// closes the previous one first); nothing without a finite loss.
  void record_loss(const PolicyContext& ctx, double x, double offset);

  /// Logs "<name>: <what>" at warn level the first time `flag` is seen false, then sets it.
  void warn_once(bool& flag, const std::string& what) const;

  /// [min_workers, max_workers] for this step (model_worker_bounds).
  std::pair<int, int> worker_bounds(const PolicyContext& ctx) const;

  /// The step-time model that `fit` makes of the configurations measured for min_steps steps
  /// (each a Point {workers, samples per step, seconds per step, steps}), with the current
  /// configuration's samples per step in `size`. nullopt when the current configuration is not
  /// measured yet, or when the model does not fit: then, when `explore` is on, the next
  /// unmeasured worker count is proposed for the `model` that needs `needs` configurations.
  template <class Point, class FitFn>
  auto fit_step_times(PolicyContext& ctx, std::string_view model, int needs, int lo, int hi,
                      double& size, FitFn fit)
      -> std::optional<std::invoke_result_t<FitFn&, const std::vector<Point>&>> {
    const ConfigLog::Key here{ctx.workers(), ConfigLog::batch_of(ctx)};
    std::vector<Point> points;
    size = 0.0;
    for (const auto& [key, s] : log_.measured(common_.min_steps)) {
      const double n = static_cast<double>(s.steps);
      points.push_back({static_cast<double>(key.first), s.samples / n, s.seconds / n, n});
      if (key == here) size = s.samples / n;
    }
    if (size == 0.0) return std::nullopt;
    auto result = fit(points);
    if (result.status == monitor::FitStatus::ok) return result;
    explore(ctx, model, result.configurations, monitor::to_string(result.status), needs, lo, hi);
    return std::nullopt;
  }

  /// Proposes `target` workers for `why`, then cools down.
  void propose(PolicyContext& ctx, int target, const std::string& why);

  /// The loss points kept so far, across resizes; enough once there are min_loss_points.
  const std::vector<LossInterval::Point>& loss_points() const { return points_; }
  bool enough_loss_points() const {
    return static_cast<std::int64_t>(points_.size()) >= common_.min_loss_points;
  }

 private:
  /// When `explore` is on, proposes the next unmeasured worker count for the `model` that did not
  /// fit (with `configurations` measured, `status`, `needs` required), then cools down.
  void explore(PolicyContext& ctx, std::string_view model, std::size_t configurations,
               std::string_view status, int needs, int lo, int hi);
  void flush_loss();

  const char* name_;
  const char* loss_model_;
  ModelOptions common_;
  ConfigLog log_;
  LossInterval interval_;
  std::vector<LossInterval::Point> points_;  // (x, mean loss − offset, steps, workers)
  bool loss_seen_ = false;
  bool no_loss_warned_ = false;
  std::int64_t quiet_until_ = 0;  // no evaluation before this step (the cool-down)
};

}  // namespace kf::detail
