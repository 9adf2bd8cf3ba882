// SPDX-License-Identifier: Apache-2.0
// kf-bench's value tables against libkf's own reduction kernels: for every dtype, reduction and
// worker count, reducing the workers' filled buffers gives exactly the expected table, and the
// checks reject poison, a changed element and another iteration's values.
#include "kf-bench/lib/pattern.hpp"

#include "kf-bench/lib/method.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace kf::tools::bench {
namespace {

using Param = std::tuple<DType, ReduceOp, int>;

class PatternTest : public ::testing::TestWithParam<Param> {};

// Element counts that cover partial tables, several tables, and an odd start offset.
constexpr std::size_t kCount = 10007;
constexpr std::size_t kFirst = 12345;
constexpr std::uint64_t kIter = 3;

std::vector<std::byte> reduce_all(const Pattern& p, DType t, ReduceOp op, int workers) {
  const std::size_t bytes = kCount * dtype_bytes(t);
  std::vector<std::byte> acc(bytes), in(bytes);
  p.fill(acc.data(), kCount, 0, kFirst, kIter);
  for (int r = 1; r < workers; ++r) {
    p.fill(in.data(), kCount, r, kFirst, kIter);
    reduce_into(acc.data(), in.data(), kCount, t, op);
  }
  if (op == ReduceOp::avg) finish_avg(acc.data(), kCount, t, static_cast<std::size_t>(workers));
  return acc;
}

TEST_P(PatternTest, ReducingTheFilledBuffersGivesTheExpectedValues) {
  const auto [t, op, workers] = GetParam();
  const Pattern p(t, op, workers);
  const std::vector<std::byte> got = reduce_all(p, t, op, workers);
  EXPECT_TRUE(p.matches_reduced(got.data(), kCount, kFirst, kIter));
}

TEST_P(PatternTest, ChecksRejectPoisonAChangedElementAndOtherRanks) {
  const auto [t, op, workers] = GetParam();
  const Pattern p(t, op, workers);
  const std::size_t es = dtype_bytes(t);
  std::vector<std::byte> buf(kCount * es);
  p.poison(buf.data(), kCount);
  EXPECT_FALSE(p.matches_reduced(buf.data(), kCount, kFirst, kIter));
  EXPECT_FALSE(p.matches_rank(buf.data(), kCount, 0, kFirst, kIter));
  for (int r = 0; r < workers; ++r) {
    p.fill(buf.data(), kCount, r, kFirst, kIter);
    EXPECT_TRUE(p.matches_rank(buf.data(), kCount, r, kFirst, kIter)) << "rank " << r;
    // prod puts its 2s on workers 0-6 only: later workers all hold 1s.
    if (r > 0 && (op != ReduceOp::prod || r < 7)) {
      EXPECT_FALSE(p.matches_rank(buf.data(), kCount, r - 1, kFirst, kIter)) << "rank " << r;
    }
    std::vector<std::byte> changed = buf;
    std::memset(changed.data() + (kCount - 1) * es, 0xff, es);  // the last element
    EXPECT_FALSE(p.matches_rank(changed.data(), kCount, r, kFirst, kIter)) << "rank " << r;
  }
}

TEST(Pattern, ConsecutiveIterationsExpectDifferentSums) {
  const Pattern p(DType::f32, ReduceOp::sum, 4);
  std::vector<float> buf(kCount);
  p.fill(buf.data(), kCount, 1, 0, kIter);
  EXPECT_FALSE(p.matches_rank(buf.data(), kCount, 1, 0, kIter + 1));
  const std::vector<std::byte> sum = reduce_all(p, DType::f32, ReduceOp::sum, 4);
  EXPECT_FALSE(p.matches_reduced(sum.data(), kCount, kFirst, kIter + 1));
}

TEST(Pattern, ABlockAtAnotherOffsetDoesNotMatch) {
  for (const int workers : {2, 3, 4, 8}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::prod}) {
      const Pattern p(DType::f32, op, workers);
      for (const std::size_t count : {std::size_t{1024}, std::size_t{4096}, std::size_t{1000}}) {
        const std::vector<std::byte> sum = [&] {
          std::vector<std::byte> acc(count * 4), in(count * 4);
          p.fill(acc.data(), count, 0, 0, kIter);
          for (int r = 1; r < workers; ++r) {
            p.fill(in.data(), count, r, 0, kIter);
            reduce_into(acc.data(), in.data(), count, DType::f32, op);
          }
          return acc;
        }();
        EXPECT_TRUE(p.matches_reduced(sum.data(), count, 0, kIter));
        EXPECT_FALSE(p.matches_reduced(sum.data(), count, count, kIter))
            << workers << " workers, " << to_string(op) << ", " << count << " elements";
      }
    }
  }
}

