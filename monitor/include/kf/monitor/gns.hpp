// SPDX-License-Identifier: Apache-2.0
// The gradient-noise-scale (GNS) operator (McCandlish et al. 2018), and the quantities derived from
// it: AdaScale gain r(S), Pollux efficiency E(M), LR scaling rules, scale-invariant progress,
// McCandlish's steps/examples trade-off.
// Data parallelism gives two batch sizes per optimizer step for free: the n = K·s local micro-batch
// gradients (batch b each, squared norms taken before the gradient allreduce) and the synchronized
// mean gradient (batch M = n·b, squared norm C after it). GnsEstimator turns them into unbiased
// per-step estimates of |G|² and tr(Σ), smooths numerator and denominator separately (debiased EMA,
// θ = θ0^S) and reads B_simple = tr(Σ)/|G|² out with read-out guards. Pure arithmetic: it does no
// I/O and never talks to other ranks; the caller feeds it globally reduced scalars so that all
// ranks compute bit-identical values (see docs/monitoring.md).
// Thread-safety: free functions are pure; GnsEstimator is not synchronized (one owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kf/monitor/ema.hpp"

namespace kf::monitor {

/// One step's unbiased estimates (unclamped: either can be negative).
struct GnsPoint {
  double sqr = 0.0;       ///< |G|²^, squared norm of the true gradient
  double tr_sigma = 0.0;  ///< trΣ^, trace of the per-example gradient covariance
};

/// The two-batch estimator of McCandlish et al.: squared norms of mean gradients
/// taken at the same parameters on a small batch (small_batch samples) and a large one
/// (big_batch > small_batch samples).
GnsPoint two_batch_estimate(double small_sqnorm, double small_batch, double big_sqnorm,
                            double big_batch) noexcept;

/// The data-parallel form: mean_local_sqnorm A = (1/n)·Σ_j |g_j|² over the n
/// micro-batch gradients of local_batch b samples each, global_sqnorm C = |ḡ|² of their mean.
/// With D = A − C: |G|²^ = C − D/(n−1), trΣ^ = b·n·D/(n−1). Expects count n ≥ 2.
GnsPoint data_parallel_estimate(double mean_local_sqnorm, double global_sqnorm, double count,
                                double local_batch) noexcept;

/// KungFu's per-rank variant (KAT-GNS-D2), for comparison only: the two-batch estimators with this
/// rank's own local norm as the small batch (b) and C as the big one (n·b). Ranks disagree,
/// and the variance is higher than the averaged form's. Negative values are returned
/// unchanged. Expects count n ≥ 2.
GnsPoint per_rank_estimate(double own_sqnorm, double global_sqnorm, double count,
                           double local_batch) noexcept;

/// How the estimator averages the per-step estimates over steps.
enum class GnsSmoothing : std::uint8_t {
  debiased_ema,  ///< the default: θ_t = θ0^(M_t/M0)
  mean,          ///< the plain mean of every accepted step (θ_t = 1 − 1/t); for tests and
                 ///< offline analysis (the statistical known-answer tests)
};

struct GnsOptions {
  /// M0: the reference global batch, the one the base learning rate was tuned for (samples).
  double base_batch = 0.0;
  /// θ0 of θ_t = θ0^(M_t/M0); 0 < θ0 < 1.
  double theta_base = 0.999;
  GnsSmoothing smoothing = GnsSmoothing::debiased_ema;
  /// The estimate is not valid until n_eff reaches this (20).
  double min_effective_steps = 20.0;
  /// ... and until this many base-equivalent steps (Σ_t M_t/M0) were accepted;
  /// unset: 1/(1 − θ0).
  std::optional<double> min_base_steps;
};

/// One optimizer step's inputs. Spans are per parameter group (P values each) and
/// are read only during GnsEstimator::update.
/// Every gradient is the mean over the samples of its micro-batch.
struct GnsStep {
  /// Σ_j |g_j|² over all n = workers·accumulation_steps micro-batch gradients of the step (the
  /// allreduce-sum of each worker's s local squared norms, taken before the gradient allreduce).
  /// May be of loss-scaled gradients: it is divided by loss_scale² here.
  std::span<const double> local_sqnorm_sum;
  /// C = |ḡ|² of the synchronized mean gradient, unscaled and divided by the accumulation
  /// count. With n = 1 it is |g_t|².
  std::span<const double> global_sqnorm;
  /// Only for n = 1 (one worker, no accumulation; the difference estimator):
  /// |(g_{t−1} + g_t)/2|², unscaled, where g_{t−1} is the gradient of the last step given to
  /// update() that was not skipped. Empty when the caller holds no previous gradient.
  std::span<const double> pair_sqnorm;
  std::int64_t workers = 1;             ///< K
  std::int64_t accumulation_steps = 1;  ///< s
  double local_batch = 0.0;             ///< b: samples per micro-batch
  double loss_scale = 1.0;              ///< L (mixed precision); 1 without loss scaling
  bool finite = true;                   ///< false: the step overflowed (e.g. fp16 loss scaler)
};

enum class GnsStepStatus : std::uint8_t {
  accepted,            ///< the averages took the step
  skipped_non_finite,  ///< a NaN/Inf input (or finite = false): nothing changed
  no_previous_step,    ///< n = 1 without a previous gradient: this step's norm is kept as the
                       ///< previous one, the averages did not change
};

const char* to_string(GnsStepStatus status) noexcept;

/// What update() did with one step.
struct GnsStepResult {
  GnsStepStatus status = GnsStepStatus::accepted;
  /// This step's estimates summed over groups (NaN unless accepted).
  GnsPoint point;
  /// The step came from the difference estimator (n = 1): biased by the parameter drift.
  bool biased = false;
};

/// The smoothed read-out.
struct GnsEstimate {
  /// Σ_groups of the averaged |G|²^ and trΣ^, unclamped; NaN before the first accepted step.
  GnsPoint raw;
  /// The read-out guards: sqr = max(raw.sqr, 0), tr_sigma = max(raw.tr_sigma, 1e-6·M0).
  GnsPoint read;
  /// B_simple = read.tr_sigma / read.sqr (samples); +∞ when read.sqr = 0 ("noise dominated:
  /// any batch size up to the maximum is efficient"); NaN before the first accepted step.
  double b_simple = 0.0;
  double base_batch = 0.0;       ///< M0
  double effective_steps = 0.0;  ///< n_eff = (Σw)²/Σw² of the averages' weights
  double base_steps = 0.0;       ///< Σ M_t/M0 over the accepted steps
  std::int64_t steps = 0;        ///< accepted steps since the last reset
  /// Some accepted step came from the difference estimator; cleared, with the averages,
  /// at the first multi-sample step after them.
  bool biased = false;
  /// The last update's outcome (accepted when no step was given yet).
  GnsStepStatus last_step = GnsStepStatus::accepted;
  /// Enough steps for a decision: n_eff ≥ min_effective_steps and
  /// base_steps ≥ min_base_steps. Consumers must not act on an estimate that is not valid.
  bool valid = false;
  /// Why the estimate is not valid; empty when valid.
  std::string reason;

