// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/hemingway.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "kf/monitor/nnls.hpp"

namespace kf::monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

double basis(ConvergenceTerm term, double i, double m) noexcept {
  switch (term) {
    case ConvergenceTerm::constant: return 1.0;
    case ConvergenceTerm::inv_i: return 1.0 / i;
    case ConvergenceTerm::m_over_i: return m / i;
    case ConvergenceTerm::inv_i2: return 1.0 / (i * i);
    case ConvergenceTerm::inv_sqrt_i: return 1.0 / std::sqrt(i);
  }
  return 0.0;
}

void check_range(const CombinedModel& model, const char* who) {
  require(model.min_machines >= 1 && model.max_machines >= model.min_machines,
          std::string(who) + ": the machine range must satisfy 1 <= min_machines <= max_machines");
}

/// The weighted relative RMS √(Σw·r²/Σw)/(Σw|y|/Σw); +∞ when the targets are all 0.
double relative_rms(double sse, double sum_w, double sum_w_abs_y) {
  return sum_w_abs_y > 0.0 ? std::sqrt(sse / sum_w) / (sum_w_abs_y / sum_w) : kInf;
}

FitStatus status_of(const NnlsResult& r, double rel_rms, double bound) {
  if (!r.converged) return FitStatus::not_converged;
  if (rel_rms > bound) return FitStatus::residual_too_large;
  return FitStatus::ok;
}

}  // namespace

double SystemModel::iteration_time(double machines, double size) const noexcept {
  return theta0 + theta1 * size / machines + theta2 * std::log(machines) + theta3 * machines;
}

SystemFit fit_system_model(std::span<const SystemPoint> points, const SystemFitOptions& options) {
  require(!std::isnan(options.max_relative_rms), "fit_system_model: max_relative_rms is NaN");
  std::set<std::pair<double, double>> configurations;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const SystemPoint& p = points[i];
    for (double v : {p.machines, p.size, p.iteration_time, p.weight}) {
      require(std::isfinite(v) && v > 0.0,
              "fit_system_model: point " + std::to_string(i) +
                  " needs finite, positive machines, size, iteration_time and weight");
    }
    configurations.emplace(p.machines, p.size);
  }
  SystemFit fit;
  fit.configurations = configurations.size();
  if (fit.configurations < 4) return fit;  // too_few_points
  DesignRows a;
  std::vector<double> y;
  double sum_w = 0.0;
  double sum_wy = 0.0;
  for (const SystemPoint& p : points) {
    const double s = std::sqrt(p.weight);
    a.push_back({s, s * p.size / p.machines, s * std::log(p.machines), s * p.machines});
    y.push_back(s * p.iteration_time);
    sum_w += p.weight;
    sum_wy += p.weight * p.iteration_time;
  }
  if (!full_column_rank(a)) {
    fit.status = FitStatus::rank_deficient;
    return fit;
  }
  const NnlsResult r = nnls(a, y);
  fit.model = {r.x[0], r.x[1], r.x[2], r.x[3]};
  fit.sse = r.residual_norm * r.residual_norm;
  fit.relative_rms = relative_rms(fit.sse, sum_w, sum_wy);
  fit.status = status_of(r, fit.relative_rms, options.max_relative_rms);
  return fit;
}

std::string_view to_string(ConvergenceTerm term) noexcept {
  switch (term) {
    case ConvergenceTerm::constant: return "1";
    case ConvergenceTerm::inv_i: return "1/i";
    case ConvergenceTerm::m_over_i: return "m/i";
    case ConvergenceTerm::inv_i2: return "1/i^2";
    case ConvergenceTerm::inv_sqrt_i: return "1/sqrt(i)";
  }
  return "?";
}

std::vector<ConvergenceTerm> default_convergence_terms() {
  return {ConvergenceTerm::inv_i, ConvergenceTerm::m_over_i, ConvergenceTerm::inv_i2};
}

double ConvergenceModel::loss(double iterations, double machines) const noexcept {
  double g = 0.0;
  for (std::size_t j = 0; j < terms.size() && j < lambda.size(); ++j) {
    g += lambda[j] * basis(terms[j], iterations, machines);
  }
  return g;
}

