// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/throughput.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <stdexcept>

namespace kf::monitor {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool positive_finite(double v) { return v > 0.0 && std::isfinite(v); }

}  // namespace

ThroughputWindow::ThroughputWindow(ThroughputWindowOptions options)
    : options_(options), to_discard_(options.warmup_steps) {
  if (options_.window_steps == 0) {
    throw std::invalid_argument("ThroughputWindow: window_steps must be at least 1");
  }
}

bool ThroughputWindow::record(const StepSample& step) noexcept {
  if (!positive_finite(step.time.count()) || !(step.job_samples >= 0.0) ||
      !std::isfinite(step.job_samples) || !(step.worker_samples >= 0.0) ||
      !std::isfinite(step.worker_samples)) {
    return false;
  }
  if (to_discard_ > 0) {
    --to_discard_;
    return false;
  }
  steps_.push_back(step);
  if (steps_.size() > options_.window_steps) steps_.pop_front();
  return true;
}

void ThroughputWindow::restart() noexcept {
  steps_.clear();
  to_discard_ = options_.warmup_steps;
}

Seconds ThroughputWindow::total_time() const noexcept {
  // Summed afresh on every read: a running sum that subtracts evicted steps drifts.
  Seconds total{0.0};
  for (const StepSample& s : steps_) total += s.time;
  return total;
}

double ThroughputWindow::job_samples_per_second() const noexcept {
  if (steps_.empty()) return kNaN;
  double samples = 0.0;
  for (const StepSample& s : steps_) samples += s.job_samples;
  return samples / total_time().count();
}

double ThroughputWindow::worker_samples_per_second() const noexcept {
  if (steps_.empty()) return kNaN;
  double samples = 0.0;
  for (const StepSample& s : steps_) samples += s.worker_samples;
  return samples / total_time().count();
}

bool StepTimeEma::record(Seconds step_time) noexcept {
  if (!positive_finite(step_time.count())) return false;
  ema_.update(step_time.count(), theta_);
  return true;
}

double StepTimeEma::samples_per_second(double samples_per_step) const noexcept {
  return samples_per_step / ema_.value();
}

double scaling_efficiency(int from_workers, double from_throughput, int to_workers,
                          double to_throughput) noexcept {
  const double slope = (to_throughput - from_throughput) / (to_workers - from_workers);
  return slope / (from_throughput / from_workers);
}

ScaleOutDecision scale_out_decision(const std::map<int, double>& throughput_by_workers,
                                    ScaleOutOptions options) {
  if (throughput_by_workers.empty()) {
    throw std::invalid_argument("scale_out_decision: no throughput measured yet");
  }
  if (options.spawn_size < 1) {
    throw std::invalid_argument("scale_out_decision: spawn_size must be at least 1");
  }
  for (const auto& [k, r] : throughput_by_workers) {
    if (k < 1 || !positive_finite(r)) {
      throw std::invalid_argument(
          "scale_out_decision: worker counts must be >= 1 and throughputs positive");
    }
  }
  ScaleOutDecision decision;
  for (auto a = throughput_by_workers.begin(), b = std::next(a); b != throughput_by_workers.end();
       ++a, ++b) {
    ScalingPair pair;
    pair.from_workers = a->first;
    pair.to_workers = b->first;
    pair.slope = (b->second - a->second) / (b->first - a->first);
    pair.per_worker_before = a->second / a->first;
    pair.efficiency = pair.slope / pair.per_worker_before;
    // Or et al.'s paper: "passes if s > threshold"; their code stops when s < threshold,
    // so the two differ only at equality.
    pair.pass = pair.efficiency > options.threshold;
    decision.pairs.push_back(pair);
  }
  const auto failing = std::find_if(decision.pairs.begin(), decision.pairs.end(),
                                    [](const ScalingPair& p) { return !p.pass; });
  if (failing == decision.pairs.end()) {
    decision.action = ScaleOutDecision::Action::add;
    decision.target_workers = throughput_by_workers.rbegin()->first + options.spawn_size;
  } else {
    decision.action = ScaleOutDecision::Action::settle;
    decision.target_workers = failing->from_workers;
  }
  return decision;
}

ScaleOutCostCheck check_scale_out_cost(const ScaleOutCostModel& model, WorkerThroughput before,
                                       WorkerThroughput after,
                                       const std::function<double(double)>& utility) {
  ScaleOutCostCheck c;
  c.step_time_before = Seconds(model.global_batch / before.samples_per_second);
  c.step_time_after = Seconds(model.global_batch / after.samples_per_second);
  const double price_per_step = model.remaining_steps * model.price_per_worker_second;
  c.cost_before = c.step_time_before.count() * before.workers * price_per_step;
  c.cost_after = c.step_time_after.count() * after.workers * price_per_step;
  c.completion_before = model.elapsed + model.remaining_steps * c.step_time_before;
  c.completion_after = model.elapsed + model.remaining_steps * c.step_time_after;
  c.utility_gain = utility(c.completion_after.count()) - utility(c.completion_before.count());
  c.pass = c.utility_gain > c.cost_after - c.cost_before;
  return c;
}

bool interference_vote(double reference, double current, double threshold) noexcept {
  return current < threshold * reference;
}

bool strict_majority(int votes, int ranks) noexcept { return votes > ranks / 2; }

std::vector<double> median_fractions(std::span<const double> compute_throughputs) {
  if (compute_throughputs.empty()) {
    throw std::invalid_argument("median_fractions: no throughputs");
  }
  std::vector<double> sorted(compute_throughputs.begin(), compute_throughputs.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  if (!positive_finite(median)) {
    throw std::invalid_argument("median_fractions: the median throughput must be positive");
  }
  std::vector<double> fractions(compute_throughputs.begin(), compute_throughputs.end());
  for (double& f : fractions) f /= median;
  return fractions;
}

AllreduceBandwidth allreduce_bandwidth(double bytes, Seconds time, int ranks) noexcept {
  const double alg = bytes / time.count();
  return {alg, alg * 2.0 * (ranks - 1) / ranks};
}

}  // namespace kf::monitor
