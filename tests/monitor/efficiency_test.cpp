// SPDX-License-Identifier: Apache-2.0
// The known answers KAT-EFF and KAT-EFF-McC (tolerance 1e-9 relative): Pollux
// efficiency, AdaScale gain, LR scaling rules, scale-invariant progress, McCandlish's
// trade-off. Where a known answer is given with fewer digits than 1e-9 needs, the test checks
// the given value to its last digit and the exact fraction at 1e-9.
#include "kf/monitor/gns.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kf::monitor {
namespace {

constexpr double kRel = 1e-9;

void expect_rel(double actual, double expected, double rel = kRel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

void expect_printed(double actual, double printed, int decimals) {
  EXPECT_LE(std::abs(actual - printed), 0.5 * std::pow(10.0, -decimals) * (1 + 1e-9))
      << "actual " << actual << " printed " << printed;
}

TEST(EfficiencyKat, PolluxEfficiency) {
  expect_rel(efficiency(1000.0, 128.0, 128.0), 1.0);
  expect_printed(efficiency(1000.0, 128.0, 1024.0), 0.557312253, 9);
  expect_rel(efficiency(1000.0, 128.0, 1024.0), 141.0 / 253);
  expect_printed(efficiency(100.0, 32.0, 512.0), 0.215686275, 9);
  expect_rel(efficiency(100.0, 32.0, 512.0), 11.0 / 51);
  expect_rel(efficiency(0.0, 64.0, 256.0), 0.25);  // φ = 0: M0/M
  expect_printed(efficiency(1e9, 64.0, 4096.0), 0.999996, 6);
  expect_rel(efficiency(1e9, 64.0, 4096.0), 2232143.0 / 2232152);
}

TEST(EfficiencyKat, InfiniteNoiseScaleIsFullyEfficient) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(efficiency(inf, 64.0, 4096.0), 1.0);
  EXPECT_EQ(efficiency(inf, 64.0, 64.0), 1.0);
}

// var = 7.8125 and sqr = 1 at M0 = 128: trΣ = 1000, φ = 1000.
constexpr GnsPoint kStats{1.0, 7.8125 * 128.0};

TEST(EfficiencyKat, GainRatioAndItsIdentityWithEfficiency) {
  expect_rel(gain_ratio(kStats, 128.0, 1.0), 1.0);
  expect_printed(gain_ratio(kStats, 128.0, 2.0), 1.796178344, 9);
  expect_rel(gain_ratio(kStats, 128.0, 2.0), 282.0 / 157);
  expect_printed(gain_ratio(kStats, 128.0, 2.0) / 2.0, 0.898089172, 9);
  expect_printed(gain_ratio(kStats, 128.0, 8.0), 4.458498024, 9);
  expect_rel(gain_ratio(kStats, 128.0, 8.0), 1128.0 / 253);
  expect_printed(gain_ratio(kStats, 128.0, 8.0) / 8.0, 0.557312253, 9);
  expect_printed(gain_ratio(kStats, 128.0, 64.0), 7.853785901, 9);
  expect_rel(gain_ratio(kStats, 128.0, 64.0), 3008.0 / 383);
  expect_printed(gain_ratio(kStats, 128.0, 64.0) / 64.0, 0.122715405, 9);
  for (double s : {1.0, 2.0, 8.0, 64.0}) {
    expect_rel(gain_ratio(kStats, 128.0, s) / s, efficiency(1000.0, 128.0, 128.0 * s));
  }
}

TEST(EfficiencyKat, GainLimits) {
  // Noise dominated (μ² → 0): r → S; signal dominated (σ² → 0): r → 1; both 0: 1.
  expect_rel(gain_ratio({0.0, 1000.0}, 128.0, 8.0), 8.0);
  expect_rel(gain_ratio({1.0, 0.0}, 128.0, 8.0), 1.0);
  EXPECT_EQ(gain_ratio({0.0, 0.0}, 128.0, 8.0), 1.0);
}

TEST(EfficiencyKat, LearningRateScalingRules) {
  const double eta0 = 0.1;
  const double r = gain_ratio(kStats, 128.0, 8.0);
  expect_rel(eta0 * lr_factor(LrScaling::linear, 8.0, r), 0.8);
  expect_printed(eta0 * lr_factor(LrScaling::square_root, 8.0, r), 0.282842712, 9);
  expect_rel(eta0 * lr_factor(LrScaling::square_root, 8.0, r), 0.1 * std::sqrt(8.0));
  expect_printed(eta0 * lr_factor(LrScaling::adascale, 8.0, r), 0.445849802, 9);
  expect_rel(eta0 * lr_factor(LrScaling::adascale, 8.0, r), 112.8 / 253);
  expect_printed(eta0 * lr_factor(LrScaling::adamscale, 8.0, r), 0.211151558, 9);
  expect_rel(eta0 * lr_factor(LrScaling::adamscale, 8.0, r), 0.1 * std::sqrt(1128.0 / 253));
}

TEST(EfficiencyKat, ProgressInScaleInvariantIterations) {
  ScaleInvariantProgress progress;
  const double r = gain_ratio(kStats, 128.0, 8.0);
  for (int step = 0; step < 100; ++step) progress.advance(r);
  expect_printed(progress.base_steps(), 445.8498, 4);
  expect_rel(progress.base_steps(), 112800.0 / 253);
}

TEST(EfficiencyKat, McCandlishTradeoff) {
  struct Row {
    double batch, steps, examples, step_size;
  };
  for (const Row& row : {Row{100, 2, 2, 0.5}, Row{400, 1.25, 5, 0.8}, Row{25, 5, 1.25, 0.2},
                         Row{1000, 1.1, 11, 10.0 / 11}}) {
    const BatchTradeoff t = batch_tradeoff(100.0, row.batch);
    expect_rel(t.steps_ratio, row.steps);
    expect_rel(t.examples_ratio, row.examples);
    expect_rel(t.step_size_ratio, row.step_size);
  }
  expect_printed(batch_tradeoff(100.0, 1000.0).step_size_ratio, 0.909091, 6);
}

}  // namespace
}  // namespace kf::monitor
