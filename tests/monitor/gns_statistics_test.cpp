// SPDX-License-Identifier: Apache-2.0
// The statistical KATs GNS-1..GNS-4 and GNS-2E: synthetic Gaussian micro-batch gradients g_j = μ·1
// + (σ/√b)·z, z ~ N(0, I_d), fixed seeds. Pass criterion: |B^ − B_true − bias| ≤ 6·sd(B^), and each
// per-step mean within 6·sd/√T of the truth. B^ is the ratio of the estimator's averages (plain
// means; the debiased EMA with θ = 0.99 for GNS-2E). KungFu's per-rank variant runs on the same
// draws with its own sd (8·sd with the EMA). The draws differ from those of the reference
// computation (Python's Mersenne Twister), so only the sd-based tolerances carry over, not its
// Monte-Carlo numbers. All five configs take well under a second in a release build.
#include "kf/monitor/gns.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace kf::monitor {
namespace {

struct Moments {
  double truth;
  double sd;  // per step
};

struct Config {
  const char* name;
  int d;
  double mu;  // per coordinate
  double sigma;
  double b;
  int workers;
  int accumulation;
  int steps;                      // T
  std::optional<double> theta;    // unset: plain mean
  Moments sqr, tr_sigma;          // per-step |G|²^ and trΣ^
  double b_true, sd_b, bias_b;    // averaged variant
  double sd_b_rank, bias_b_rank;  // per-rank variant
  std::uint64_t seed;
};

// The cases; per-rank sd(B^) and bias from the reference computation ("one-local").
// clang-format off
const std::array<Config, 5> kConfigs{{
    {"GNS-1", 1000, 0.1, 1.0, 16, 8, 1, 100, std::nullopt, {10, 0.67232}, {1000, 16.903}, 100,
     0.72472, 0.004743, 1.2176, 0.008942, 101},
    {"GNS-2", 100, 0.05, 0.5, 4, 4, 1, 2000, std::nullopt, {0.25, 0.28413}, {25, 2.0412}, 100,
     2.6284, 0.06667, 3.8049, 0.1319, 202},
    {"GNS-2E", 100, 0.05, 0.5, 4, 4, 1, 2000, 0.99, {0.25, 0.28413}, {25, 2.0412}, 100, 8.3325,
     0.67, 12.062, 1.326, 303},
    {"GNS-3", 10, 1.0, 1.0, 1, 2, 1, 500, std::nullopt, {10, 5.4772}, {10, 4.4721}, 1, 0.037417,
     0.0008, 0.082462, 0.0026, 404},
    {"GNS-4", 200, 0.2, 2.0, 8, 2, 4, 300, std::nullopt, {8, 1.9457}, {800, 30.237}, 100, 1.4725,
     0.02046, 2.2516, 0.03815, 505},
}};
// clang-format on

class GnsStatistics : public ::testing::TestWithParam<Config> {};

TEST_P(GnsStatistics, RatioOfAveragesMeetsTheSdCriterion) {
  const Config& c = GetParam();
  const int n = c.workers * c.accumulation;
  const double m = n * c.b;
  GnsOptions options;
  options.base_batch = m;  // S = 1: θ_t = θ0
  if (c.theta) {
    options.theta_base = *c.theta;
  } else {
    options.smoothing = GnsSmoothing::mean;
  }
  GnsEstimator gns(options);
  DebiasedEma rank_sqr, rank_tr;  // per-rank variant, averaged like the estimator

  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double noise = c.sigma / std::sqrt(c.b);
  std::vector<double> mean_grad(static_cast<std::size_t>(c.d));
  double sum_sqr = 0.0, sum_tr = 0.0;
  for (int t = 1; t <= c.steps; ++t) {
    std::fill(mean_grad.begin(), mean_grad.end(), 0.0);
    double local_sum = 0.0, own = 0.0;
    for (int j = 0; j < n; ++j) {
      double sq = 0.0;
      for (std::size_t i = 0; i < mean_grad.size(); ++i) {
        const double g = c.mu + noise * normal(rng);
        sq += g * g;
        mean_grad[i] += g;
      }
      local_sum += sq;
      if (j == 0) own = sq;  // rank 0's own first micro-batch
    }
    double global = 0.0;
    for (double& g : mean_grad) {
      g /= n;
      global += g * g;
    }
    const std::array<double, 1> local_v{local_sum}, global_v{global};
    GnsStep step;
    step.local_sqnorm_sum = local_v;
    step.global_sqnorm = global_v;
    step.workers = c.workers;
    step.accumulation_steps = c.accumulation;
    step.local_batch = c.b;
    const GnsStepResult r = gns.update(step);
    ASSERT_EQ(r.status, GnsStepStatus::accepted);
    sum_sqr += r.point.sqr;
    sum_tr += r.point.tr_sigma;

    const GnsPoint p = per_rank_estimate(own, global, n, c.b);
    const double theta = c.theta ? *c.theta : 1.0 - 1.0 / t;
    rank_sqr.update(p.sqr, theta);
    rank_tr.update(p.tr_sigma, theta);
  }

  const GnsEstimate e = gns.estimate();
  ASSERT_EQ(e.steps, c.steps);
  const double b_hat = e.raw.tr_sigma / e.raw.sqr;
  EXPECT_LE(std::abs(b_hat - c.b_true - c.bias_b), 6 * c.sd_b)
      << c.name << ": B^ = " << b_hat << ", truth " << c.b_true << ", sd " << c.sd_b;
  if (e.read.sqr > 0) {
    EXPECT_DOUBLE_EQ(e.b_simple, e.read.tr_sigma / e.read.sqr);
  }

  // Per-step means (unbiased estimators) within 6·sd/√T of the truth.
  const double steps = c.steps;
  const double mean_sqr = sum_sqr / steps, mean_tr = sum_tr / steps;
  EXPECT_LE(std::abs(mean_sqr - c.sqr.truth), 6 * c.sqr.sd / std::sqrt(steps))
      << c.name << ": mean |G|²^ " << mean_sqr;
  EXPECT_LE(std::abs(mean_tr - c.tr_sigma.truth), 6 * c.tr_sigma.sd / std::sqrt(steps))
      << c.name << ": mean trΣ^ " << mean_tr;

  if (c.theta) {
    EXPECT_NEAR(e.effective_steps, 199.00, 0.005);  // θ = 0.99 over 2000 steps
  } else {
    // The estimator averages numerator and denominator separately: its averages are the
    // plain means of the per-step estimates, and B^ their ratio (not a mean of ratios).
    EXPECT_NEAR(e.raw.sqr, mean_sqr, 1e-9 * std::abs(mean_sqr));
    EXPECT_NEAR(e.raw.tr_sigma, mean_tr, 1e-9 * std::abs(mean_tr));
    EXPECT_NEAR(e.effective_steps, steps, 1e-9 * steps);
  }

  const double b_rank = rank_tr.value() / rank_sqr.value();
  const double k = c.theta ? 8.0 : 6.0;
  EXPECT_LE(std::abs(b_rank - c.b_true - c.bias_b_rank), k * c.sd_b_rank)
      << c.name << ": per-rank B^ = " << b_rank;
}

INSTANTIATE_TEST_SUITE_P(Kat, GnsStatistics, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<Config>& param_info) {
                           std::string name = param_info.param.name;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kf::monitor
