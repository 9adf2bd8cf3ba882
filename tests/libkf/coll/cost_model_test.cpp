// SPDX-License-Identifier: Apache-2.0
// Known-answer tests KAT-AR-1..6 (α = 5 µs, β = 1e-10 s/B, γ = 0 unless stated, times in µs,
// tolerance 1e-9 relative), plus choose(). The known answers were computed independently in
// double precision. Where one is given rounded to fewer digits than 1e-9 needs (AR-2, AR-3,
// AR-5), the test checks the rounded value to its last digit and the full-precision value at
// 1e-9.
#include "kf/coll/cost_model.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

namespace kf::coll {
namespace {

constexpr double kRel = 1e-9;
constexpr LinkParams kKatLink{5e-6, 1e-10, 0.0};
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

void expect_rel(double actual, double expected, double rel = kRel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

double us(AllreduceModel m, int p, std::size_t n, const LinkParams& link = kKatLink) {
  return allreduce_seconds(m, p, n, link) * 1e6;
}

struct Ar1Row {
  int p;
  std::size_t n;
  double ring, rec_doubling, halving_doubling, binomial_tree, star;
  AllreduceModel argmin;
};

// KAT-AR-1, every row. All these values are exact at four decimals.
constexpr std::array<Ar1Row, 16> kAr1{{
    {2, 4 * KiB, 10.4096, 5.4096, 10.4096, 10.8192, 10.8192, AllreduceModel::recursive_doubling},
    {2, 256 * KiB, 36.2144, 31.2144, 36.2144, 62.4288, 62.4288, AllreduceModel::recursive_doubling},
    {2, 4 * MiB, 429.4304, 424.4304, 429.4304, 848.8608, 848.8608,
     AllreduceModel::recursive_doubling},
    {2, 256 * MiB, 26853.5456, 26848.5456, 26853.5456, 53697.0912, 53697.0912,
     AllreduceModel::recursive_doubling},
    {4, 4 * KiB, 30.6144, 10.8192, 20.6144, 21.6384, 32.4576, AllreduceModel::recursive_doubling},
    {4, 256 * KiB, 69.3216, 62.4288, 59.3216, 124.8576, 187.2864, AllreduceModel::halving_doubling},
    {4, 4 * MiB, 659.1456, 848.8608, 649.1456, 1697.7216, 2546.5824,
     AllreduceModel::halving_doubling},
    {4, 256 * MiB, 40295.3184, 53697.0912, 40285.3184, 107394.1824, 161091.2736,
     AllreduceModel::halving_doubling},
    {8, 4 * KiB, 70.7168, 16.2288, 30.7168, 32.4576, 75.7344, AllreduceModel::recursive_doubling},
    {8, 256 * KiB, 115.8752, 93.6432, 75.8752, 187.2864, 437.0016,
     AllreduceModel::halving_doubling},
    {8, 4 * MiB, 804.0032, 1273.2912, 764.0032, 2546.5824, 5942.0256,
     AllreduceModel::halving_doubling},
    {8, 256 * MiB, 47046.2048, 80545.6368, 47006.2048, 161091.2736, 375879.6384,
     AllreduceModel::halving_doubling},
    {64, 4 * KiB, 630.8064, 32.4576, 60.8064, 64.9152, 681.6096,
     AllreduceModel::recursive_doubling},
    {64, 256 * KiB, 681.6096, 187.2864, 111.6096, 374.5728, 3933.0144,
     AllreduceModel::halving_doubling},
    {64, 4 * MiB, 1455.7536, 2546.5824, 885.7536, 5093.1648, 53478.2304,
     AllreduceModel::halving_doubling},
    {64, 256 * MiB, 53478.2304, 161091.2736, 52908.2304, 322182.5472, 3382916.7456,
     AllreduceModel::halving_doubling},
}};

constexpr std::array<AllreduceModel, 5> kAr1Models{
    AllreduceModel::ring, AllreduceModel::recursive_doubling, AllreduceModel::halving_doubling,
    AllreduceModel::binomial_tree, AllreduceModel::star};

std::array<double, 5> row_values(const Ar1Row& r) {
  return {r.ring, r.rec_doubling, r.halving_doubling, r.binomial_tree, r.star};
}

TEST(CostModel, ReproducesKatAr1Table) {
  for (const auto& r : kAr1) {
    SCOPED_TRACE(testing::Message() << "p=" << r.p << " n=" << r.n);
    const auto want = row_values(r);
    for (std::size_t i = 0; i < kAr1Models.size(); ++i) {
      expect_rel(us(kAr1Models[i], r.p, r.n), want[i]);
    }
  }
}

TEST(CostModel, KatAr1ArgminOverAllModels) {
  for (const auto& r : kAr1) {
    SCOPED_TRACE(testing::Message() << "p=" << r.p << " n=" << r.n);
    AllreduceModel best = kAr1Models[0];
    for (auto m : kAr1Models) {
      if (us(m, r.p, r.n) < us(best, r.p, r.n)) best = m;
    }
    EXPECT_EQ(best, r.argmin);
  }
}

// kf's algorithms map to the textbook formulas: ring → ring, rhd → halving-doubling, tree →
// binomial tree, star → star, clique → sharded PS (= ring).
TEST(CostModel, AlgorithmsUseTheirAllreduceFormulas) {
  for (const auto& r : kAr1) {
    auto t = [&](Algorithm a) {
      return predict_seconds(CollOp::allreduce, a, r.p, r.n, kKatLink) * 1e6;
    };
    expect_rel(t(Algorithm::ring), r.ring);
    expect_rel(t(Algorithm::clique), r.ring);
    // rhd runs recursive doubling up to kRecursiveDoublingMaxBytes, halving-doubling above.
    expect_rel(t(Algorithm::rhd),
               r.n <= kRecursiveDoublingMaxBytes ? r.rec_doubling : r.halving_doubling);
    expect_rel(t(Algorithm::tree), r.binomial_tree);
    expect_rel(t(Algorithm::star), r.star);
  }
}

// kf's rhd is recursive doubling for small messages and halving-doubling for large ones, so
// choose() returns rhd wherever KAT-AR-1's argmin is either of them, except at p = 2 for large
// messages, where ring and halving-doubling tie exactly and ring comes first in the tie order.
TEST(CostModel, ChooseTakesKatAr1Argmin) {
  for (const auto& r : kAr1) {
    SCOPED_TRACE(testing::Message() << "p=" << r.p << " n=" << r.n);
    const Algorithm want =
        r.p == 2 && r.n > kRecursiveDoublingMaxBytes ? Algorithm::ring : Algorithm::rhd;
    EXPECT_EQ(choose(CollOp::allreduce, r.n, r.p, kKatLink), want);
    if (r.argmin == AllreduceModel::halving_doubling) {
      EXPECT_EQ(choose(CollOp::allreduce, r.n, r.p, kKatLink), Algorithm::rhd);
    }
  }
}

TEST(CostModel, ChooseNeverReturnsDefaultOrAuto) {
  const LinkParams links[] = {kKatLink, LinkParams{}, LinkParams{1e-3, 1e-12, 1e-9}};
  for (const auto& link : links) {
    for (auto op : {CollOp::allreduce, CollOp::broadcast, CollOp::allgather, CollOp::reduce_scatter,
                    CollOp::gather, CollOp::barrier, CollOp::consensus}) {
      for (int p : {1, 2, 3, 5, 6, 7, 8, 12, 64, 100}) {
        for (std::size_t n : {std::size_t{0}, 4 * KiB, 4 * MiB, 256 * MiB}) {
          const Algorithm a = choose(op, n, p, link);
          EXPECT_NE(a, Algorithm::job_default);
          EXPECT_NE(a, Algorithm::auto_select);
          for (auto other : kSelectableAlgorithms) {
            EXPECT_LE(predict_seconds(op, a, p, n, link), predict_seconds(op, other, p, n, link));
          }
        }
      }
    }
  }
}

TEST(CostModel, ChooseBreaksTiesInFixedOrder) {
  // p = 1: everything costs 0, so the first algorithm of the order wins.
  EXPECT_EQ(choose(CollOp::allreduce, 4 * MiB, 1, kKatLink), kSelectableAlgorithms.front());
  // ring and clique always tie on allreduce; ring comes first, so clique is never picked.
  for (int p = 2; p <= 33; ++p) {
    EXPECT_NE(choose(CollOp::allreduce, 64 * MiB, p, kKatLink), Algorithm::clique);
  }
  // Large messages on non-power-of-two p: the fold makes rhd lose to ring (KAT-AR-3).
  EXPECT_EQ(choose(CollOp::allreduce, 4 * MiB, 6, kKatLink), Algorithm::ring);
}

TEST(CostModel, SingleRankCostsNothing) {
  const LinkParams link{};
  for (auto m :
       {AllreduceModel::ring, AllreduceModel::recursive_doubling, AllreduceModel::halving_doubling,
        AllreduceModel::binomial_tree, AllreduceModel::star, AllreduceModel::sharded_ps,
        AllreduceModel::pipelined_tree}) {
    EXPECT_EQ(allreduce_seconds(m, 1, 256 * MiB, link), 0.0);
  }
  for (auto op : {CollOp::allreduce, CollOp::broadcast, CollOp::allgather, CollOp::reduce_scatter,
                  CollOp::gather, CollOp::barrier, CollOp::consensus}) {
    for (auto a : kSelectableAlgorithms) {
      EXPECT_EQ(predict_seconds(op, a, 1, 256 * MiB, link), 0.0);
    }
  }
}

struct Crossover {
  int p;
  double printed;  // the known answer, four decimals
  double full;     // the same, full precision
};

TEST(CostModel, ReproducesKatAr2Crossovers) {
  const Crossover vs_hd[] = {{4, 200000.0, 200000.0},
                             {8, 120000.0, 120000.00000000001},
                             {16, 94117.6471, 94117.64705882352},
                             {64, 74418.6047, 74418.60465116281}};
  const Crossover vs_ring[] = {{4, 400000.0, 400000.0},
                               {8, 440000.0, 440000.0},
                               {16, 611764.7059, 611764.705882353},
                               {64, 1488372.0930, 1488372.093023256}};
  for (const auto& c : vs_hd) {
    const auto n =
        crossover_bytes(allreduce_coefficients(AllreduceModel::recursive_doubling, c.p),
                        allreduce_coefficients(AllreduceModel::halving_doubling, c.p), kKatLink);
    ASSERT_TRUE(n.has_value());
    EXPECT_NEAR(*n, c.printed, 0.5e-4);
    expect_rel(*n, c.full);
    // The two formulas agree there.
    expect_rel(
        evaluate(allreduce_coefficients(AllreduceModel::recursive_doubling, c.p), *n, kKatLink),
        evaluate(allreduce_coefficients(AllreduceModel::halving_doubling, c.p), *n, kKatLink));
  }
  for (const auto& c : vs_ring) {
    const auto n = crossover_bytes(allreduce_coefficients(AllreduceModel::recursive_doubling, c.p),
                                   allreduce_coefficients(AllreduceModel::ring, c.p), kKatLink);
    ASSERT_TRUE(n.has_value());
    EXPECT_NEAR(*n, c.printed, 0.5e-4);
    expect_rel(*n, c.full);
  }
}

TEST(CostModel, CrossoverOfParallelOrNegativeLinesIsNone) {
  const auto ring = allreduce_coefficients(AllreduceModel::ring, 8);
  EXPECT_FALSE(crossover_bytes(ring, ring, kKatLink).has_value());
  // Star has more latency and more bandwidth than halving-doubling: no crossing at n >= 0.
  const auto hd = allreduce_coefficients(AllreduceModel::halving_doubling, 8);
  EXPECT_FALSE(
      crossover_bytes(hd, allreduce_coefficients(AllreduceModel::star, 8), kKatLink).has_value());
}

TEST(CostModel, ReproducesKatAr3FoldedHalvingDoubling) {
  struct Row {
    std::size_t n;
    double ring_printed, ring_full, hd_printed, hd_full;
    Algorithm winner;
  };
  const Row rows[] = {
      {4 * KiB, 50.6827, 50.68266666666667, 31.4336, 31.433600000000002, Algorithm::rhd},
      {256 * KiB, 93.6907, 93.69066666666667, 121.7504, 121.7504, Algorithm::ring},
      {4 * MiB, 749.0507, 749.0506666666668, 1498.0064, 1498.0064000000002, Algorithm::ring},
      {256 * MiB, 44789.2427, 44789.24266666667, 93982.4096, 93982.40960000001, Algorithm::ring},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(testing::Message() << "n=" << r.n);
    const double ring = us(AllreduceModel::ring, 6, r.n);
    const double hd = us(AllreduceModel::halving_doubling, 6, r.n);
    EXPECT_NEAR(ring, r.ring_printed, 0.5e-4);
    EXPECT_NEAR(hd, r.hd_printed, 0.5e-4);
    expect_rel(ring, r.ring_full);
    expect_rel(hd, r.hd_full);
    const Algorithm winner = ring <= hd ? Algorithm::ring : Algorithm::rhd;
    EXPECT_EQ(winner, r.winner);
  }
}

TEST(CostModel, FoldAddsOneInAndOneOutStep) {
  // With γ the fold is (α + nβ + nγ) + (α + nβ) on top of the algorithm on p' ranks.
  const LinkParams link{5e-6, 1e-10, 2.5e-11};
  const std::size_t n = 64 * MiB;
  const double extra = 2 * link.alpha_s + 2 * n * link.beta_s_per_byte + n * link.gamma_s_per_byte;
  for (int p : {3, 5, 6, 7, 12}) {
    const int pp = p == 12 ? 8 : (p >= 4 ? 4 : 2);
    expect_rel(allreduce_seconds(AllreduceModel::halving_doubling, p, n, link),
               allreduce_seconds(AllreduceModel::halving_doubling, pp, n, link) + extra);
    expect_rel(allreduce_seconds(AllreduceModel::recursive_doubling, p, n, link),
               allreduce_seconds(AllreduceModel::recursive_doubling, pp, n, link) + extra);
  }
}

TEST(CostModel, ReproducesKatAr4WithGamma) {
  const LinkParams link{5e-6, 1e-10, 2.5e-11};
  const std::size_t n = 64 * MiB;
  expect_rel(us(AllreduceModel::ring, 8, n, link), 13282.0576);
  expect_rel(us(AllreduceModel::recursive_doubling, 8, n, link), 25180.8240);
  expect_rel(us(AllreduceModel::halving_doubling, 8, n, link), 13242.0576);
  expect_rel(us(AllreduceModel::binomial_tree, 8, n, link), 45328.4832);
  expect_rel(us(AllreduceModel::star, 8, n, link), 105766.4608);
  EXPECT_EQ(choose(CollOp::allreduce, n, 8, link), Algorithm::rhd);
}

// KAT-AR-5: ring at p = 8, T = 14α + 1.75β·n, times perturbed by fixed factors.
std::vector<TimingSample> kat_ar5_samples() {
  const double pert[] = {1.02, 0.99, 1.01, 0.98, 1.00};
  const int log2n[] = {10, 14, 18, 22, 26};
  std::vector<TimingSample> s;
  for (int i = 0; i < 5; ++i) {
    const std::size_t n = std::size_t{1} << log2n[i];
    s.push_back({n, (14 * 5e-6 + 1.75 * 1e-10 * static_cast<double>(n)) * pert[i]});
  }
  return s;
}

TEST(CostModel, KatAr5SamplesMatchAppendix) {
  const double printed[] = {7.158278400e-05, 7.213852800e-05, 1.170339520e-04, 7.879231360e-04,
                            1.181405120e-02};
  const auto s = kat_ar5_samples();
  for (int i = 0; i < 5; ++i) expect_rel(s[i].seconds, printed[i]);
}

TEST(CostModel, ReproducesKatAr5UnweightedFit) {
  const auto s = kat_ar5_samples();
  const LineFit line = fit_line_nonnegative(s, FitWeighting::uniform);
  expect_rel(line.intercept_s, 6.659054658e-05);
  expect_rel(line.slope_s_per_byte, 1.750391277e-10);
  const LinkParams got = fit_alpha_beta(
      s, {allreduce_coefficients(AllreduceModel::ring, 8), 0.0, FitWeighting::uniform});
  EXPECT_NEAR(got.alpha_s, 4.756468e-06, 0.5e-12);
  EXPECT_NEAR(got.beta_s_per_byte, 1.000224e-10, 0.5e-16);
  expect_rel(got.alpha_s, 4.756467612578649e-06);
  expect_rel(got.beta_s_per_byte, 1.0002235868512483e-10);
  EXPECT_NEAR(1.75 / line.slope_s_per_byte / 1e9, 9.9978, 0.5e-4);  // GB/s
  EXPECT_EQ(got.gamma_s_per_byte, 0.0);
}

TEST(CostModel, ReproducesKatAr5WeightedFit) {
  const auto s = kat_ar5_samples();
  const LineFit line = fit_line_nonnegative(s, FitWeighting::inverse_time);
  expect_rel(line.intercept_s, 7.051871212758949e-05);
  expect_rel(line.slope_s_per_byte, 1.7341804026254965e-10);
  const LinkParams got = fit_alpha_beta(
      s, {allreduce_coefficients(AllreduceModel::ring, 8), 0.0, FitWeighting::inverse_time});
  EXPECT_NEAR(got.alpha_s, 5.037051e-06, 0.5e-12);
  EXPECT_NEAR(got.beta_s_per_byte, 9.909602e-11, 0.5e-17);
  expect_rel(got.alpha_s, 5.037050866256392e-06);
  expect_rel(got.beta_s_per_byte, 9.909602300717123e-11);
  // The unweighted fit underestimates α (the large sizes dominate its squared error).
  const LinkParams unweighted = fit_alpha_beta(
      s, {allreduce_coefficients(AllreduceModel::ring, 8), 0.0, FitWeighting::uniform});
  EXPECT_LT(unweighted.alpha_s, got.alpha_s);
}

TEST(CostModel, FitRecoversExactParametersWithGamma) {
  const LinkParams truth{7e-6, 2e-10, 3e-11};
  const auto coef = allreduce_coefficients(AllreduceModel::halving_doubling, 6);
  std::vector<TimingSample> s;
  for (std::size_t n = 1024; n <= 64 * MiB; n *= 4) s.push_back({n, evaluate(coef, n, truth)});
  for (auto w : {FitWeighting::uniform, FitWeighting::inverse_time}) {
    const LinkParams got = fit_alpha_beta(s, {coef, truth.gamma_s_per_byte, w});
    expect_rel(got.alpha_s, truth.alpha_s, 1e-6);
    expect_rel(got.beta_s_per_byte, truth.beta_s_per_byte, 1e-9);
    EXPECT_EQ(got.gamma_s_per_byte, truth.gamma_s_per_byte);
  }
}

TEST(CostModel, FitClampsNegativeCoefficientsToZero) {
  // Times that fall with size: the unconstrained slope is negative; NNLS gives c1 = 0 and the
  // (weighted) mean time as c0.
  const std::vector<TimingSample> falling{{1000, 3.0}, {2000, 2.0}, {3000, 1.0}};
  const LineFit f = fit_line_nonnegative(falling, FitWeighting::uniform);
  EXPECT_EQ(f.slope_s_per_byte, 0.0);
  expect_rel(f.intercept_s, 2.0);
  // A line through a negative intercept: NNLS gives c0 = 0 and the fit through the origin,
  // Σn·T/Σn² = (1000·1 + 2000·3 + 3000·5)/(1000² + 2000² + 3000²).
  const std::vector<TimingSample> steep{{1000, 1.0}, {2000, 3.0}, {3000, 5.0}};
  const LineFit g = fit_line_nonnegative(steep, FitWeighting::uniform);
  EXPECT_EQ(g.intercept_s, 0.0);
  expect_rel(g.slope_s_per_byte, 22000.0 / 14e6);
}

TEST(CostModel, FitRejectsBadInput) {
  const CalibrationOptions ring8{allreduce_coefficients(AllreduceModel::ring, 8)};
  const std::vector<TimingSample> one_size{{1024, 1e-5}, {1024, 2e-5}};
  EXPECT_THROW(fit_alpha_beta(one_size, ring8), std::invalid_argument);
  EXPECT_THROW(fit_alpha_beta(std::vector<TimingSample>{}, ring8), std::invalid_argument);
  const std::vector<TimingSample> zero_time{{1024, 0.0}, {4096, 2e-5}};
  EXPECT_THROW(fit_alpha_beta(zero_time, ring8), std::invalid_argument);
  const std::vector<TimingSample> nan_time{{1024, NAN}, {4096, 2e-5}};
  EXPECT_THROW(fit_line_nonnegative(nan_time, FitWeighting::uniform), std::invalid_argument);
  const std::vector<TimingSample> ok{{1024, 1e-5}, {4096, 2e-5}};
  EXPECT_THROW(fit_alpha_beta(ok, {allreduce_coefficients(AllreduceModel::ring, 1)}),
               std::invalid_argument);
}

// KAT-AR-6: NCCL-style models with per-hop latency l as α and 1/busBw as β: the ring is the
// ring formula (busBw·p/(2(p−1)) algorithm bandwidth), the tree is the pipelined tree
// (busBw/2).
TEST(CostModel, ReproducesKatAr6NcclStyleRingVsTree) {
  const LinkParams nccl{5e-6, 1.0 / 10e9, 0.0};
  struct Row {
    std::size_t n;
    double ring, tree;
  };
  const Row rows[] = {{65536, 162.2880, 53.1072},
                      {1048576, 346.6080, 249.7152},
                      {8388608, 1722.8640, 1717.7216},
                      {16777216, 3295.7280, 3395.4432},
                      {268435456, 50481.6480, 53727.0912}};
  for (const auto& r : rows) {
    SCOPED_TRACE(testing::Message() << "n=" << r.n);
    expect_rel(us(AllreduceModel::ring, 16, r.n, nccl), r.ring);
    expect_rel(us(AllreduceModel::pipelined_tree, 16, r.n, nccl), r.tree);
  }
  const auto n = crossover_bytes(allreduce_coefficients(AllreduceModel::ring, 16),
                                 allreduce_coefficients(AllreduceModel::pipelined_tree, 16), nccl);
  ASSERT_TRUE(n.has_value());
  expect_rel(*n, 8800000.0);
}

TEST(CostModel, OtherOpsFollowTheirFormulas) {
  const LinkParams link{5e-6, 1e-10, 2.5e-11};
  const double a = link.alpha_s, b = link.beta_s_per_byte, g = link.gamma_s_per_byte;
  const double n = 8 * MiB;
  const int p = 8;  // L = 3, f = 7/8
  auto t = [&](CollOp op, Algorithm alg) { return predict_seconds(op, alg, p, 8 * MiB, link); };
  expect_rel(t(CollOp::broadcast, Algorithm::star), 7 * (a + n * b));
  expect_rel(t(CollOp::broadcast, Algorithm::ring), 7 * (a + n * b));
  expect_rel(t(CollOp::broadcast, Algorithm::tree), 3 * (a + n * b));
  expect_rel(t(CollOp::broadcast, Algorithm::rhd), 3 * (a + n * b));
  expect_rel(t(CollOp::allgather, Algorithm::ring), 7 * a + 0.875 * n * b);
  expect_rel(t(CollOp::allgather, Algorithm::clique), 7 * a + 0.875 * n * b);
  expect_rel(t(CollOp::allgather, Algorithm::rhd), 3 * a + 0.875 * n * b);
  expect_rel(t(CollOp::allgather, Algorithm::tree), 6 * a + 3.875 * n * b);
  expect_rel(t(CollOp::allgather, Algorithm::star), 14 * a + 7.875 * n * b);
  expect_rel(t(CollOp::reduce_scatter, Algorithm::ring), 7 * a + 0.875 * n * (b + g));
  expect_rel(t(CollOp::reduce_scatter, Algorithm::rhd), 3 * a + 0.875 * n * (b + g));
  expect_rel(t(CollOp::reduce_scatter, Algorithm::tree), 10 * a + 3.875 * n * b + 3 * n * g);
  expect_rel(t(CollOp::reduce_scatter, Algorithm::star), 14 * a + 7.875 * n * b + 7 * n * g);
  expect_rel(t(CollOp::gather, Algorithm::star), 7 * a + 0.875 * n * b);
  expect_rel(t(CollOp::gather, Algorithm::tree), 3 * a + 0.875 * n * b);
  expect_rel(t(CollOp::barrier, Algorithm::ring), 14 * a);
  expect_rel(t(CollOp::barrier, Algorithm::rhd), 6 * a);
  expect_rel(t(CollOp::consensus, Algorithm::ring), t(CollOp::allreduce, Algorithm::ring));
  // rhd allgather and reduce_scatter run as ring when p is not a power of two.
  expect_rel(predict_seconds(CollOp::allgather, Algorithm::rhd, 6, 8 * MiB, link),
             predict_seconds(CollOp::allgather, Algorithm::ring, 6, 8 * MiB, link));
  // Small barriers prefer the log-depth algorithms, large allgathers the ring family.
  EXPECT_EQ(choose(CollOp::barrier, 0, 64, link), Algorithm::rhd);
  EXPECT_EQ(choose(CollOp::allgather, 256 * MiB, 8, link), Algorithm::rhd);
  EXPECT_EQ(choose(CollOp::allgather, 256 * MiB, 6, link), Algorithm::ring);
}

TEST(CostModel, DefaultLinkIsLoopbackOrderOfMagnitude) {
  const LinkParams link{};
  EXPECT_EQ(link.alpha_s, 15e-6);
  expect_rel(1.0 / link.beta_s_per_byte, 2.5e9);
  expect_rel(1.0 / link.gamma_s_per_byte, 5e9);
}

// The same-host link moves ring's crossover with recursive doubling down to tens of KiB. Two
// workers: ring 2α + nβ + 0.5nγ against α + nβ + nγ, so n = 2α/γ = 40 KB. Four: ring 6α +
// 1.5nβ + 0.75nγ against 2α + 2nβ + 2nγ, so n = 4α/(0.5β + 1.25γ) = 45.7 KB. Over the default
// link the same crossovers lie at 150 KB and 133 KB.
TEST(CostModel, SameHostLinkPicksTheRingFromTensOfKiB) {
  constexpr std::size_t KiB = 1024;
  for (int p : {2, 4}) {
    EXPECT_EQ(choose(CollOp::allreduce, 4, p, kSameHostLink), Algorithm::rhd) << p;
    EXPECT_EQ(choose(CollOp::allreduce, 16 * KiB, p, kSameHostLink), Algorithm::rhd) << p;
    EXPECT_EQ(choose(CollOp::allreduce, 64 * KiB, p, kSameHostLink), Algorithm::ring) << p;
    EXPECT_EQ(choose(CollOp::allreduce, 64 * KiB, p, LinkParams{}), Algorithm::rhd) << p;
  }
  const auto ring = allreduce_coefficients(AllreduceModel::ring, 2);
  const auto rd = allreduce_coefficients(AllreduceModel::recursive_doubling, 2);
  const auto x = crossover_bytes(ring, rd, kSameHostLink);
  ASSERT_TRUE(x.has_value());
  expect_rel(*x, 40e3);
  // Above 64 KiB rhd runs halving-doubling, whose latency term is below the ring's: 4 workers
  // take it there on either link.
  EXPECT_EQ(choose(CollOp::allreduce, 1024 * KiB, 4, kSameHostLink), Algorithm::rhd);
}

// Three hosts of two, m = 600 kB per shard (a ring among the three owners):
// in = α + m(β + γ), among = 4α + (4/3)mβ + (2/3)mγ, out = α + mβ.
TEST(CostModel, HierarchicalFollowsItsFormula) {
  const LinkParams l{1e-6, 1e-9, 2e-9};
  const Topology t{3, 2, 2};
  expect_rel(hierarchical_seconds(CollOp::allreduce, 1'200'000, t, l, l),
             (1e-6 + 6e5 * 3e-9) + (4e-6 + 8e-4 + 8e-4) + (1e-6 + 6e5 * 1e-9));
  // A leader per host (s = 1): the whole vector in and out, recursive doubling below 64 KiB
  // among the leaders of three hosts (folded: 3 messages, 3 vectors, 2 reductions).
  const Topology uneven{3, 1, 2};
  const double n = 1000;
  expect_rel(hierarchical_seconds(CollOp::allreduce, 1000, uneven, l, l),
             (1e-6 + n * 3e-9) + (3 * 1e-6 + 3 * n * 1e-9 + 2 * n * 2e-9) + (1e-6 + n * 1e-9));
  // Without a layout it is a ring.
  const auto ring = coefficients(CollOp::allreduce, Algorithm::ring, 6);
  const auto hier = coefficients(CollOp::allreduce, Algorithm::hierarchical, 6);
  EXPECT_EQ(hier.latency, ring.latency);
  EXPECT_EQ(hier.bandwidth, ring.bandwidth);
  EXPECT_EQ(hier.reduction, ring.reduction);
}

// Across hosts with several workers each, large allreduces go per host first; with one worker
// per host, or on one host, the flat choice stands; other operations never take it.
TEST(CostModel, ChooseTakesHierarchicalAcrossHosts) {
  const Topology three_by_two{3, 2, 2};
  EXPECT_EQ(
      choose(CollOp::allreduce, 64 * KiB * 1024, 6, three_by_two, kSameHostLink, LinkParams{}),
      Algorithm::hierarchical);
  EXPECT_EQ(choose(CollOp::allreduce, 1024 * KiB, 6, three_by_two, kSameHostLink, LinkParams{}),
            Algorithm::hierarchical);
  EXPECT_EQ(choose(CollOp::allgather, 1024 * KiB, 6, three_by_two, kSameHostLink, LinkParams{}),
            choose(CollOp::allgather, 1024 * KiB, 6, LinkParams{}));
  const Topology one_each{3, 1, 1};
  EXPECT_EQ(choose(CollOp::allreduce, 1024 * KiB, 3, one_each, kSameHostLink, LinkParams{}),
            choose(CollOp::allreduce, 1024 * KiB, 3, LinkParams{}));
  const Topology one_host{1, 4, 4};
  EXPECT_EQ(choose(CollOp::allreduce, 1024 * KiB, 4, one_host, kSameHostLink, LinkParams{}),
            choose(CollOp::allreduce, 1024 * KiB, 4, kSameHostLink));
}

TEST(CostModelDeathTest, RejectsNonPositiveRankCount) {
  EXPECT_DEATH(allreduce_coefficients(AllreduceModel::ring, 0), "p must be at least 1");
  EXPECT_DEATH(coefficients(CollOp::allreduce, Algorithm::auto_select, 4), "concrete algorithm");
}

}  // namespace
}  // namespace kf::coll
