// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/optimus.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kf/monitor/nnls.hpp"

namespace kf::monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

/// One profile evaluation: the two-column NNLS of l = a·φ_c(k) + β2 at a fixed c.
struct Profile {
  double sse = kInf;
  double a = 0.0;
  double beta2 = 0.0;
  bool converged = true;
};

class LossProfiler {
 public:
  LossProfiler(std::span<const double> k, std::span<const double> scaled_loss,
               std::span<const double> sqrt_w)
      : k_(k), sqrt_w_(sqrt_w), y_(scaled_loss.size()) {
    for (std::size_t i = 0; i < y_.size(); ++i) y_[i] = sqrt_w[i] * scaled_loss[i];
  }

  Profile at(double c) const {
    DesignRows a(k_.size(), std::vector<double>(2));
    for (std::size_t i = 0; i < k_.size(); ++i) {
      a[i][0] = sqrt_w_[i] / (1.0 + c * k_[i]);
      a[i][1] = sqrt_w_[i];
    }
    const NnlsResult r = nnls(a, y_);
    return {r.residual_norm * r.residual_norm, r.x[0], r.x[1], r.converged};
  }

 private:
  std::span<const double> k_;
  std::span<const double> sqrt_w_;
  std::vector<double> y_;
};

/// Golden-section search for the minimum of the profile SSE over log c in [lo, hi].
double golden_section(const LossProfiler& p, double lo, double hi, const LossFitOptions& o) {
  const double ratio = (std::sqrt(5.0) - 1.0) / 2.0;
  double a = lo;
  double b = hi;
  double c1 = b - ratio * (b - a);
  double c2 = a + ratio * (b - a);
  double f1 = p.at(std::exp(c1)).sse;
  double f2 = p.at(std::exp(c2)).sse;
  for (int it = 0; it < o.golden_iterations && b - a >= o.bracket_tolerance; ++it) {
    if (f1 < f2) {
      b = c2;
      c2 = c1;
      f2 = f1;
      c1 = b - ratio * (b - a);
      f1 = p.at(std::exp(c1)).sse;
    } else {
      a = c1;
      c1 = c2;
      f1 = f2;
      c2 = a + ratio * (b - a);
      f2 = p.at(std::exp(c2)).sse;
    }
  }
  return 0.5 * (a + b);
}

void check_loss_inputs(std::span<const double> k, std::span<const double> loss,
                       std::span<const double> weights, const LossFitOptions& o) {
  require(k.size() == loss.size(), "fit_loss_model: k and loss differ in length");
  require(weights.empty() || weights.size() == k.size(),
          "fit_loss_model: weights must be empty or as long as k");
  for (std::size_t i = 0; i < k.size(); ++i) {
    require(std::isfinite(k[i]) && k[i] >= 0.0,
            "fit_loss_model: k[" + std::to_string(i) + "] must be finite and >= 0");
    require(std::isfinite(loss[i]),
            "fit_loss_model: loss[" + std::to_string(i) + "] is not finite");
    require(weights.empty() || (std::isfinite(weights[i]) && weights[i] > 0.0),
            "fit_loss_model: weights[" + std::to_string(i) + "] must be finite and > 0");
  }
  require(o.c_min > 0.0 && o.c_max > o.c_min && std::isfinite(o.c_max),
          "fit_loss_model: the c grid needs 0 < c_min < c_max < inf");
  require(o.grid_points >= 3, "fit_loss_model: grid_points must be at least 3");
  require(o.golden_iterations >= 0, "fit_loss_model: golden_iterations must be >= 0");
  require(!std::isnan(o.max_relative_rms), "fit_loss_model: max_relative_rms is NaN");
}

void check_range(WorkerRange range, const char* who) {
  require(range.min_workers >= 1 && range.max_workers >= range.min_workers,
          std::string(who) + ": the worker range must satisfy 1 <= min_workers <= max_workers");
}

}  // namespace

std::string_view to_string(FitStatus status) noexcept {
  switch (status) {
    case FitStatus::ok: return "ok";
    case FitStatus::too_few_points: return "too few distinct points";
    case FitStatus::rank_deficient: return "rank-deficient design";
    case FitStatus::no_trend: return "no decreasing trend";
    case FitStatus::saturated: return "saturated (beta1 ~ 0)";
    case FitStatus::not_converged: return "NNLS did not converge";
    case FitStatus::residual_too_large: return "residual above its bound";
  }
  return "unknown";
}