double ConvergenceModel::iterations_to(double target, double machines) const noexcept {
  if (std::isnan(target) || lambda.size() != terms.size()) return kInf;
  double floor = 0.0;
  bool decreasing = false;
  for (std::size_t j = 0; j < terms.size(); ++j) {
    if (terms[j] == ConvergenceTerm::constant) {
      floor += lambda[j];
    } else if (lambda[j] > 0.0) {
      decreasing = true;
    }
  }
  if (!decreasing) return floor <= target ? 0.0 : kInf;  // g is constant
  if (floor >= target) return kInf;                      // approached from above, never met
  if (terms == default_convergence_terms()) {
    // ε·i² − a·i − λ3 = 0, the positive root.
    const double a = lambda[0] + lambda[1] * machines;
    return (a + std::sqrt(a * a + 4.0 * target * lambda[2])) / (2.0 * target);
  }
  // g falls from +∞ (i → 0) to the floor: bracket the crossing, then bisect on i.
  double hi = 1.0;
  while (loss(hi, machines) > target && hi < 1e300) hi *= 2.0;
  if (loss(hi, machines) > target) return kInf;
  double lo = hi / 2.0;
  while (lo > 1e-300 && loss(lo, machines) <= target) lo /= 2.0;
  for (int it = 0; it < 400 && hi - lo > 1e-12 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (loss(mid, machines) <= target ? hi : lo) = mid;
  }
  return hi;
}

ConvergenceFit fit_convergence_model(std::span<const ConvergencePoint> points,
                                     const ConvergenceFitOptions& options) {
  require(!options.terms.empty(), "fit_convergence_model: the basis has no terms");
  require(std::set<ConvergenceTerm>(options.terms.begin(), options.terms.end()).size() ==
              options.terms.size(),
          "fit_convergence_model: the basis repeats a term");
  require(!std::isnan(options.max_relative_rms), "fit_convergence_model: max_relative_rms is NaN");
  std::set<std::pair<double, double>> distinct;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const ConvergencePoint& p = points[i];
    require(std::isfinite(p.iterations) && p.iterations > 0.0 && std::isfinite(p.machines) &&
                p.machines > 0.0 && std::isfinite(p.loss) && std::isfinite(p.weight) &&
                p.weight > 0.0,
            "fit_convergence_model: point " + std::to_string(i) +
                " needs finite values with iterations, machines and weight > 0");
    distinct.emplace(p.iterations, p.machines);
  }
  ConvergenceFit fit;
  fit.model.terms = options.terms;
  fit.model.lambda.assign(options.terms.size(), 0.0);
  fit.distinct_points = distinct.size();
  if (fit.distinct_points < options.terms.size()) return fit;  // too_few_points
  DesignRows a;
  std::vector<double> y;
  double sum_w = 0.0;
  double sum_w_abs = 0.0;
  for (const ConvergencePoint& p : points) {
    const double s = std::sqrt(p.weight);
    std::vector<double> row;
    for (ConvergenceTerm t : options.terms) row.push_back(s * basis(t, p.iterations, p.machines));
    a.push_back(std::move(row));
    y.push_back(s * p.loss);
    sum_w += p.weight;
    sum_w_abs += p.weight * std::abs(p.loss);
  }
  if (!full_column_rank(a)) {
    fit.status = FitStatus::rank_deficient;
    return fit;
  }
  const NnlsResult r = nnls(a, y);
  fit.model.lambda = r.x;
  fit.sse = r.residual_norm * r.residual_norm;
  fit.relative_rms = relative_rms(fit.sse, sum_w, sum_w_abs);
  fit.status = status_of(r, fit.relative_rms, options.max_relative_rms);
  return fit;
}

double CombinedModel::loss_after(double seconds, int machines) const noexcept {
  const double m = machines;
  return convergence.loss(start_iterations + seconds / system.iteration_time(m, size), m);
}

double CombinedModel::time_to(double target, int machines) const noexcept {
  const double m = machines;
  const double i = convergence.iterations_to(target, m);
  if (std::isinf(i)) return kInf;
  return std::max(0.0, i - start_iterations) * system.iteration_time(m, size);
}

MachineChoice best_machines_for_time(const CombinedModel& model, double seconds) {
  check_range(model, "best_machines_for_time");
  require(std::isfinite(seconds) && seconds > 0.0,
          "best_machines_for_time: the time budget must be positive and finite");
  MachineChoice best;
  best.value = kInf;
  for (int m = model.min_machines; m <= model.max_machines; ++m) {
    const double h = model.loss_after(seconds, m);
    if (best.machines == 0 || h < best.value) {
      best = {m, h, seconds / model.system.iteration_time(m, model.size)};
    }
  }
  return best;
}

MachineChoice best_machines_for_target(const CombinedModel& model, double target) {
  check_range(model, "best_machines_for_target");
  require(std::isfinite(target), "best_machines_for_target: the target is not finite");
  MachineChoice best;
  best.value = kInf;
  for (int m = model.min_machines; m <= model.max_machines; ++m) {
    const double t = model.time_to(target, m);
    if (t < best.value) {
      const double i = model.convergence.iterations_to(target, m);
      best = {m, t, std::max(0.0, i - model.start_iterations)};
    }
  }
  return best;
}

}  // namespace kf::monitor
