// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/gns.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <utility>

namespace kf::monitor {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// AdaptDL's variance floor of 1e-6, in tr(Σ) units: ε_S = 1e-6·M0.
constexpr double kTrSigmaFloorPerSample = 1e-6;
// Slack for the validity thresholds, so that n_eff = 19.999999999999996 of a plain mean over
// 20 steps counts as 20.
constexpr double kThresholdSlack = 1e-9;

bool all_finite(std::span<const double> values) {
  return std::all_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); });
}

std::string format(const char* fmt, double a, double b) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, a, b);
  return buf;
}

}  // namespace

GnsPoint two_batch_estimate(double small_sqnorm, double small_batch, double big_sqnorm,
                            double big_batch) noexcept {
  return {(big_batch * big_sqnorm - small_batch * small_sqnorm) / (big_batch - small_batch),
          (small_sqnorm - big_sqnorm) / (1.0 / small_batch - 1.0 / big_batch)};
}

GnsPoint data_parallel_estimate(double mean_local_sqnorm, double global_sqnorm, double count,
                                double local_batch) noexcept {
  // Through D = A − C rather than n·C − A, a difference of two large numbers.
  const double d = mean_local_sqnorm - global_sqnorm;
  return {global_sqnorm - d / (count - 1.0), local_batch * count * d / (count - 1.0)};
}

GnsPoint per_rank_estimate(double own_sqnorm, double global_sqnorm, double count,
                           double local_batch) noexcept {
  return two_batch_estimate(own_sqnorm, local_batch, global_sqnorm, count * local_batch);
}

const char* to_string(GnsStepStatus status) noexcept {
  switch (status) {
    case GnsStepStatus::accepted: return "accepted";
    case GnsStepStatus::skipped_non_finite: return "skipped: non-finite input";
    case GnsStepStatus::no_previous_step:
      return "single worker: no previous step for the difference estimator";
  }
  return "?";
}

double GnsEstimate::gain(double scale) const noexcept {
  return gain_ratio(read, base_batch, scale);
}

double GnsEstimate::efficiency(double global_batch) const noexcept {
  return monitor::efficiency(b_simple, base_batch, global_batch);
}

GnsEstimator::GnsEstimator(GnsOptions options) : options_(std::move(options)) {
  if (!(options_.base_batch > 0.0) || !std::isfinite(options_.base_batch)) {
    throw std::invalid_argument("GnsOptions: base_batch (M0) must be a positive number");
  }
  if (!(options_.theta_base > 0.0 && options_.theta_base < 1.0)) {
    throw std::invalid_argument("GnsOptions: theta_base must lie in (0, 1)");
  }
  min_base_steps_ = options_.min_base_steps.value_or(1.0 / (1.0 - options_.theta_base));
  if (!(options_.min_effective_steps >= 0.0) || !std::isfinite(options_.min_effective_steps) ||
      !(min_base_steps_ >= 0.0) || !std::isfinite(min_base_steps_)) {
    throw std::invalid_argument(
        "GnsOptions: min_effective_steps and min_base_steps must be finite and >= 0");
  }
}

void GnsEstimator::check_shape(const GnsStep& step, std::int64_t count) const {
  if (step.workers < 1 || step.accumulation_steps < 1) {
    throw std::invalid_argument("GnsStep: workers and accumulation_steps must be >= 1");
  }
  if (!(step.local_batch > 0.0) || !std::isfinite(step.local_batch)) {
    throw std::invalid_argument("GnsStep: local_batch must be a positive number of samples");
  }
  if (step.loss_scale <= 0.0) {
    throw std::invalid_argument("GnsStep: loss_scale must be positive");
  }
  const std::size_t p = step.local_sqnorm_sum.size();
  if (p == 0 || step.global_sqnorm.size() != p) {
    throw std::invalid_argument(
        "GnsStep: local_sqnorm_sum and global_sqnorm need one value per parameter group");
  }
  if (!groups_.empty() && p != groups_.size()) {
    throw std::invalid_argument("GnsStep: the number of parameter groups changed");
  }
  if (!step.pair_sqnorm.empty() && (count != 1 || step.pair_sqnorm.size() != p)) {
    throw std::invalid_argument(
        "GnsStep: pair_sqnorm is only for n = 1, with one value per parameter group");
  }
}