  /// AdaScale gain r(S) of a candidate scale S = M/M0 from the guarded values.
  double gain(double scale) const noexcept;
  /// Pollux efficiency E(M) of a candidate global batch M, with φ = b_simple.
  double efficiency(double global_batch) const noexcept;
};

/// The GNS operator's state: per parameter group, the averages of |G|²^ and trΣ^ (in units
/// that do not depend on the batch size, so they survive resizes unchanged), the previous
/// local norm for the difference estimator, and the `biased` flag.
///
/// Per optimizer step (see GnsStep for the exact inputs):
///   1. If any input is NaN/Inf or finite is false: skip the step, change nothing.
///   2. n = K·s ≥ 2: A = local_sqnorm_sum/(n·L²), D = A − C, estimate |G|²^ and trΣ^;
///      scale S = n·b/M0. If the averages hold difference-estimator samples, reset them first
///      (AdaptDL does the same when it switches from biased to unbiased samples).
///   3. n = 1: with a previous local norm and pair_sqnorm, the two steps are n = 2 samples:
///      A = (|g_{t−1}|² + |g_t|²)/2, C = pair_sqnorm, S = 2·b/M0, flagged biased. Without
///      them the step only records |g_t|² as the previous norm.
///   4. Each group's averages take the step with θ = θ0^S (or 1 − 1/t for the plain mean).
class GnsEstimator {
 public:
  /// Throws: std::invalid_argument when base_batch ≤ 0, theta_base is not in (0, 1), or a
  /// threshold is negative or not finite.
  explicit GnsEstimator(GnsOptions options);

