// SPDX-License-Identifier: Apache-2.0
// stragglers: acts on the workers' straggler scores (PolicyInputs::speeds; docs/monitoring.md,
// "Stragglers"), in two stages.
//
// 1. Balance. While some worker is slow and the setting "balance" is off, it is turned on
//    (`balance: true`), so that the slow worker takes a smaller part of each step and nobody
//    waits for it (docs/training-modes.md, "Stragglers: balanced batches").
// 2. Revoke. A worker that has been slow for `revoke_after` seconds and is below `revoke_below`
//    of the fastest worker now is revoked, with notice: it finishes its step and leaves, and a
//    hot spare (or, under autoscale, a worker on an offered slot) takes its place. One worker per
//    decision, the slowest; none while that would leave fewer than `min_workers` (else the
//    setting min_workers, else 1); after a revoke none for `cooldown` seconds.
//
// Time is the job's: the sum of the metric step_time over the steps (the same on every worker,
// so every worker decides alike, and a replay decides as the live run did). A worker's time as a
// straggler restarts when it recovers (the scores' own hysteresis: slow below 0.7 of the
// fastest, recovered above 0.85), so a worker near the line does not collect time piecewise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "stragglers";
constexpr std::int64_t kMaxWorkers = 1'000'000;
constexpr double kMaxSeconds = 1e9;

struct Options {
  bool balance = true;
  bool revoke = true;
  double revoke_below = 0.5;
  double revoke_after = 30;
  double cooldown = 60;
  std::optional<std::int64_t> min_workers;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.balance = r.boolean("balance", o.balance);
  o.revoke = r.boolean("revoke", o.revoke);
  o.revoke_below = r.number("revoke_below", o.revoke_below, {0.0, 1.0, true, false});
  o.revoke_after = r.number("revoke_after", o.revoke_after, {0.0, kMaxSeconds, false, false});
  o.cooldown = r.number("cooldown", o.cooldown, {0.0, kMaxSeconds, false, false});
  o.min_workers = r.optional_integer("min_workers", 1, kMaxWorkers);
  r.reject_unknown();
  return o;
}

class Stragglers final : public Policy {
 public:
  explicit Stragglers(Options o) : o_(o) {}

  std::string name() const override { return kName; }

  void after_step(PolicyContext& ctx) override {
    const double dt = ctx.metric("step_time", 0.0);
    if (std::isfinite(dt) && dt > 0) elapsed_ += dt;
    // Each worker's time as a straggler; the others (and those gone) are forgotten.
    std::map<std::string, double> still;
    const WorkerSpeed* slowest = nullptr;
    for (const auto& w : ctx.speeds()) {
      if (!w.slow) continue;
      const auto it = slow_for_.find(w.worker);
      still[w.worker] = (it == slow_for_.end() ? 0.0 : it->second) + (std::isfinite(dt) ? dt : 0);
      if (slowest == nullptr || w.vs_fastest < slowest->vs_fastest) slowest = &w;
    }
    slow_for_ = std::move(still);
    if (slowest == nullptr) return;

    if (o_.balance && !ctx.settings().value("balance", false)) {
      ctx.set_balance(true, slowest->worker + " is slow: " + short_number(slowest->vs_fastest) +
                                " of the fastest worker's speed");
    }
    if (!o_.revoke || elapsed_ < quiet_until_) return;
    const std::int64_t least = min_workers(ctx.settings());
    if (ctx.workers() - 1 < least) return;
    const double slow_for = slow_for_[slowest->worker];
    if (slowest->vs_fastest >= o_.revoke_below || slow_for < o_.revoke_after) return;
    ctx.revoke(slowest->worker, short_number(slowest->vs_fastest) +
                                    " of the fastest worker's speed, slow for " +
                                    short_number(slow_for) + " s");
    slow_for_.erase(slowest->worker);
    quiet_until_ = elapsed_ + o_.cooldown;
  }

 private:
  std::int64_t min_workers(const nlohmann::json& settings) const {
    if (o_.min_workers) return *o_.min_workers;
    if (settings.contains("min_workers") && settings["min_workers"].is_number_integer()) {
      return std::max<std::int64_t>(1, settings["min_workers"].get<std::int64_t>());
    }
    return 1;
  }

  static std::string short_number(double x) { return format_number(std::round(x * 100) / 100); }

  Options o_;
  double elapsed_ = 0;      // the job's time: Σ step_time
  double quiet_until_ = 0;  // no revoke before this (the cool-down)
  std::map<std::string, double> slow_for_;
};

}  // namespace

std::unique_ptr<Policy> make_stragglers_policy(const nlohmann::json& params) {
  return std::make_unique<Stragglers>(read_options(params));
}

}  // namespace kf::detail
