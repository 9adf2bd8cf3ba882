// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/compression.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kf/peer.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

using compression::count_for;
using compression::random_k;
using compression::top_k;
using Vec = std::vector<float>;

// Multiples of 1/64 in (-range, range): exact in float, and their sums over a few steps and
// workers too, so that averages and error-feedback identities can be compared exactly. Most
// need more significant bits than bf16 has (8), and those above 32 more than fp16 has (11).
Vec dyadic(std::size_t n, unsigned seed, int range = 32) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-range * 64 + 1, range * 64 - 1);
  Vec v(n);
  for (float& x : v) x = static_cast<float>(d(rng)) / 64.f;
  return v;
}

Vec mean_of(const std::vector<Vec>& per_rank) {
  Vec m(per_rank[0].size(), 0.f);
  for (const Vec& v : per_rank) {
    for (std::size_t i = 0; i < m.size(); ++i) m[i] += v[i];
  }
  for (float& x : m) x /= static_cast<float>(per_rank.size());
  return m;
}

// The message of the std::invalid_argument that f throws ("" when it throws none).
template <typename F>
std::string invalid_argument_of(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TopK, PicksTheLargestMagnitudesSortedByIndex) {
  const Vec v{1.f, -5.f, 3.f, 0.5f, -4.f, 2.f};
  EXPECT_EQ(top_k(v, 2), (std::vector<std::uint32_t>{1, 4}));
  EXPECT_EQ(top_k(v, 3), (std::vector<std::uint32_t>{1, 2, 4}));
  EXPECT_EQ(top_k(v, 0), std::vector<std::uint32_t>{});
}

