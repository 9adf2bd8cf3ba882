// SPDX-License-Identifier: Apache-2.0
// Smoothers for the monitoring operators (KAT-EMA): the debiased EMA
// that kf uses for every statistic, and the two variants found in the sources (KungFu's
// first-value EMA, fairscale's mean-then-EWMA) for comparison and for Or et al.'s straggler rule.
// scaled_theta gives θ = θ0^S, so that an average's memory is counted in samples, not steps.
// All state is IEEE double.
// Thread-safety: value types, not synchronized; one owner at a time.
#pragma once

#include <cstdint>

namespace kf::monitor {

/// θ = base^scale: the smoothing factor of one optimizer step of batch scale
/// S = M/M0. With base θ0 the time constant is about M0/(1 − θ0) samples whatever M is.
/// Expects 0 ≤ base < 1 and scale > 0 (other values give what std::pow gives).
double scaled_theta(double base, double scale) noexcept;

/// Debiased EMA (AdaptDL `_update_avg`, fairscale `debias_ewma=True`):
/// state (m, u) starts at (0, 0); an update with factor θ does m ← θ·m + (1−θ)·x and
/// u ← θ·u + (1−θ); the value is m/u. The first value is x₁ exactly and a constant input
/// stays that constant (up to rounding), also when θ changes from step to step.
/// It also keeps Σw² of the weights it gives its inputs (Σw = u), for
/// n_eff = (Σw)²/Σw².
class DebiasedEma {
 public:
  /// Adds x with factor theta (0 ≤ theta < 1; theta = 0 replaces the average by x).
  void update(double x, double theta) noexcept;
  /// m/u; NaN before the first update.
  double value() const noexcept;
  /// The effective number of inputs averaged, (Σw)²/Σw²; 0 before the first update.
  /// Constant θ: about (1+θ)/(1−θ) after many updates; θ_t = 1 − 1/t (a plain mean): t.
  double effective_count() const noexcept;
  std::int64_t updates() const noexcept { return updates_; }
  void reset() noexcept { *this = DebiasedEma{}; }

 private:
  double m_ = 0.0;   // Σ w_i·x_i
  double u_ = 0.0;   // Σ w_i
  double w2_ = 0.0;  // Σ w_i²
  std::int64_t updates_ = 0;
};

/// First-value EMA (KungFu `utils/ema.hpp`; Or et al.'s straggler EWMA):
/// v₁ = x₁, then v ← α·v + (1−α)·x. α is the weight of the old value.
class FirstValueEma {
 public:
  /// Expects 0 ≤ alpha ≤ 1.
  explicit FirstValueEma(double alpha) noexcept : alpha_(alpha) {}
  void update(double x) noexcept;
  /// NaN before the first update.
  double value() const noexcept;
  std::int64_t updates() const noexcept { return updates_; }

 private:
  double alpha_;
  double v_ = 0.0;
  std::int64_t updates_ = 0;
};

/// Mean-then-EWMA (AdaScale App. B.3 as fairscale implements it with
/// `debias_ewma=False`): the plain running mean while the update count t < 1/(1−θ), then the
/// ordinary EMA v ← θ·v + (1−θ)·x.
class MeanThenEwma {
 public:
  /// Expects 0 ≤ theta < 1.
  explicit MeanThenEwma(double theta) noexcept : theta_(theta) {}
  void update(double x) noexcept;
  /// NaN before the first update.
  double value() const noexcept;
  std::int64_t updates() const noexcept { return updates_; }

 private:
  double theta_;
  double sum_ = 0.0;
  double v_ = 0.0;
  std::int64_t updates_ = 0;
};

}  // namespace kf::monitor