double LossModel::epochs_to_target(double target_loss) const noexcept {
  if (!(target_loss > beta2)) return kInf;
  if (beta0 == 0.0) return loss(0.0) <= target_loss ? 0.0 : kInf;
  return std::max(0.0, (1.0 / (target_loss - beta2) - beta1) / beta0);
}

double LossModel::epochs_to_convergence(double delta) const noexcept {
  if (beta0 == 0.0) return 0.0;  // a flat curve: the decrease is 0 everywhere
  if (!(delta > 0.0)) return kInf;
  // l(k) − l(k+1) = β0/(u(u+β0)) with u = β0·k + β1 falls below δ once u > u*, the root of
  // u² + β0·u − β0/δ = 0. The closed form is then corrected by evaluating the decrease itself,
  // so that rounding at an integer boundary cannot shift k* by one.
  const double u = (-beta0 + std::sqrt(beta0 * beta0 + 4.0 * beta0 / delta)) / 2.0;
  const double estimate = std::floor((u - beta1) / beta0) + 1.0;
  if (!std::isfinite(estimate)) return kInf;
  double k = std::max(0.0, estimate);
  auto decrease = [&](double at) { return loss(at) - loss(at + 1.0); };
  while (k > 0.0 && decrease(k - 1.0) < delta) k -= 1.0;
  while (!(decrease(k) < delta)) k += 1.0;
  return k;
}

double remaining_epochs(double target_epoch, double k_now) noexcept {
  if (std::isinf(target_epoch)) return kInf;
  return std::max(0.0, target_epoch - k_now);
}

LossFit fit_loss_model(std::span<const double> k, std::span<const double> loss,
                       std::span<const double> weights, const LossFitOptions& o) {
  check_loss_inputs(k, loss, weights, o);
  LossFit fit;
  if (std::set<double>(k.begin(), k.end()).size() < 3) return fit;  // too_few_points

  // Normalizing by the largest |l| improves conditioning; the β are mapped back below.
  double scale = 0.0;
  for (double l : loss) scale = std::max(scale, std::abs(l));
  if (scale == 0.0) scale = 1.0;
  std::vector<double> scaled(loss.size());
  std::vector<double> sqrt_w(loss.size(), 1.0);
  for (std::size_t i = 0; i < loss.size(); ++i) {
    scaled[i] = o.normalize ? loss[i] / scale : loss[i];
    if (!weights.empty()) sqrt_w[i] = std::sqrt(weights[i]);
  }
  if (!o.normalize) scale = 1.0;
  const LossProfiler profiler(k, scaled, sqrt_w);

  // 1. The log grid of c; 2. golden section on log c around its best point.
  const double log_lo = std::log(o.c_min);
  const double step = (std::log(o.c_max) - log_lo) / (o.grid_points - 1);
  int best = 0;
  double best_sse = kInf;
  for (int i = 0; i < o.grid_points; ++i) {
    const double sse = profiler.at(std::exp(log_lo + step * i)).sse;
    if (sse < best_sse) {
      best_sse = sse;
      best = i;
    }
  }
  const double lo = log_lo + step * std::max(best - 1, 0);
  const double hi = log_lo + step * std::min(best + 1, o.grid_points - 1);
  double log_c = golden_section(profiler, lo, hi, o);
  Profile p = profiler.at(std::exp(log_c));
  if (!(p.sse <= best_sse)) {  // never worse than the grid's best point
    log_c = log_lo + step * best;
    p = profiler.at(std::exp(log_c));
  }

  // 3. Back to β: 1/(β0k + β1) = a/(1 + ck) with a = 1/β1, c = β0/β1.
  fit.c = std::exp(log_c);
  fit.sse = p.sse * scale * scale;
  double sum_w = 0.0;
  double sum_wl = 0.0;
  for (std::size_t i = 0; i < loss.size(); ++i) {
    sum_w += sqrt_w[i] * sqrt_w[i];
    sum_wl += sqrt_w[i] * sqrt_w[i] * std::abs(loss[i]);
  }
  fit.relative_rms = sum_wl > 0.0 ? std::sqrt(fit.sse / sum_w) / (sum_wl / sum_w) : kInf;
  if (!p.converged) {
    fit.status = FitStatus::not_converged;
    return fit;
  }
  if (p.a <= 0.0) {
    fit.status = FitStatus::no_trend;
    return fit;
  }
  const double a = p.a * scale;
  fit.model = {fit.c / a, 1.0 / a, p.beta2 * scale};
  if (best == o.grid_points - 1) {
    fit.status = FitStatus::saturated;
  } else if (fit.relative_rms > o.max_relative_rms) {
    fit.status = FitStatus::residual_too_large;
  } else {
    fit.status = FitStatus::ok;
  }
  return fit;
}

