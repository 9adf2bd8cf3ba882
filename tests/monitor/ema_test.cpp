// SPDX-License-Identifier: Apache-2.0
// The KAT-EMA known answers (tolerance 1e-12 relative), and n_eff.
#include "kf/monitor/ema.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kRel = 1e-12;

void expect_rel(double actual, double expected, double rel = kRel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

const std::vector<double> kInputs{10.0, 20.0, 30.0};

TEST(DebiasedEma, MatchesKatEma) {
  DebiasedEma ema;
  EXPECT_TRUE(std::isnan(ema.value()));
  const std::vector<double> expected{10.0, 15.263157894736842, 20.701107011070110};
  for (std::size_t i = 0; i < kInputs.size(); ++i) {
    ema.update(kInputs[i], 0.9);
    expect_rel(ema.value(), expected[i]);
  }
  EXPECT_EQ(ema.updates(), 3);
}

TEST(DebiasedEma, ConstantInputStaysConstant) {
  DebiasedEma ema;
  ema.update(7.0, 0.999);
  EXPECT_EQ(ema.value(), 7.0);  // the first value is exactly x₁
  for (int i = 1; i < 1000; ++i) ema.update(7.0, 0.999);
  expect_rel(ema.value(), 6.999999999999978);
}

TEST(DebiasedEma, ConstantInputStaysConstantWhenThetaVaries) {
  DebiasedEma ema;
  for (double s : {1.0, 8.0, 2.0, 64.0, 0.5}) {
    ema.update(3.25, scaled_theta(0.999, s));
    expect_rel(ema.value(), 3.25);
  }
}

TEST(DebiasedEma, EffectiveCountOfConstantTheta) {
  // θ = 0.99 over 2000 updates: n_eff = 199.00 (KAT-GNS-2E; (1+θ)/(1−θ) in the limit).
  DebiasedEma ema;
  EXPECT_EQ(ema.effective_count(), 0.0);
  for (int t = 0; t < 2000; ++t) ema.update(1.0, 0.99);
  EXPECT_NEAR(ema.effective_count(), 199.0, 0.005);
}

TEST(DebiasedEma, PlainMeanThetaGivesEqualWeights) {
  // θ_t = 1 − 1/t weights every input equally: the mean, and n_eff = t.
  DebiasedEma ema;
  const std::vector<double> xs{4.0, -2.0, 9.0, 1.5, 0.25};
  double sum = 0.0;
  for (std::size_t t = 1; t <= xs.size(); ++t) {
    ema.update(xs[t - 1], 1.0 - 1.0 / static_cast<double>(t));
    sum += xs[t - 1];
    expect_rel(ema.value(), sum / static_cast<double>(t));
    expect_rel(ema.effective_count(), static_cast<double>(t));
  }
  ema.reset();
  EXPECT_TRUE(std::isnan(ema.value()));
  EXPECT_EQ(ema.updates(), 0);
}

TEST(FirstValueEma, MatchesKatEma) {
  FirstValueEma ema(0.9);
  EXPECT_TRUE(std::isnan(ema.value()));
  const std::vector<double> expected{10.0, 11.0, 12.9};
  for (std::size_t i = 0; i < kInputs.size(); ++i) {
    ema.update(kInputs[i]);
    expect_rel(ema.value(), expected[i]);
  }
}

TEST(MeanThenEwma, MatchesKatEma) {
  MeanThenEwma ema(0.5);
  EXPECT_TRUE(std::isnan(ema.value()));
  const std::vector<double> expected{10.0, 15.0, 22.5};
  for (std::size_t i = 0; i < kInputs.size(); ++i) {
    ema.update(kInputs[i]);
    expect_rel(ema.value(), expected[i]);
  }
}

TEST(MeanThenEwma, SwitchesToTheEmaAtOneOverOneMinusTheta) {
  // θ = 0.75: the mean for t < 4, then the EMA. Inputs 1, 2, 3, 10: the mean gives 2 after
  // three steps; the fourth is an EMA step 0.75·2 + 0.25·10 = 4 (the mean would be 4 as well,
  // so the fifth decides: EMA 0.75·4 + 0.25·0 = 3, mean 16/5 = 3.2).
  MeanThenEwma ema(0.75);
  for (double x : {1.0, 2.0, 3.0}) ema.update(x);
  expect_rel(ema.value(), 2.0);
  ema.update(10.0);
  expect_rel(ema.value(), 4.0);
  ema.update(0.0);
  expect_rel(ema.value(), 3.0);
}

TEST(ScaledTheta, MatchesKatEma) {
  expect_rel(scaled_theta(0.999, 1.0), 0.999);
  expect_rel(scaled_theta(0.999, 2.0), 0.998001);
  // The known answers have 9 decimals; the full values are 0.999^8 and 0.999^64.
  EXPECT_NEAR(scaled_theta(0.999, 8.0), 0.992027944, 5e-10);
  EXPECT_NEAR(scaled_theta(0.999, 64.0), 0.937974964, 5e-10);
  EXPECT_NEAR(scaled_theta(0.999, 1000.0), 0.367695425, 5e-10);
}

}  // namespace
}  // namespace kf::monitor
