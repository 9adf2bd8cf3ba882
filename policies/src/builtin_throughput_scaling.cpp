// SPDX-License-Identifier: Apache-2.0
// throughput-scaling: Or et al.'s scale-out by throughput gain per added worker
// (Or, Zhang, Freedman, MLSys 2020).
//
// Observations: for every worker count k, the job throughput R_k = Σ samples / Σ step_time over
// the steps run at k (a ratio of sums, never the mean of per-step rates), after discarding
// warmup_steps steps at each change of workers, batch size or algorithm. They are kept keyed by k
// across resizes, and cleared when the global batch changes (throughputs at another batch are not
// comparable).
//
// Every `every` steps, once the current k has min_steps counted steps, the counts with min_steps
// steps go through monitor::scale_out_decision: with one count, or when every consecutive pair
// has a scaling efficiency s(k_a→k_b) above threshold, the target is the largest k tried
// plus spawn_size; otherwise it is k_a of the first failing pair. The target is clamped to
// [min_workers, max_workers]. A larger target is proposed at once (it measures a new point); a
// smaller one (giving workers back) only when min_consecutive_passes_for_remove consecutive
// evaluations agree on it (how kf reads Or et al.'s parameter). After a proposal no other is
// made for `cooldown` steps, so that a resize that takes a while is not proposed twice.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"
#include "kf/monitor/throughput.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "throughput-scaling";
constexpr std::int64_t kMaxSteps = 1'000'000'000;
constexpr std::int64_t kMaxWorkers = 1'000'000;

struct Options {
  std::int64_t spawn_size = 4;
  double threshold = 0.1;
  std::int64_t min_steps = 100;
  std::int64_t every = 50;
  std::int64_t min_consecutive_passes_for_remove = 3;
  std::int64_t warmup_steps = 2;
  std::int64_t cooldown = 100;
  std::optional<std::int64_t> min_workers;
  std::optional<std::int64_t> max_workers;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.spawn_size = r.integer("spawn_size", o.spawn_size, 1, kMaxWorkers);
  o.threshold = r.number("threshold", o.threshold, {0.0, 10.0, false, false});
  o.min_steps = r.integer("min_steps", o.min_steps, 1, kMaxSteps);
  o.every = r.integer("every", o.every, 1, kMaxSteps);
  o.min_consecutive_passes_for_remove = r.integer(
      "min_consecutive_passes_for_remove", o.min_consecutive_passes_for_remove, 1, 1'000'000);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  o.min_workers = r.optional_integer("min_workers", 1, kMaxWorkers);
  o.max_workers = r.optional_integer("max_workers", 1, kMaxWorkers);
  r.reject_unknown();
  r.require_ordered("min_workers", o.min_workers, "max_workers", o.max_workers);
  return o;
}

/// A worker-count bound: the parameter, else the setting, else `fallback`. A setting below 1
/// is no bound (the session reads max_workers <= 0 as unbounded too).
std::int64_t bound(const std::optional<std::int64_t>& param, const nlohmann::json& settings,
                   const char* key, std::int64_t fallback) {
  if (param) return *param;
  if (settings.contains(key) && settings[key].is_number_integer() &&
      settings[key].get<std::int64_t>() >= 1) {
    return std::min(settings[key].get<std::int64_t>(), kMaxWorkers);
  }
  return fallback;
}

class ThroughputScaling final : public Policy {
 public:
  explicit ThroughputScaling(Options o) : o_(o) {}

  std::string name() const override { return kName; }

  void on_membership_change(PolicyContext&) override { discard_ = o_.warmup_steps; }

  void after_step(PolicyContext& ctx) override {
    track_configuration(ctx);
    record(ctx);
    if (ctx.step() % o_.every != 0 || ctx.step() < quiet_until_) return;
    const int k = ctx.workers();
    const auto here = seen_.find(k);
    if (here == seen_.end() || here->second.steps < o_.min_steps) return;  // validity gate
    evaluate(ctx, k);
  }

 private:
  struct Seen {
    double samples = 0.0;
    double seconds = 0.0;
    std::int64_t steps = 0;
  };