double SpeedModel::step_time(double global_batch, double workers, double servers) const noexcept {
  double t = theta0 * global_batch / workers + theta1 + theta3 * workers;
  if (parameter_server) t += theta2 * workers / servers + theta4 * servers;
  return t;
}

double SpeedModel::continuous_optimum(double global_batch) const noexcept {
  if (theta3 == 0.0) return kInf;
  return std::sqrt(theta0 * global_batch / theta3);
}

SpeedFit fit_speed_model(std::span<const SpeedPoint> points, const SpeedFitOptions& options) {
  std::set<std::tuple<double, double, double>> configurations;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const SpeedPoint& p = points[i];
    for (double v : {p.workers, p.global_batch, p.step_time, p.weight, p.servers}) {
      require(std::isfinite(v) && v > 0.0,
              "fit_speed_model: point " + std::to_string(i) +
                  " needs finite, positive workers, global_batch, step_time, weight, servers");
    }
    configurations.emplace(p.workers, p.global_batch, options.parameter_server ? p.servers : 1.0);
  }
  require(!std::isnan(options.max_relative_rms), "fit_speed_model: max_relative_rms is NaN");
  SpeedFit fit;
  fit.model.parameter_server = options.parameter_server;
  fit.configurations = configurations.size();
  const std::size_t parameters = options.parameter_server ? 5 : 3;
  if (fit.configurations < parameters) return fit;  // too_few_points

  DesignRows a;
  std::vector<double> y;
  double sum_w = 0.0;
  double sum_wt = 0.0;
  for (const SpeedPoint& p : points) {
    const double s = std::sqrt(p.weight);
    if (options.parameter_server) {
      a.push_back({s * p.global_batch / p.workers, s, s * p.workers / p.servers, s * p.workers,
                   s * p.servers});
    } else {
      a.push_back({s * p.global_batch / p.workers, s, s * p.workers});
    }
    y.push_back(s * p.step_time);
    sum_w += p.weight;
    sum_wt += p.weight * p.step_time;
  }
  if (!full_column_rank(a)) {
    fit.status = FitStatus::rank_deficient;
    return fit;
  }
  const NnlsResult r = nnls(a, y);
  const auto& x = r.x;
  if (options.parameter_server) {
    fit.model = {x[0], x[1], x[2], x[3], x[4], true};
  } else {
    fit.model = {x[0], x[1], 0.0, x[2], 0.0, false};
  }
  fit.sse = r.residual_norm * r.residual_norm;
  fit.relative_rms = std::sqrt(fit.sse / sum_w) / (sum_wt / sum_w);
  if (!r.converged) {
    fit.status = FitStatus::not_converged;
  } else if (fit.relative_rms > options.max_relative_rms) {
    fit.status = FitStatus::residual_too_large;
  } else {
    fit.status = FitStatus::ok;
  }
  return fit;
}

int fastest_workers(const SpeedModel& model, double global_batch, WorkerRange range) {
  check_range(range, "fastest_workers");
  int best = range.min_workers;
  double best_t = model.step_time(global_batch, best);
  for (int w = range.min_workers + 1; w <= range.max_workers; ++w) {
    const double t = model.step_time(global_batch, w);
    if (t < best_t) {
      best_t = t;
      best = w;
    }
  }
  return best;
}

int workers_by_speedup(const SpeedModel& model, double global_batch, WorkerRange range,
                       double min_speedup) {
  check_range(range, "workers_by_speedup");
  int w = range.min_workers;
  while (w < range.max_workers &&
         model.step_time(global_batch, w) / model.step_time(global_batch, w + 1) - 1.0 >=
             min_speedup) {
    ++w;
  }
  return w;
}

int workers_by_marginal_gain(const SpeedModel& model, double global_batch, WorkerRange range,
                             double remaining_steps, double min_gain_seconds) {
  check_range(range, "workers_by_marginal_gain");
  require(remaining_steps >= 0.0, "workers_by_marginal_gain: remaining_steps must be >= 0");
  int w = range.min_workers;
  while (w < range.max_workers) {
    const double saved = model.step_time(global_batch, w) - model.step_time(global_batch, w + 1);
    // Q = +∞ with saved > 0 adds the worker; saved ≤ 0 never does (no ∞·0).
    if (!(saved > 0.0) || !(remaining_steps * saved >= min_gain_seconds)) break;
    ++w;
  }
  return w;
}

}  // namespace kf::monitor
