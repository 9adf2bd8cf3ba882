// SPDX-License-Identifier: Apache-2.0
// Optimus's performance models (Peng et al., EuroSys 2018): the loss
// model l(k) = 1/(β0·k + β1) + β2 fitted to the training loss and the epochs it predicts are
// left, the speed model t(w) = θ0·M/w + θ1 + θ3·w of the seconds per step on w
// allreduce workers, or its parameter-server form, both fitted with NNLS (nnls.hpp), and
// the worker count chosen by Optimus's marginal rules (Optimus §4.1 for one job: add workers
// while each saves enough of the remaining time). The validity gates (enough
// distinct configurations, a full-rank design, a residual bound) are reported with each fit.
// Thread-safety: pure functions; the value types are not synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

namespace kf::monitor {

/// Why a fit cannot be used; `ok` when it can.
enum class FitStatus : std::uint8_t {
  ok,
  too_few_points,      ///< fewer distinct configurations (or x values) than parameters
  rank_deficient,      ///< the design's columns are linearly dependent
  no_trend,            ///< loss model: no decreasing trend (a = 0), so β1 would be infinite
  saturated,           ///< loss model: the best c is at the top of its grid (β1 ≈ 0)
  not_converged,       ///< NNLS hit its iteration cap
  residual_too_large,  ///< the relative RMS residual exceeds the bound given
};
std::string_view to_string(FitStatus status) noexcept;

// ---- loss model ---------------------------------------------------------------------

/// l(k) = 1/(β0·k + β1) + β2 with β ≥ 0; k in epochs (samples processed / N).
struct LossModel {
  double beta0 = 0.0;
  double beta1 = 0.0;
  double beta2 = 0.0;

  double loss(double k) const noexcept { return 1.0 / (beta0 * k + beta1) + beta2; }
  /// k* = (1/(l* − β2) − β1)/β0 (clamped at 0), +∞ when l* ≤ β2 (never reached).
  double epochs_to_target(double target_loss) const noexcept;
  /// The smallest integer k ≥ 0 with l(k) − l(k+1) < δ (closed form); +∞ when β0 = 0
  /// or δ ≤ 0 cannot be met, 0 when it already holds at k = 0.
  double epochs_to_convergence(double delta) const noexcept;
};

/// Remaining epochs max(0, k* − k_now); +∞ when k* is.
double remaining_epochs(double target_epoch, double k_now) noexcept;

struct LossFitOptions {
  double c_min = 1e-6;  ///< the log grid of c = β0/β1
  double c_max = 1e2;
  int grid_points = 401;
  int golden_iterations = 200;  ///< golden-section refinement on log c
  double bracket_tolerance = 1e-12;
  bool normalize = true;  ///< divide the losses by their largest |value| first
  /// Relative RMS residual bound √(SSE/n)/mean|l|; the fit's status is residual_too_large above
  /// it. +∞ (the default) disables the gate.
  double max_relative_rms = std::numeric_limits<double>::infinity();
};

struct LossFit {
  FitStatus status = FitStatus::too_few_points;
  LossModel model;            ///< meaningful when status is ok or residual_too_large
  double sse = 0.0;           ///< Σ w_k (l_k − l̂_k)² in the caller's loss units
  double relative_rms = 0.0;  ///< √(SSE/Σw)/(weighted mean |l|)
  double c = 0.0;             ///< β0/β1 at the optimum
};

/// Fits the loss model by profiling over c (log grid, then golden section) with a two-column NNLS
/// in (a, β2) for each c. `weights` may be empty (all 1). Needs at least 3 distinct k. Throws:
/// std::invalid_argument when the spans differ in length, a value is not finite, a k is negative, a
/// weight is not positive, or the options are out of range.
LossFit fit_loss_model(std::span<const double> k, std::span<const double> loss,
                       std::span<const double> weights = {}, const LossFitOptions& options = {});

// ---- speed model --------------------------------------------------------------------

/// The allreduce form t(w) = θ0·M/w + θ1 + θ3·w (seconds per step at global batch M), or the
/// parameter-server form t(p, w) = θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p.
struct SpeedModel {
  double theta0 = 0.0;  ///< compute, per sample per worker share
  double theta1 = 0.0;  ///< constant overhead
  double theta2 = 0.0;  ///< PS transfer (0 in the allreduce form)
  double theta3 = 0.0;  ///< overhead per worker
  double theta4 = 0.0;  ///< overhead per server (0 in the allreduce form)
  bool parameter_server = false;

  /// Seconds per step on `workers` workers (and `servers` servers in the PS form).
  double step_time(double global_batch, double workers, double servers = 1.0) const noexcept;
  /// The continuous optimum √(θ0·M/θ3) of the allreduce form; +∞ when θ3 = 0.
  double continuous_optimum(double global_batch) const noexcept;
};

/// One measured configuration: the mean seconds per step over `steps` steps.
struct SpeedPoint {
  double workers = 0.0;
  double global_batch = 0.0;  ///< M, samples per step over all workers
  double step_time = 0.0;     ///< seconds
  double weight = 1.0;        ///< e.g. the number of steps measured
  double servers = 1.0;       ///< p, for the PS form only
};

struct SpeedFitOptions {
  bool parameter_server = false;
  /// Bound on √(Σw·r²/Σw)/(weighted mean t); +∞ disables it.
  double max_relative_rms = std::numeric_limits<double>::infinity();
};

struct SpeedFit {
  FitStatus status = FitStatus::too_few_points;
  SpeedModel model;
  double sse = 0.0;  ///< weighted Σ w·r²
  double relative_rms = 0.0;
  std::size_t configurations = 0;  ///< distinct (workers, batch, servers)
};

/// NNLS fit of the step time over the features [M/w, 1, w] (or [M/w, 1, w/p, w, p]), each row
/// weighted by √weight. Gates: at least as many distinct configurations as
/// parameters (3 or 5) and a full-rank design.
/// Throws: std::invalid_argument when a value is not finite, a worker count, batch, server count,
/// step time or weight is not positive.
SpeedFit fit_speed_model(std::span<const SpeedPoint> points, const SpeedFitOptions& options = {});

// ---- choosing the worker count (Optimus §4.1) ----------------------------------------

/// A worker range [min_workers, max_workers] at global batch M.
struct WorkerRange {
  int min_workers = 1;
  int max_workers = 1;
};

/// argmin_w t(w) over the range (the smallest w on ties).
/// Throws: std::invalid_argument when the range is empty or min_workers < 1.
int fastest_workers(const SpeedModel& model, double global_batch, WorkerRange range);

/// Rule (i): from min_workers, add a worker while t(w)/t(w+1) − 1 ≥ ε.
/// Throws: as fastest_workers.
int workers_by_speedup(const SpeedModel& model, double global_batch, WorkerRange range,
                       double min_speedup);

/// Rule (ii), Optimus's marginal gain for one job: from min_workers, add a worker while the
/// remaining time it saves, Q·(t(w) − t(w+1)), is at least `min_gain_seconds`, where Q is the
/// remaining steps.
/// Throws: as fastest_workers, or when remaining_steps is negative or NaN.
int workers_by_marginal_gain(const SpeedModel& model, double global_batch, WorkerRange range,
                             double remaining_steps, double min_gain_seconds);

}  // namespace kf::monitor
