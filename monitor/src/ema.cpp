// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/ema.hpp"

#include <cmath>
#include <limits>

namespace kf::monitor {

double scaled_theta(double base, double scale) noexcept { return std::pow(base, scale); }

void DebiasedEma::update(double x, double theta) noexcept {
  const double w = 1.0 - theta;
  m_ = theta * m_ + w * x;
  u_ = theta * u_ + w;
  w2_ = theta * theta * w2_ + w * w;
  ++updates_;
}

double DebiasedEma::value() const noexcept {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : m_ / u_;
}

double DebiasedEma::effective_count() const noexcept { return w2_ > 0.0 ? u_ * u_ / w2_ : 0.0; }

void FirstValueEma::update(double x) noexcept {
  v_ = updates_ == 0 ? x : alpha_ * v_ + (1.0 - alpha_) * x;
  ++updates_;
}

double FirstValueEma::value() const noexcept {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : v_;
}

void MeanThenEwma::update(double x) noexcept {
  ++updates_;
  // The same test as fairscale (count < 1/(1 − θ), in double): with θ = 0.9 the bound is
  // 9.999…98, so the tenth update is already an EMA step.
  if (static_cast<double>(updates_) < 1.0 / (1.0 - theta_)) {
    sum_ += x;
    v_ = sum_ / static_cast<double>(updates_);
  } else {
    v_ = theta_ * v_ + (1.0 - theta_) * x;
  }
}

double MeanThenEwma::value() const noexcept {
  return updates_ == 0 ? std::numeric_limits<double>::quiet_NaN() : v_;
}

}  // namespace kf::monitor