  // A change of workers, batch or algorithm restarts the warm-up; a batch change also drops the
  // observations, which were measured at another global batch.
  void track_configuration(const PolicyContext& ctx) {
    const auto& s = ctx.settings();
    const nlohmann::json batch = s.value("batch_size", nlohmann::json());
    const nlohmann::json algorithm = s.value("algorithm", nlohmann::json());
    if (!started_ || batch != batch_) {
      seen_.clear();
      remove_streak_ = 0;
      discard_ = o_.warmup_steps;
    } else if (ctx.workers() != workers_ || algorithm != algorithm_) {
      discard_ = o_.warmup_steps;
    }
    started_ = true;
    workers_ = ctx.workers();
    batch_ = batch;
    algorithm_ = algorithm;
  }

  void record(const PolicyContext& ctx) {
    if (!ctx.has_metric("step_time") || !ctx.has_metric("samples")) return;
    const double t = ctx.metric("step_time");
    const double m = ctx.metric("samples");
    if (!std::isfinite(t) || t <= 0.0 || !std::isfinite(m) || m < 0.0) return;
    if (discard_ > 0) {
      --discard_;
      return;
    }
    Seen& s = seen_[ctx.workers()];
    s.samples += m;
    s.seconds += t;
    ++s.steps;
  }

  void evaluate(PolicyContext& ctx, int k) {
    std::map<int, double> rates;
    for (const auto& [workers, s] : seen_) {
      if (s.steps >= o_.min_steps && s.samples > 0.0) rates[workers] = s.samples / s.seconds;
    }
    if (rates.count(k) == 0) return;  // nothing was processed at k: no throughput to compare
    const monitor::ScaleOutDecision d =
        monitor::scale_out_decision(rates, {o_.threshold, static_cast<int>(o_.spawn_size)});
    const auto& settings = ctx.settings();
    const std::int64_t lo = bound(o_.min_workers, settings, "min_workers", 1);
    const std::int64_t hi =
        std::max(lo, bound(o_.max_workers, settings, "max_workers", kMaxWorkers));
    const auto target = static_cast<int>(std::clamp<std::int64_t>(d.target_workers, lo, hi));
    if (target == k) {
      remove_streak_ = 0;
      return;
    }
    std::string why = describe(d, rates);
    if (target < k) {
      if (++remove_streak_ < o_.min_consecutive_passes_for_remove) return;
      why += " for " + std::to_string(remove_streak_) + " evaluations";
    }
    if (target != d.target_workers) {
      why += "; bounded by [" + std::to_string(lo) + ", " +
             (hi == kMaxWorkers ? std::string("unbounded") : std::to_string(hi)) + "]";
    }
    ctx.resize(target,
               why + ": " + std::to_string(k) + " -> " + std::to_string(target) + " workers");
    remove_streak_ = 0;
    quiet_until_ = ctx.step() + o_.cooldown;
  }

  std::string describe(const monitor::ScaleOutDecision& d,
                       const std::map<int, double>& rates) const {
    std::string s;
    for (const auto& [k, r] : rates) {
      s += (s.empty() ? "R={" : ", ") + std::to_string(k) + ": " + short_number(r);
    }
    s += "} samples/s";
    for (const auto& p : d.pairs) {
      s += ", s(" + std::to_string(p.from_workers) + "->" + std::to_string(p.to_workers) +
           ")=" + short_number(p.efficiency);
      if (!p.pass) {
        return s + " <= threshold " + short_number(o_.threshold) + ": settle at " +
               std::to_string(p.from_workers);
      }
    }
    return s + (d.pairs.empty() ? ": one worker count measured" : ": every pair passes") +
           ", add " + std::to_string(o_.spawn_size) + " past " +
           std::to_string(rates.rbegin()->first);
  }

  Options o_;
  std::map<int, Seen> seen_;  // keyed by worker count, kept across resizes
  bool started_ = false;
  int workers_ = 0;
  nlohmann::json batch_;
  nlohmann::json algorithm_;
  std::int64_t discard_ = 0;        // warm-up steps still to discard
  std::int64_t remove_streak_ = 0;  // consecutive evaluations that would give workers back
  std::int64_t quiet_until_ = 0;    // no proposal before this step (the cool-down)
};

}  // namespace

std::unique_ptr<Policy> make_throughput_scaling_policy(const nlohmann::json& params) {
  return std::make_unique<ThroughputScaling>(read_options(params));
}

}  // namespace kf::detail
