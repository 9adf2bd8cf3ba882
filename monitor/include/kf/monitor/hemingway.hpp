// SPDX-License-Identifier: Apache-2.0
// Hemingway's models (Pan et al. 2016, with Ernest's system model,
// Venkataraman et al., NSDI 2016): the time per iteration on m machines
//   f(m) = θ0 + θ1·size/m + θ2·ln m + θ3·m
// the loss (or suboptimality) after i iterations on m machines as a non-negative combination of
// basis functions (the default {1/i, m/i, 1/i²})
//   g(i, m) = Σ_j λ_j·φ_j(i, m)
// both fitted with NNLS (nnls.hpp), and their combination h(t, m) = g(t/f(m), m) with the two
// decisions: the machine count for a time budget and the one for an error target.
// Thread-safety: pure functions; the value types are not synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "kf/monitor/optimus.hpp"  // FitStatus

namespace kf::monitor {

// ---- system model -------------------------------------------------------------------

/// f(m) = θ0 + θ1·size/m + θ2·ln m + θ3·m: seconds per iteration (natural log).
struct SystemModel {
  double theta0 = 0.0;  ///< serial part
  double theta1 = 0.0;  ///< parallel compute on a 1/m share
  double theta2 = 0.0;  ///< tree aggregation
  double theta3 = 0.0;  ///< per-machine overhead

  double iteration_time(double machines, double size = 1.0) const noexcept;
};

/// One measured configuration (Ernest: a run at m machines on a data scale `size`).
struct SystemPoint {
  double machines = 0.0;
  double size = 1.0;            ///< the data scale (the global batch for a training step)
  double iteration_time = 0.0;  ///< seconds
  double weight = 1.0;
};

struct SystemFitOptions {
  /// Bound on the weighted relative RMS residual; +∞ disables it.
  double max_relative_rms = std::numeric_limits<double>::infinity();
};

struct SystemFit {
  FitStatus status = FitStatus::too_few_points;
  SystemModel model;
  double sse = 0.0;
  double relative_rms = 0.0;
  std::size_t configurations = 0;  ///< distinct (machines, size)
};

/// NNLS over the features [1, size/m, ln m, m], rows weighted by √weight. Gates: at least 4
/// distinct configurations and a full-rank design.
/// Throws: std::invalid_argument when a value is not finite, or machines, size, time or weight
/// is not positive.
SystemFit fit_system_model(std::span<const SystemPoint> points,
                           const SystemFitOptions& options = {});

// ---- convergence model --------------------------------------------------------------

/// The basis functions of g; every one is non-increasing in i, so that g is.
enum class ConvergenceTerm : std::uint8_t {
  constant,    ///< 1 (a loss floor)
  inv_i,       ///< 1/i
  m_over_i,    ///< m/i
  inv_i2,      ///< 1/i²
  inv_sqrt_i,  ///< 1/√i
};
std::string_view to_string(ConvergenceTerm term) noexcept;

/// The default dictionary: {1/i, m/i, 1/i²}.
std::vector<ConvergenceTerm> default_convergence_terms();

struct ConvergenceModel {
  std::vector<ConvergenceTerm> terms = default_convergence_terms();
  std::vector<double> lambda;  ///< one weight ≥ 0 per term

  /// g(i, m); i > 0.
  double loss(double iterations, double machines) const noexcept;
  /// min{i > 0 : g(i, m) ≤ ε}: the closed form (a + √(a² + 4ελ3))/(2ε), a = λ1 + λ2·m, for the
  /// default dictionary, bisection to 1e-12 relative otherwise; +∞ when g never reaches ε.
  double iterations_to(double target, double machines) const noexcept;
};

/// One observation: the loss after `iterations` iterations on `machines` machines.
struct ConvergencePoint {
  double iterations = 0.0;
  double machines = 0.0;
  double loss = 0.0;
  double weight = 1.0;
};

struct ConvergenceFitOptions {
  std::vector<ConvergenceTerm> terms = default_convergence_terms();
  double max_relative_rms = std::numeric_limits<double>::infinity();
};

struct ConvergenceFit {
  FitStatus status = FitStatus::too_few_points;
  ConvergenceModel model;
  double sse = 0.0;
  double relative_rms = 0.0;
  std::size_t distinct_points = 0;  ///< distinct (iterations, machines)
};

/// NNLS for λ ≥ 0 over the chosen basis, rows weighted by √weight. Gates: at least as many
/// distinct (i, m) as terms, and a full-rank design (m/i next to 1/i needs two machine counts).
/// Throws: std::invalid_argument when a value is not finite, iterations, machines or weight are
/// not positive, or the term list is empty or repeats a term.
ConvergenceFit fit_convergence_model(std::span<const ConvergencePoint> points,
                                     const ConvergenceFitOptions& options = {});

// ---- combined model and decisions ---------------------------------------------------

/// The inputs of a decision: both models, the data scale of an iteration, the candidate machine
/// counts [min_machines, max_machines], and the iterations already done (0 for a fresh run; an
/// elastic job that continues at step i0 is predicted at i0 + its new iterations).
struct CombinedModel {
  SystemModel system;
  ConvergenceModel convergence;
  double size = 1.0;
  int min_machines = 1;
  int max_machines = 1;
  double start_iterations = 0.0;

  /// h(t, m) = g(i0 + t/f(m), m): the predicted loss after t more seconds on m machines.
  double loss_after(double seconds, int machines) const noexcept;
  /// max(0, i_ε(m) − i0)·f(m): the predicted seconds to reach ε on m machines (+∞ if never).
  double time_to(double target, int machines) const noexcept;
};

struct MachineChoice {
  int machines = 0;
  double value = 0.0;       ///< h(t, m*) for a budget; t*(m*) in seconds for a target
  double iterations = 0.0;  ///< t/f(m*) more iterations; i_ε(m*) − i0 for a target
};

/// m*(t) = argmin_m h(t, m) over the candidates (the smallest m on ties).
/// Throws: std::invalid_argument when the range is empty, min_machines < 1, or t is not
/// positive and finite.
MachineChoice best_machines_for_time(const CombinedModel& model, double seconds);

/// m* = argmin_m max(0, i_ε(m) − i0)·f(m) (the smallest m on ties); machines = 0 with value +∞
/// when no candidate reaches ε.
/// Throws: std::invalid_argument when the range is empty, min_machines < 1, or ε is not finite.
MachineChoice best_machines_for_target(const CombinedModel& model, double target);

}  // namespace kf::monitor