  /// Takes one optimizer step (steps 1–4 above).
  /// Throws: std::invalid_argument when the shape is wrong: workers or accumulation_steps < 1,
  /// local_batch ≤ 0, no groups, span lengths that differ from each other or from the group
  /// count of earlier steps, or pair_sqnorm of another length when given with n = 1.
  GnsStepResult update(const GnsStep& step);

  /// The guarded read-out.
  GnsEstimate estimate() const;

  /// Group i's averages, unclamped (for per-group gain); NaN before the first accepted
  /// step. Expects i < groups().
  GnsPoint group(std::size_t i) const noexcept;
  std::size_t groups() const noexcept { return groups_.size(); }
  const GnsOptions& options() const noexcept { return options_; }

  /// Forgets everything (averages, previous norm, biased flag, group count).
  void reset() noexcept;

 private:
  struct Group {
    DebiasedEma sqr;
    DebiasedEma tr_sigma;
    double previous_sqnorm = 0.0;  // |g_{t−1}|², unscaled (n = 1 only)
  };

  void check_shape(const GnsStep& step, std::int64_t count) const;
  void take(std::span<const GnsPoint> points, double scale, bool biased);

  GnsOptions options_;
  double min_base_steps_;
  std::vector<Group> groups_;
  std::vector<GnsPoint> points_;  // this step's per-group estimates (kept to avoid allocations)
  bool have_previous_ = false;
  bool biased_ = false;
  double base_steps_ = 0.0;
  std::int64_t steps_ = 0;
  GnsStepStatus last_step_ = GnsStepStatus::accepted;
};

/// AdaScale gain ratio: r(S) = (σ² + μ²)/(σ²/S + μ²) with σ² = tr_sigma/M0 and
/// μ² = sqr. Pass guarded values (GnsEstimate::read): then 1 ≤ r ≤ S. 1 when the denominator
/// is 0 (AdaptDL's fallback).
double gain_ratio(GnsPoint guarded, double base_batch, double scale) noexcept;

/// Pollux statistical efficiency: E(M) = (φ + M0)/(φ + M), φ = B_simple (PGNS for
/// adaptive optimizers). φ = +∞ gives 1 for every M; φ = 0 gives M0/M. Equals r(S)/S.
double efficiency(double phi, double base_batch, double global_batch) noexcept;

/// LR scaling rules: the factor η/η0 for batch scale S = M/M0.
enum class LrScaling : std::uint8_t {
  linear,       ///< S (Goyal et al.)
  square_root,  ///< √S (Krizhevsky)
  adascale,     ///< r(S) (AdaScale)
  adamscale,    ///< √r(S) (AdaptDL, for Adam/AdamW/RMSProp)
};

/// η/η0 under `rule`; gain is r(S), read only by adascale and adamscale. Compute it from the
/// current S including accumulation, multiply the group LR before the optimizer step and
/// restore it after.
double lr_factor(LrScaling rule, double scale, double gain) noexcept;

/// Scale-invariant iterations τ: τ ← τ + r_t after each step. LR schedules and stopping
/// rules are evaluated at τ (base-batch steps) instead of the step count.
class ScaleInvariantProgress {
 public:
  void advance(double gain) noexcept { base_steps_ += gain; }
  double base_steps() const noexcept { return base_steps_; }

 private:
  double base_steps_ = 0.0;
};

/// McCandlish et al.'s trade-off (KAT-EFF-McC) at batch B for noise scale B_noise.
struct BatchTradeoff {
  double steps_ratio = 0.0;      ///< N_steps/N_steps,min = 1 + B_noise/B
  double examples_ratio = 0.0;   ///< N_ex/N_ex,min = 1 + B/B_noise
  double step_size_ratio = 0.0;  ///< ε_opt/ε_max = 1/(1 + B_noise/B)
};
BatchTradeoff batch_tradeoff(double noise_scale, double batch) noexcept;

}  // namespace kf::monitor
