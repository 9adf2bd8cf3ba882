// SPDX-License-Identifier: Apache-2.0
// The KAT-GOODPUT known answers (tolerance 1e-9 relative; the full-precision values come from
// an independent double-precision computation of t_iter, checked against the rounded table).
#include "kf/monitor/goodput.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

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

constexpr PerfParams kParams{.alpha_c = 0.02,
                             .beta_c = 0.001,
                             .alpha_n = 0.05,
                             .beta_n = 0.005,
                             .alpha_r = 0.01,
                             .beta_r = 0.001,
                             .gamma = 2.0};
constexpr double kPhi = 1000.0;
constexpr double kM0 = 128.0;

struct Row {
  Placement placement;
  double m, t_iter, throughput, efficiency, goodput;
};

TEST(GoodputKat, Table) {
  // clang-format off
  const std::vector<Row> rows{
      {{1, 1, 128, 0}, 128, 0.148, 864.8648648648649, 1.0, 864.8648648648649},
      {{1, 4, 64, 0}, 256, 0.08485281374238571, 3016.9889330626024, 0.8980891719745223,
       2709.5250927504903},
      {{2, 8, 64, 0}, 512, 0.116, 4413.793103448275, 0.746031746031746, 3292.829775588396},
      {{2, 8, 64, 1}, 1024, 0.2, 5120.0, 0.5573122529644269, 2853.4387351778655},
      {{4, 16, 32, 0}, 512, 0.13078226179417454, 3914.904001322342, 0.746031746031746,
       2920.642667653176},
  };
  // clang-format on
  const std::vector<double> printed_goodput{864.8649, 2709.5251, 3292.8298, 2853.4387, 2920.6427};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    expect_rel(global_batch(r.placement), r.m);
    expect_rel(iteration_seconds(kParams, r.placement), r.t_iter);
    expect_rel(throughput(kParams, r.placement), r.throughput);
    expect_rel(goodput(kParams, r.placement, kPhi, kM0) / throughput(kParams, r.placement),
               r.efficiency);
    expect_rel(goodput(kParams, r.placement, kPhi, kM0), r.goodput);
    expect_printed(goodput(kParams, r.placement, kPhi, kM0), printed_goodput[i], 4);
  }
}

TEST(GoodputKat, BestLocalBatchIs96) {
  const std::vector<double> ms{16, 32, 48, 64, 96, 128, 192, 256};
  const std::vector<double> printed{1459.0744, 2409.5908, 2980.8123, 3292.8298,
                                    3477.3001, 3392.1468, 3015.1312, 2637.5285};
  double best_m = 0.0, best = 0.0;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const double g = goodput(kParams, {2, 8, ms[i], 0}, kPhi, kM0);
    expect_printed(g, printed[i], 4);
    if (g > best) {
      best = g;
      best_m = ms[i];
    }
  }
  EXPECT_EQ(best_m, 96.0);
  expect_rel(best, 3477.3001311123694);
}

TEST(GoodputModel, SyncTimeTerms) {
  EXPECT_EQ(sync_seconds(kParams, 1, 1), 0.0);
  expect_rel(sync_seconds(kParams, 1, 2), 0.01);  // max(K−2, 0) = 0
  expect_rel(sync_seconds(kParams, 1, 4), 0.012);
  expect_rel(sync_seconds(kParams, 2, 8), 0.08);
  expect_rel(gradient_seconds(kParams, 64), 0.084);
  // γ = 1: no overlap, compute plus sync.
  PerfParams sum = kParams;
  sum.gamma = 1.0;
  expect_rel(iteration_seconds(sum, {2, 8, 64, 0}), 0.084 + 0.08);
}

}  // namespace
}  // namespace kf::monitor
