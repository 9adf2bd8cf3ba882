// SPDX-License-Identifier: Apache-2.0
// Throughput monitoring: window throughput as total samples ÷ total
// time (never the mean of per-step rates), the step-time EMA, Or et al.'s scale-out rule by
// throughput gain per added worker with its cost/utility variant, KungFu's interference vote,
// Or et al.'s straggler score, and the nccl-tests bus bandwidth.
// Everything here is arithmetic on values the caller measured; the caller takes the step time
// Δ_k at the step boundary (after the allreduce and the update; from rank 0 or the maximum over
// ranks) and feeds it in.
// Thread-safety: free functions are pure; the classes are not synchronized (one owner).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "kf/monitor/ema.hpp"

namespace kf::monitor {

using Seconds = std::chrono::duration<double>;

/// One optimizer step as a worker saw it.
struct StepSample {
  double job_samples = 0.0;     ///< M: samples of the step over all workers
  double worker_samples = 0.0;  ///< b_w·s: this worker's samples of the step
  Seconds time{0.0};            ///< Δ_k = t_k − t_{k−1}
};

struct ThroughputWindowOptions {
  std::size_t window_steps = 100;  ///< W: the last W steps count
  /// Steps discarded after construction and after each restart (N_warm = 2); the
  /// first steps after a change carry connection set-up and warm-up.
  std::size_t warmup_steps = 2;
};

/// Throughput over the last W steps: Σ samples / Σ time, the harmonic mean of the
/// per-step rates. The arithmetic mean of rates overstates throughput whenever step times vary.
class ThroughputWindow {
 public:
  /// Throws: std::invalid_argument when window_steps is 0.
  explicit ThroughputWindow(ThroughputWindowOptions options = {});

  /// Adds one step. Returns false when it was discarded: a warm-up step, or a time that is
  /// not a positive finite number, or a sample count that is negative or not finite.
  bool record(const StepSample& step) noexcept;
  /// Starts a new window: call after any change of (K, b, s, communication strategy). The
  /// next warmup_steps steps are discarded.
  void restart() noexcept;

  /// Σ M / Σ Δ over the window (samples/s); NaN when empty.
  double job_samples_per_second() const noexcept;
  /// Σ b_w·s / Σ Δ over the window (samples/s); NaN when empty.
  double worker_samples_per_second() const noexcept;
  Seconds total_time() const noexcept;
  std::size_t steps() const noexcept { return steps_.size(); }

 private:
  ThroughputWindowOptions options_;
  std::deque<StepSample> steps_;
  std::size_t to_discard_;
};

/// Debiased EMA of the step time (smooth seconds per step, then invert; never smooth a
/// rate).
class StepTimeEma {
 public:
  /// Expects 0 ≤ theta < 1.
  explicit StepTimeEma(double theta = 0.9) noexcept : theta_(theta) {}
  /// Ignores a time that is not a positive finite number; returns whether it was taken.
  bool record(Seconds step_time) noexcept;
  /// The smoothed step time; NaN before the first record.
  Seconds step_time() const noexcept { return Seconds(ema_.value()); }
  /// samples_per_step / smoothed step time (samples/s).
  double samples_per_second(double samples_per_step) const noexcept;