TEST(TopK, BreaksTiesTowardTheLowerIndex) {
  const Vec v{1.f, 2.f, -2.f, 0.f, 2.f};
  EXPECT_EQ(top_k(v, 1), (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(top_k(v, 2), (std::vector<std::uint32_t>{1, 2}));
  EXPECT_EQ(top_k(v, 4), (std::vector<std::uint32_t>{0, 1, 2, 4}));
}

TEST(TopK, TakesEveryIndexWhenKIsNAndRefusesMore) {
  const Vec v = dyadic(37, 1);
  std::vector<std::uint32_t> all(37);
  for (std::uint32_t i = 0; i < 37; ++i) all[i] = i;
  EXPECT_EQ(top_k(v, 37), all);
  EXPECT_NE(invalid_argument_of([&] { top_k(v, 38); }).find("k = 38"), std::string::npos);
}

TEST(TopK, RanksNanAboveEveryNumber) {
  const Vec v{100.f, std::nanf(""), -1e30f, 1.f};
  EXPECT_EQ(top_k(v, 1), (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(top_k(v, 2), (std::vector<std::uint32_t>{1, 2}));
}

TEST(RandomK, DrawsKDistinctSortedIndicesInRange) {
  for (std::size_t k :
       {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{99}, std::size_t{100}}) {
    const auto idx = random_k(100, k, 7, 3);
    ASSERT_EQ(idx.size(), k);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
    EXPECT_EQ(std::set<std::uint32_t>(idx.begin(), idx.end()).size(), k) << "k = " << k;
    for (auto i : idx) EXPECT_LT(i, 100u);
  }
  EXPECT_NE(invalid_argument_of([] { random_k(10, 11, 0, 0); }).find("k = 11"), std::string::npos);
}

TEST(RandomK, IsAFunctionOfSeedAndStep) {
  EXPECT_EQ(random_k(1000, 50, 7, 3), random_k(1000, 50, 7, 3));
  EXPECT_NE(random_k(1000, 50, 7, 3), random_k(1000, 50, 7, 4));
  EXPECT_NE(random_k(1000, 50, 7, 3), random_k(1000, 50, 8, 3));
}

TEST(RandomK, CoversIndicesAboutEvenlyOverSteps) {
  // 400 steps of 8 out of 64: each index is expected 50 times (standard deviation about 6.6).
  std::vector<int> hits(64, 0);
  for (std::int64_t step = 0; step < 400; ++step) {
    for (auto i : random_k(64, 8, 11, step)) ++hits[i];
  }
  for (std::size_t i = 0; i < hits.size(); ++i) {
    EXPECT_GT(hits[i], 20) << "index " << i;
    EXPECT_LT(hits[i], 80) << "index " << i;
  }
}

TEST(CountFor, RoundsAndStaysWithinOneAndN) {
  EXPECT_EQ(count_for(0.25, 100), 25u);
  EXPECT_EQ(count_for(0.25, 10), 3u);  // 2.5 rounds away from zero
  EXPECT_EQ(count_for(0.01, 10), 1u);  // at least one value
  EXPECT_EQ(count_for(1.0, 7), 7u);
  EXPECT_EQ(count_for(0.5, 0), 0u);
  EXPECT_NE(invalid_argument_of([] { count_for(0, 10); }).find("ratio"), std::string::npos);
  EXPECT_NE(invalid_argument_of([] { count_for(1.5, 10); }).find("ratio"), std::string::npos);
}

TEST(GradientCompressor, ConstructorNamesWhatWasWrong) {
  auto error = [](const std::string& spec, std::size_t n, std::size_t rows = 0) {
    CompressionSpec s = parse_compression(spec);
    return invalid_argument_of([&] { GradientCompressor(s, n, 0, rows); });
  };
  EXPECT_NE(error("fp16", 0).find("n must be at least 1"), std::string::npos);
  EXPECT_NE(error("powersgd:2", 12, 5).find("rows = 5 does not divide n"), std::string::npos);
  EXPECT_NE(error("topk:0.1", std::size_t{1} << 33).find("uint32"), std::string::npos);
  CompressionSpec bad_ratio{Compression::randomk, 0.0, 0};
  EXPECT_NE(invalid_argument_of([&] { GradientCompressor(bad_ratio, 10); }).find("ratio"),
            std::string::npos);
  CompressionSpec bad_rank{Compression::powersgd, 0, 0};
  EXPECT_NE(invalid_argument_of([&] { GradientCompressor(bad_rank, 10); }).find("rank"),
            std::string::npos);
  EXPECT_EQ(error("topk:0.5", 10), "");
}

TEST(GradientCompressor, PowerSgdPicksANearSquareShapeAndClampsTheRank) {
  GradientCompressor a(parse_compression("powersgd:4"), 24);
  EXPECT_EQ(a.rows(), 4u);
  EXPECT_EQ(a.cols(), 6u);
  EXPECT_EQ(a.warm_start().size(), 6u * 4u);
  GradientCompressor b(parse_compression("powersgd:8"), 12, 0, 3);
  EXPECT_EQ(b.cols(), 4u);
  EXPECT_EQ(b.rank(), 3u);
  GradientCompressor c(parse_compression("powersgd:2"), 13);  // prime: one row
  EXPECT_EQ(c.rows(), 1u);
  EXPECT_EQ(c.rank(), 1u);
  EXPECT_TRUE(GradientCompressor(parse_compression("topk:0.5"), 10).warm_start().empty());
}

// Error feedback loses nothing: on one worker (the mean of one is what it sent), the sum of what
// was sent over the steps plus the final residual is the sum of the gradients, exactly.
class ErrorFeedback : public ::testing::TestWithParam<std::string> {};

TEST_P(ErrorFeedback, SentPlusResidualIsTheSumOfTheGradients) {
  auto peers = test::make_local_cluster(1);
  constexpr std::size_t n = 40;
  GradientCompressor c(parse_compression(GetParam()), n, 5);
  Vec sent_sum(n, 0.f), grad_sum(n, 0.f);
  for (std::int64_t step = 0; step < 8; ++step) {
    Vec g = dyadic(n, static_cast<unsigned>(100 + step), 64);
    for (std::size_t i = 0; i < n; ++i) grad_sum[i] += g[i];
    c.average(*peers[0], "g", g.data(), step);
    for (std::size_t i = 0; i < n; ++i) sent_sum[i] += g[i];
  }
  bool residual_used = false;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(sent_sum[i] + c.residual()[i], grad_sum[i]) << "index " << i;
    residual_used = residual_used || c.residual()[i] != 0.f;
  }
  EXPECT_TRUE(residual_used) << "the values chosen never exercised the residual";
}

INSTANTIATE_TEST_SUITE_P(Kinds, ErrorFeedback,
                         ::testing::Values("topk:0.25", "randomk:0.3", "fp16", "bf16"));

// What every worker of `world` holds after averaging grads[rank] once (step `step`).
struct Outcome {
  std::vector<Vec> result, residual, warm_start;
  std::vector<std::size_t> bytes;
};

Outcome average_on(int world, const std::string& spec, const std::vector<Vec>& grads,
                   std::size_t rows = 0, int steps = 1) {
  auto peers = test::make_local_cluster(world);
  const auto w = static_cast<std::size_t>(world);
  Outcome o{std::vector<Vec>(w), std::vector<Vec>(w), std::vector<Vec>(w),
            std::vector<std::size_t>(w)};
  test::run_all(world, [&](int rank) {
    const auto r = static_cast<std::size_t>(rank);
    GradientCompressor c(parse_compression(spec), grads[r].size(), 9, rows);
    for (int step = 0; step < steps; ++step) {
      o.result[r] = grads[r];
      o.bytes[r] = c.average(*peers[r], "grad", o.result[r].data(), step);
    }
    o.residual[r].assign(c.residual().begin(), c.residual().end());
    o.warm_start[r].assign(c.warm_start().begin(), c.warm_start().end());
  });
  return o;
}

std::vector<Vec> gradients(int world, std::size_t n, int range = 32) {
  std::vector<Vec> g;
  for (int r = 0; r < world; ++r) g.push_back(dyadic(n, static_cast<unsigned>(10 + r), range));
  return g;
}

class CompressedAverage : public ::testing::TestWithParam<int> {};

TEST_P(CompressedAverage, NoneIsTheExactMean) {
  const auto g = gradients(GetParam(), 50);
  const Outcome o = average_on(GetParam(), "none", g);
  for (int r = 0; r < GetParam(); ++r) {
    EXPECT_EQ(o.result[r], mean_of(g)) << "rank " << r;
    EXPECT_EQ(o.bytes[r], 50u * 4);
  }
}

TEST_P(CompressedAverage, HalfTypesAreTheMeanWithinTheirPrecision) {
  const auto g = gradients(GetParam(), 50, 8);
  const Vec mean = mean_of(g);
  // Values below 8 and sums below 8 * size: each cast and each half-precision addition rounds
  // by at most half an ulp of 8 * size.
  for (const auto& [spec, eps] : {std::pair{"fp16", 0x1p-11f}, std::pair{"bf16", 0x1p-8f}}) {
    const Outcome o = average_on(GetParam(), spec, g);
    const float tol = static_cast<float>(2 * GetParam()) * 8.f * eps;
    for (int r = 0; r < GetParam(); ++r) {
      EXPECT_EQ(o.result[r], o.result[0]) << spec << ": ranks 0 and " << r << " differ";
      EXPECT_EQ(o.bytes[r], 50u * 2) << spec;
      for (std::size_t i = 0; i < mean.size(); ++i) {
        EXPECT_NEAR(o.result[r][i], mean[i], tol) << spec << " rank " << r << " index " << i;
      }
    }
  }
}

TEST_P(CompressedAverage, SparseKindsAtRatioOneAreTheExactMean) {
  const auto g = gradients(GetParam(), 30);
  for (const char* spec : {"topk:1", "randomk:1"}) {
    const Outcome o = average_on(GetParam(), spec, g);
    for (int r = 0; r < GetParam(); ++r) {
      EXPECT_EQ(o.result[r], mean_of(g)) << spec << " rank " << r;
      EXPECT_EQ(o.residual[r], Vec(30, 0.f)) << spec << " rank " << r;
    }
  }
}

TEST_P(CompressedAverage, TopKAveragesEachWorkersLargestEntries) {
  const int world = GetParam();
  const auto g = gradients(world, 40);
  const Outcome o = average_on(world, "topk:0.25", g);
  std::vector<Vec> sparse(static_cast<std::size_t>(world), Vec(40, 0.f));
  for (int r = 0; r < world; ++r) {
    Vec residual = g[r];
    for (auto i : top_k(g[r], 10)) {
      sparse[r][i] = g[r][i];
      residual[i] = 0.f;
    }
    EXPECT_EQ(o.residual[r], residual) << "rank " << r;
    EXPECT_EQ(o.bytes[r], 10u * 8) << "rank " << r;
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(o.result[r], mean_of(sparse)) << "rank " << r;
}

TEST_P(CompressedAverage, RandomKAveragesTheSameDrawnEntriesOnEveryWorker) {
  const int world = GetParam();
  const auto g = gradients(world, 40);
  const Outcome o = average_on(world, "randomk:0.25", g, 0, 2);  // the second step: step 1
  const Vec mean = mean_of(g);
  Vec expected(40, 0.f);
  const auto idx = random_k(40, 10, 9, 1);
  const auto first = random_k(40, 10, 9, 0);
  // An entry that step 0 did not draw was sent at step 1 with two steps' worth of gradient.
  for (auto i : idx) {
    expected[i] = std::binary_search(first.begin(), first.end(), i) ? mean[i] : 2 * mean[i];
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(o.result[r], expected) << "rank " << r;
    EXPECT_EQ(o.bytes[r], 10u * 4) << "rank " << r;
    // The residual is what neither step sent: each entry twice over, less what was drawn.
    for (std::size_t i = 0; i < 40; ++i) {
      const bool now = std::binary_search(idx.begin(), idx.end(), i);
      const bool before = std::binary_search(first.begin(), first.end(), i);
      const float want = now ? 0.f : (before ? g[r][i] : 2 * g[r][i]);
      EXPECT_EQ(o.residual[r][i], want) << "rank " << r << " index " << i;
    }
  }
}

float max_abs(const Vec& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST_P(CompressedAverage, PowerSgdAtFullRankReproducesTheMean) {
  const int world = GetParam();
  const auto g = gradients(world, 6 * 4);
  const Outcome o = average_on(world, "powersgd:4", g, 6);
  const Vec mean = mean_of(g);
  const float tol = 1e-4f * max_abs(mean);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(o.bytes[r], (6u + 4u) * 4 * 4);
    EXPECT_EQ(o.warm_start[r], o.warm_start[0]) << "rank " << r;
    for (std::size_t i = 0; i < mean.size(); ++i) {
      EXPECT_NEAR(o.result[r][i], mean[i], tol) << "rank " << r << " index " << i;
    }
  }
}

TEST_P(CompressedAverage, PowerSgdAtLowRankAgreesBitwiseAndConservesTheGradients) {
  const int world = GetParam();
  const auto g = gradients(world, 8 * 6);
  const Outcome o = average_on(world, "powersgd:1", g, 8);
  // What was applied (size x the mean) plus what every worker kept is what they all had.
  Vec total(48, 0.f), kept(48, 0.f);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(o.bytes[r], (8u + 6u) * 1 * 4);
    EXPECT_EQ(o.result[r], o.result[0]) << "rank " << r;
    EXPECT_EQ(o.warm_start[r], o.warm_start[0]) << "rank " << r;
    for (std::size_t i = 0; i < 48; ++i) {
      total[i] += g[r][i];
      kept[i] += o.residual[r][i];
    }
  }
  EXPECT_NE(o.result[0], mean_of(g)) << "rank 1 cannot hold these matrices";
  for (std::size_t i = 0; i < 48; ++i) {
    EXPECT_NEAR(kept[i] + static_cast<float>(world) * o.result[0][i], total[i],
                1e-4f * max_abs(total))
        << "index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, CompressedAverage, ::testing::Values(2, 3));

TEST(PowerSgd, AWorkerKeepsOnlyWhatItsOwnMatrixLost) {
  // Worker 1 sends a zero matrix: its residual stays zero (with the rule M - P Q^T, it would
  // hold minus the other worker's approximation).
  const std::vector<Vec> g{dyadic(24, 3), Vec(24, 0.f)};
  const Outcome o = average_on(2, "powersgd:2", g, 4);
  EXPECT_EQ(o.residual[1], Vec(24, 0.f));
  EXPECT_NE(o.residual[0], Vec(24, 0.f));
  EXPECT_EQ(o.result[0], o.result[1]);
}

TEST(PowerSgd, RecoversItsRankAfterAZeroGradient) {
  auto peers = test::make_local_cluster(1);
  GradientCompressor c(parse_compression("powersgd:3"), 15, 2, 5);
  Vec zero(15, 0.f);
  c.average(*peers[0], "g", zero.data(), 0);
  EXPECT_EQ(zero, Vec(15, 0.f));
  ASSERT_EQ(c.warm_start().size(), 3u * 3u);
  EXPECT_NE(Vec(c.warm_start().begin(), c.warm_start().end()), Vec(9, 0.f))
      << "the warm start must be drawn afresh, not left at zero";
  const Vec g = dyadic(15, 4);
  Vec out = g;
  c.average(*peers[0], "g", out.data(), 1);
  for (std::size_t i = 0; i < 15; ++i) EXPECT_NEAR(out[i], g[i], 1e-4f * max_abs(g)) << i;
}

// Momentum correction: the compressor's velocity u = m u + g is what it compresses.

TEST(MomentumCorrection, WithoutMaskingAtRatioOneEveryStepSendsMomentumSgdsBuffer) {
  // Every value sent: the result is the momentum buffer v = m v + g, exactly as LibTorch's SGD
  // (dampening 0) computes it, and nothing is left over.
  auto peers = test::make_local_cluster(1);
  for (const char* spec : {"topk:1", "randomk:1"}) {
    constexpr std::size_t n = 20;
    GradientCompressor c(parse_compression(spec), n, 3);
    const float m = 0.9f;
    c.set_momentum(m, {}, /*masking=*/false);
    Vec buffer(n, 0.f);
    for (std::int64_t step = 0; step < 5; ++step) {
      Vec g = dyadic(n, static_cast<unsigned>(40 + step));
      for (std::size_t i = 0; i < n; ++i) buffer[i] = m * buffer[i] + g[i];
      c.average(*peers[0], "g", g.data(), step);
      EXPECT_EQ(g, buffer) << spec << " step " << step;
      EXPECT_EQ(Vec(c.velocity().begin(), c.velocity().end()), buffer) << spec;
      EXPECT_EQ(Vec(c.residual().begin(), c.residual().end()), Vec(n, 0.f)) << spec;
    }
  }
}

TEST(MomentumCorrection, OverWorkersTheResultIsTheMeanOfTheirVelocities) {
  constexpr int world = 3;
  constexpr std::size_t n = 16;
  auto peers = test::make_local_cluster(world);
  std::vector<Vec> results(world), velocities(world);
  test::run_all(world, [&](int rank) {
    GradientCompressor c(parse_compression("topk:1"), n, 1);
    const Vec start = dyadic(n, static_cast<unsigned>(70 + rank));
    c.set_momentum(0.5, start, /*masking=*/false);
    Vec g = dyadic(n, static_cast<unsigned>(80 + rank));
    Vec u(n);
    for (std::size_t i = 0; i < n; ++i) u[i] = 0.5f * start[i] + g[i];
    c.average(*peers[rank], "g", g.data(), 0);
    results[rank] = g;
    velocities[rank] = u;
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(results[r], mean_of(velocities)) << "rank " << r;
}

// With values held back, what was sent over the steps plus the residual is the sum of the
// velocities, exactly (m = 0.5 and dyadic gradients keep every value exact in float).
class MomentumFeedback : public ::testing::TestWithParam<std::string> {};

TEST_P(MomentumFeedback, SentPlusResidualIsTheSumOfTheVelocities) {
  auto peers = test::make_local_cluster(1);
  constexpr std::size_t n = 40;
  GradientCompressor c(parse_compression(GetParam()), n, 5);
  c.set_momentum(0.5, {}, /*masking=*/false);
  Vec sent_sum(n, 0.f), velocity_sum(n, 0.f), u(n, 0.f);
  for (std::int64_t step = 0; step < 6; ++step) {
    Vec g = dyadic(n, static_cast<unsigned>(200 + step), 16);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = 0.5f * u[i] + g[i];
      velocity_sum[i] += u[i];
    }
    c.average(*peers[0], "g", g.data(), step);
    for (std::size_t i = 0; i < n; ++i) sent_sum[i] += g[i];
  }
  bool residual_used = false;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(sent_sum[i] + c.residual()[i], velocity_sum[i]) << "index " << i;
    residual_used = residual_used || c.residual()[i] != 0.f;
  }
  EXPECT_TRUE(residual_used) << "the values chosen never exercised the residual";
  EXPECT_EQ(Vec(c.velocity().begin(), c.velocity().end()), u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, MomentumFeedback, ::testing::Values("topk:0.25", "randomk:0.3"));

TEST(MomentumCorrection, MaskingZeroesTheVelocityOfWhatWasSent) {
  // randomk's indices are known ahead (random_k of seed and step): the velocity of each value
  // sent restarts at zero, and what was sent plus the residual is still the sum of the
  // velocities before masking.
  auto peers = test::make_local_cluster(1);
  constexpr std::size_t n = 40;
  GradientCompressor c(parse_compression("randomk:0.3"), n, 5);
  c.set_momentum(0.5);
  EXPECT_TRUE(c.masking());
  Vec sent_sum(n, 0.f), velocity_sum(n, 0.f), u(n, 0.f);
  for (std::int64_t step = 0; step < 6; ++step) {
    Vec g = dyadic(n, static_cast<unsigned>(300 + step), 16);
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = 0.5f * u[i] + g[i];
      velocity_sum[i] += u[i];
    }
    c.average(*peers[0], "g", g.data(), step);
    for (std::uint32_t i : random_k(n, count_for(0.3, n), 5, step)) u[i] = 0.f;
    EXPECT_EQ(Vec(c.velocity().begin(), c.velocity().end()), u) << "step " << step;
    for (std::size_t i = 0; i < n; ++i) sent_sum[i] += g[i];
  }
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(sent_sum[i] + c.residual()[i], velocity_sum[i]) << "index " << i;
  }
}

TEST(MomentumCorrection, WithMaskingAtRatioOneEveryStepSendsTheGradient) {
  // Every value sent and every velocity zeroed after: plain SGD, as in Deep Gradient
  // Compression at no compression.
  auto peers = test::make_local_cluster(1);
  GradientCompressor c(parse_compression("topk:1"), 12, 3);
  c.set_momentum(0.9, dyadic(12, 7));
  Vec u = dyadic(12, 7);
  for (std::int64_t step = 0; step < 3; ++step) {
    const Vec g = dyadic(12, static_cast<unsigned>(50 + step));
    Vec out = g;
    c.average(*peers[0], "g", out.data(), step);
    Vec want(12);
    for (std::size_t i = 0; i < 12; ++i) want[i] = 0.9f * u[i] + g[i];
    EXPECT_EQ(out, want) << "step " << step;
    u.assign(12, 0.f);
    EXPECT_EQ(Vec(c.velocity().begin(), c.velocity().end()), u);
  }
}

TEST(MomentumCorrection, SetMomentumNamesWhatWasWrongAndTurnsOff) {
  GradientCompressor c(parse_compression("topk:0.5"), 4);
  for (double bad : {-0.1, 1.0, std::nan("")}) {
    EXPECT_NE(invalid_argument_of([&] { c.set_momentum(bad); }).find("must be in [0, 1)"),
              std::string::npos)
        << "momentum " << bad;
  }
  const Vec three(3, 1.f);
  EXPECT_NE(
      invalid_argument_of([&] { c.set_momentum(0.9, three); }).find("has 3 values, not n = 4"),
      std::string::npos);
  for (const char* dense : {"fp16", "bf16", "powersgd:1", "none"}) {
    GradientCompressor d(parse_compression(dense), 4);
    EXPECT_NE(invalid_argument_of([&] { d.set_momentum(0.9); }).find("topk and randomk only"),
              std::string::npos)
        << dense;
    d.set_momentum(0);  // off is always fine
  }
  c.set_momentum(0.9);
  EXPECT_EQ(c.velocity().size(), 4u);
  c.set_momentum(0);
  EXPECT_TRUE(c.velocity().empty());
  EXPECT_EQ(c.momentum(), 0.0);
}

}  // namespace
}  // namespace kf