GnsStepResult GnsEstimator::update(const GnsStep& step) {
  const std::int64_t count = step.workers * step.accumulation_steps;
  check_shape(step, count);
  const std::size_t p = step.local_sqnorm_sum.size();
  GnsStepResult result;
  const bool pair_used = count == 1 && have_previous_ && !step.pair_sqnorm.empty();
  if (!step.finite || !std::isfinite(step.loss_scale) || !all_finite(step.local_sqnorm_sum) ||
      !all_finite(step.global_sqnorm) || (pair_used && !all_finite(step.pair_sqnorm))) {
    result.status = last_step_ = GnsStepStatus::skipped_non_finite;
    result.point = {kNaN, kNaN};
    return result;
  }
  if (groups_.empty()) groups_.resize(p);

  const double inv_l2 = 1.0 / (step.loss_scale * step.loss_scale);
  const double b = step.local_batch;
  points_.resize(p);
  double scale = 0.0;
  if (count >= 2) {
    const double n = static_cast<double>(count);
    for (std::size_t i = 0; i < p; ++i) {
      points_[i] = data_parallel_estimate(step.local_sqnorm_sum[i] * inv_l2 / n,
                                          step.global_sqnorm[i], n, b);
    }
    scale = n * b / options_.base_batch;
  } else if (pair_used) {
    for (std::size_t i = 0; i < p; ++i) {
      const double current = step.local_sqnorm_sum[i] * inv_l2;
      points_[i] = data_parallel_estimate(0.5 * (groups_[i].previous_sqnorm + current),
                                          step.pair_sqnorm[i], 2.0, b);
    }
    scale = 2.0 * b / options_.base_batch;
  } else {
    for (std::size_t i = 0; i < p; ++i) {
      groups_[i].previous_sqnorm = step.local_sqnorm_sum[i] * inv_l2;
    }
    have_previous_ = true;
    result.status = last_step_ = GnsStepStatus::no_previous_step;
    result.point = {kNaN, kNaN};
    return result;
  }

  GnsPoint total;
  for (const GnsPoint& point : points_) {
    total.sqr += point.sqr;
    total.tr_sigma += point.tr_sigma;
  }
  if (!std::isfinite(total.sqr) || !std::isfinite(total.tr_sigma)) {
    // Finite inputs whose estimate overflowed: treated like a non-finite input.
    result.status = last_step_ = GnsStepStatus::skipped_non_finite;
    result.point = {kNaN, kNaN};
    return result;
  }

  if (count >= 2) {
    have_previous_ = false;  // a later single-worker step needs a fresh previous gradient
  } else {
    for (std::size_t i = 0; i < p; ++i) {
      groups_[i].previous_sqnorm = step.local_sqnorm_sum[i] * inv_l2;
    }
  }
  const bool biased = count == 1;
  take(points_, scale, biased);
  result.status = last_step_ = GnsStepStatus::accepted;
  result.point = total;
  result.biased = biased;
  return result;
}

void GnsEstimator::take(std::span<const GnsPoint> points, double scale, bool biased) {
  if (biased_ && !biased) {
    // Unbiased samples after difference-estimator ones (e.g. the job scaled out): start over.
    for (Group& group : groups_) {
      group.sqr.reset();
      group.tr_sigma.reset();
    }
    base_steps_ = 0.0;
    steps_ = 0;
    biased_ = false;
  }
  biased_ = biased_ || biased;
  const double theta = options_.smoothing == GnsSmoothing::mean
                           ? 1.0 - 1.0 / static_cast<double>(steps_ + 1)
                           : scaled_theta(options_.theta_base, scale);
  for (std::size_t i = 0; i < points.size(); ++i) {
    groups_[i].sqr.update(points[i].sqr, theta);
    groups_[i].tr_sigma.update(points[i].tr_sigma, theta);
  }
  base_steps_ += scale;
  ++steps_;
}

GnsEstimate GnsEstimator::estimate() const {
  GnsEstimate e;
  e.base_batch = options_.base_batch;
  e.base_steps = base_steps_;
  e.steps = steps_;
  e.biased = biased_;
  e.last_step = last_step_;
  if (steps_ == 0) {
    e.raw = e.read = {kNaN, kNaN};
    e.b_simple = kNaN;
    e.reason = last_step_ == GnsStepStatus::accepted
                   ? std::string("no step accepted yet")
                   : std::string("no step accepted yet; last step: ") + to_string(last_step_);
    return e;
  }
  for (const Group& group : groups_) {
    e.raw.sqr += group.sqr.value();
    e.raw.tr_sigma += group.tr_sigma.value();
  }
  e.read.sqr = std::max(e.raw.sqr, 0.0);
  e.read.tr_sigma = std::max(e.raw.tr_sigma, kTrSigmaFloorPerSample * options_.base_batch);
  e.b_simple =
      e.read.sqr > 0.0 ? e.read.tr_sigma / e.read.sqr : std::numeric_limits<double>::infinity();
  e.effective_steps = groups_.front().sqr.effective_count();

  const double slack = 1.0 - kThresholdSlack;
  if (e.effective_steps < options_.min_effective_steps * slack) {
    e.reason =
        format("warming up: n_eff %.4g < %.4g", e.effective_steps, options_.min_effective_steps);
  } else if (base_steps_ < min_base_steps_ * slack) {
    e.reason =
        format("warming up: %.6g of %.6g base-equivalent steps", base_steps_, min_base_steps_);
  } else {
    e.valid = true;
  }
  if (!e.valid && last_step_ != GnsStepStatus::accepted) {
    e.reason += std::string("; last step: ") + to_string(last_step_);
  }
  return e;
}

GnsPoint GnsEstimator::group(std::size_t i) const noexcept {
  return {groups_[i].sqr.value(), groups_[i].tr_sigma.value()};
}

void GnsEstimator::reset() noexcept {
  groups_.clear();
  points_.clear();
  have_previous_ = false;
  biased_ = false;
  base_steps_ = 0.0;
  steps_ = 0;
  last_step_ = GnsStepStatus::accepted;
}

double gain_ratio(GnsPoint guarded, double base_batch, double scale) noexcept {
  const double var = guarded.tr_sigma / base_batch;  // σ² of one base-batch gradient
  const double denominator = var / scale + guarded.sqr;
  if (denominator == 0.0) return 1.0;
  return (var + guarded.sqr) / denominator;
}

double efficiency(double phi, double base_batch, double global_batch) noexcept {
  if (std::isinf(phi) && phi > 0.0) return 1.0;
  return (phi + base_batch) / (phi + global_batch);
}

double lr_factor(LrScaling rule, double scale, double gain) noexcept {
  switch (rule) {
    case LrScaling::linear: return scale;
    case LrScaling::square_root: return std::sqrt(scale);
    case LrScaling::adascale: return gain;
    case LrScaling::adamscale: return std::sqrt(gain);
  }
  return kNaN;
}

BatchTradeoff batch_tradeoff(double noise_scale, double batch) noexcept {
  return {1.0 + noise_scale / batch, 1.0 + batch / noise_scale, 1.0 / (1.0 + noise_scale / batch)};
}

}  // namespace kf::monitor