 private:
  double theta_;
  DebiasedEma ema_;
};

/// One pair of consecutive worker counts of Or et al.'s rule.
struct ScalingPair {
  int from_workers = 0;            ///< k_a
  int to_workers = 0;              ///< k_b > k_a
  double slope = 0.0;              ///< (R_b − R_a)/(k_b − k_a): samples/s per added worker
  double per_worker_before = 0.0;  ///< R_a/k_a
  double efficiency = 0.0;         ///< slope / per_worker_before
  bool pass = false;               ///< efficiency > threshold
};

/// Throughput scaling efficiency: s(k_a→k_b) = ((R_b − R_a)/(k_b − k_a)) / (R_a/k_a).
double scaling_efficiency(int from_workers, double from_throughput, int to_workers,
                          double to_throughput) noexcept;

struct ScaleOutOptions {
  double threshold = 0.1;  ///< AUTOSCALING_THROUGHPUT_SCALING_THRESHOLD
  int spawn_size = 4;      ///< workers added per scale-out
};

struct ScaleOutDecision {
  enum class Action : std::uint8_t {
    add,     ///< one data point, or every pair passes: go to target_workers (= max k + spawn)
    settle,  ///< the first failing pair is k_a→k_b: go to (or stay at) target_workers = k_a
  };
  Action action = Action::add;
  int target_workers = 0;
  std::vector<ScalingPair> pairs;  ///< consecutive distinct k, ascending
};

/// Or et al.'s scale-out rule over the average global throughput R_k (samples/s)
/// measured at each worker count k tried. The policy's bookkeeping around it (evaluate every N
/// steps on one rank, min_batches_for_staying, min_consecutive_passes_for_remove) is state of
/// the policy that calls this, not of the rule.
/// Throws: std::invalid_argument when the map is empty, a k < 1, a throughput is not a positive
/// finite number, or spawn_size < 1.
ScaleOutDecision scale_out_decision(const std::map<int, double>& throughput_by_workers,
                                    ScaleOutOptions options = {});

/// A worker count with its measured global throughput.
struct WorkerThroughput {
  int workers = 0;
  double samples_per_second = 0.0;
};

/// The job's remaining work and prices for Or et al.'s cost/utility variant.
struct ScaleOutCostModel {
  double global_batch = 0.0;             ///< M (samples per step)
  double remaining_steps = 0.0;          ///< remaining batches
  double price_per_worker_second = 0.0;  ///< cost units per worker per second
  Seconds elapsed{0.0};                  ///< time spent so far
};

struct ScaleOutCostCheck {
  Seconds step_time_before{0.0};   ///< t = M/R
  Seconds step_time_after{0.0};    ///< t = M/R
  double cost_before = 0.0;        ///< t·k·remaining·price
  double cost_after = 0.0;         ///< t·k·remaining·price
  Seconds completion_before{0.0};  ///< T = elapsed + remaining·t
  Seconds completion_after{0.0};   ///< T = elapsed + remaining·t
  double utility_gain = 0.0;       ///< U(T_after) − U(T_before)
  bool pass = false;               ///< utility_gain > cost_after − cost_before
};

/// Or et al.'s cost condition: a change passes if the utility of the earlier completion
/// outweighs the extra cost. utility: a decreasing function of the completion time in seconds.
ScaleOutCostCheck check_scale_out_cost(const ScaleOutCostModel& model, WorkerThroughput before,
                                       WorkerThroughput after,
                                       const std::function<double(double)>& utility);

/// KungFu's interference vote: 1 when current < threshold·reference (0.8 there).
bool interference_vote(double reference, double current, double threshold = 0.8) noexcept;
/// KungFu's switch rule: a strict majority, votes > ⌊ranks/2⌋.
bool strict_majority(int votes, int ranks) noexcept;

/// Each worker's compute throughput divided by the median over workers (numpy's median: the
/// mean of the two middle values for an even count), as Or et al.'s straggler rule takes it.
/// Throws: std::invalid_argument when empty or the median is not positive.
std::vector<double> median_fractions(std::span<const double> compute_throughputs);

/// Or et al.'s straggler score of one worker: an EWMA with weight alpha on the new
/// fraction, initialised with the first one; a straggler while below threshold.
class StragglerScore {
 public:
  explicit StragglerScore(double alpha = 0.1, double threshold = 0.8) noexcept
      : ema_(1.0 - alpha), threshold_(threshold) {}
  void observe(double median_fraction) noexcept { ema_.update(median_fraction); }
  double value() const noexcept { return ema_.value(); }
  /// False before the first observation.
  bool straggler() const noexcept { return ema_.updates() > 0 && ema_.value() < threshold_; }

 private:
  FirstValueEma ema_;
  double threshold_;
};

/// Allreduce bandwidths in the nccl-tests convention (bytes/s): algbw = bytes/time,
/// busbw = algbw·2(n−1)/n, comparable with the link bandwidth whatever n is.
struct AllreduceBandwidth {
  double algorithm_bytes_per_second = 0.0;
  double bus_bytes_per_second = 0.0;
};
AllreduceBandwidth allreduce_bandwidth(double bytes, Seconds time, int ranks) noexcept;

}  // namespace kf::monitor