TEST(Pattern, RejectsAnEmptyJob) {
  EXPECT_THROW(Pattern(DType::f32, ReduceOp::sum, 0), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, PatternTest,
    ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16,
                                         DType::i32, DType::i64, DType::u8),
                       ::testing::Values(ReduceOp::sum, ReduceOp::min, ReduceOp::max,
                                         ReduceOp::prod, ReduceOp::avg),
                       ::testing::Values(1, 2, 3, 4, 7, 8, 16, 64)),
    [](const auto& param_info) {
      return std::string(to_string(std::get<0>(param_info.param))) + "_" +
             std::string(to_string(std::get<1>(param_info.param))) + "_n" +
             std::to_string(std::get<2>(param_info.param));
    });

// back-to-back's values: `calls` in-place sums over `workers` workers, done here in f32 as a
// collective would, match; one changed element, or a call more or fewer, does not.
TEST(BackToBack, InPlaceSumsOfTheFilledBuffersMatchAndNothingElseDoes) {
  constexpr std::size_t kCount = 37;
  for (const int workers : {1, 2, 3, 4, 8}) {
    for (const int calls : {1, 2, kDefaultCalls}) {
      std::vector<std::vector<float>> bufs(static_cast<std::size_t>(workers),
                                           std::vector<float>(kCount));
      for (int r = 0; r < workers; ++r) fill_back_to_back(bufs[r].data(), kCount, r);
      std::vector<float> sum(kCount);
      for (int c = 0; c < calls; ++c) {
        std::fill(sum.begin(), sum.end(), 0.0F);
        for (const auto& b : bufs) {
          for (std::size_t i = 0; i < kCount; ++i) sum[i] += b[i];
        }
        for (auto& b : bufs) b = sum;
      }
      const std::string what = std::to_string(workers) + " workers, " + std::to_string(calls);
      EXPECT_TRUE(matches_back_to_back(sum.data(), kCount, workers, calls)) << what;
      if (workers > 1) {  // one worker's sums stay as they are
        EXPECT_FALSE(matches_back_to_back(sum.data(), kCount, workers, calls + 1)) << what;
        EXPECT_FALSE(matches_back_to_back(sum.data(), kCount, workers - 1, calls)) << what;
      }
      sum[kCount / 2] = sum[kCount / 2] * 1.001F + 1.0F;
      EXPECT_FALSE(matches_back_to_back(sum.data(), kCount, workers, calls)) << what;
    }
  }
  EXPECT_EQ(parse_method("back-to-back"), Method::back_to_back);
  EXPECT_EQ(max_back_to_back_calls(1), kMaxCalls);
  EXPECT_EQ(max_back_to_back_calls(2), 128);
  EXPECT_EQ(max_back_to_back_calls(4), 64);
  EXPECT_EQ(check_back_to_back_calls(kDefaultCalls, 64), "");
  EXPECT_NE(check_back_to_back_calls(129, 2).find("use at most 128"), std::string::npos);
  EXPECT_EQ(parse_method("barrier"), Method::barrier);
  EXPECT_EQ(parse_method("b2b"), std::nullopt);
  EXPECT_EQ(to_string(Method::back_to_back), "back-to-back");
}

// At the most calls max_back_to_back_calls allows, the sums (done here in f32 as a collective
// would) are finite and match, non-power-of-two worker counts with their rounding included;
// one call more passes 2^127.
TEST(BackToBack, TheMostCallsAllowedStayInRangeAndMatch) {
  constexpr std::size_t kCount = 5;
  for (const int workers : {2, 3, 4, 5, 7, 8, 64}) {
    const int calls = max_back_to_back_calls(workers);
    std::vector<std::vector<float>> bufs(static_cast<std::size_t>(workers),
                                         std::vector<float>(kCount));
    for (int r = 0; r < workers; ++r) fill_back_to_back(bufs[r].data(), kCount, r);
    std::vector<float> sum(kCount);
    for (int c = 0; c <= calls; ++c) {
      std::fill(sum.begin(), sum.end(), 0.0F);
      for (const auto& b : bufs) {
        for (std::size_t i = 0; i < kCount; ++i) sum[i] += b[i];
      }
      if (c + 1 == calls) {
        const std::string what = std::to_string(workers) + " workers, " + std::to_string(calls);
        EXPECT_TRUE(std::isfinite(*std::max_element(sum.begin(), sum.end()))) << what;
        EXPECT_TRUE(matches_back_to_back(sum.data(), kCount, workers, calls)) << what;
      }
      for (auto& b : bufs) b = sum;
    }
    // The call after the last allowed one passes 2^127, the bound the limit keeps to.
    EXPECT_GE(*std::max_element(sum.begin(), sum.end()), 0x1p127F) << workers << " workers";
  }
}

}  // namespace
}  // namespace kf::tools::bench
