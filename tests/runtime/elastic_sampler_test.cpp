// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/piece_sampler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kf {
namespace {

TEST(ElasticSampler, EverySampleOnceAcrossRandomResizesAndBatchSizes) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const std::size_t n = 1000 + seed * 37;
    ElasticSampler s(n, seed);
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      s.start_epoch(epoch);
      std::vector<int> seen(n, 0);
      int size = 1 + static_cast<int>(rng() % 5);
      std::size_t batch = 16 + rng() % 100;
      while (!s.epoch_done()) {
        std::size_t taken = 0;
        for (int r = 0; r < size; ++r) {
          for (std::size_t i : s.batch(r, size, batch)) {
            ASSERT_LT(i, n);
            ++seen[i];
            ++taken;
          }
        }
        EXPECT_EQ(taken, s.step_samples(batch));
        s.advance(batch);
        if (rng() % 4 == 0) size = 1 + static_cast<int>(rng() % 8);  // resize
        if (rng() % 5 == 0) batch = 8 + rng() % 200;                 // new batch size
      }
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
    }
  }
}

TEST(ElasticSampler, SameOrderOnEveryWorkerAndNewOrderEachEpoch) {
  ElasticSampler a(500, 7), b(500, 7);
  a.start_epoch(3);
  b.start_epoch(3);
  EXPECT_EQ(a.batch(0, 1, 500), b.batch(0, 1, 500));
  b.start_epoch(4);
  EXPECT_NE(a.batch(0, 1, 500), b.batch(0, 1, 500));
}

TEST(ElasticSampler, RestartsFromACommittedPosition) {
  ElasticSampler a(100, 1), b(100, 1);
  a.start_epoch(0);
  a.advance(30);
  a.advance(30);
  b.start_epoch(0, a.position());
  EXPECT_EQ(a.batch(1, 3, 25), b.batch(1, 3, 25));
  EXPECT_THROW(b.start_epoch(0, 101), std::invalid_argument);
  EXPECT_THROW(a.batch(3, 3, 10), std::invalid_argument);
  EXPECT_THROW(ElasticSampler(0, 1), std::invalid_argument);
}

TEST(ElasticSampler, LastStepOfTheEpochIsShort) {
  ElasticSampler s(10, 1, false);
  s.start_epoch(0, 8);
  EXPECT_EQ(s.step_samples(4), 2u);
  EXPECT_EQ(s.batch(0, 2, 4), (std::vector<std::size_t>{8}));
  EXPECT_EQ(s.batch(1, 2, 4), (std::vector<std::size_t>{9}));
  s.advance(4);
  EXPECT_TRUE(s.epoch_done());
}

TEST(ElasticSampler, WeightedPartsFollowTheWeightsAndCoverTheStepOnce) {
  // Equal parts without weights: exactly batch()'s.
  ElasticSampler s(1000, 3);
  s.start_epoch(0, 10);
  for (int size : {1, 3, 7}) {
    const auto parts = ElasticSampler::split(s.step_samples(50), {}, size);
    std::size_t first = 0;
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(s.range(first, parts[static_cast<std::size_t>(r)]), s.batch(r, size, 50));
      first += parts[static_cast<std::size_t>(r)];
    }
  }
  // Weights 3 : 3 : 1 on 70 samples: one each, then 67 by weight (28.71, 28.71, 9.57), the
  // remainder by largest fraction (ties to the lower rank).
  const std::vector<double> w{3.0, 3.0, 1.0};
  EXPECT_EQ(ElasticSampler::split(70, w, 3), (std::vector<std::size_t>{30, 30, 10}));
  // Every worker gets at least one sample while there are enough; a step of fewer is equal.
  EXPECT_EQ(ElasticSampler::split(5, std::vector<double>{1e9, 1e9, 1.0}, 3),
            (std::vector<std::size_t>{2, 2, 1}));
  EXPECT_EQ(ElasticSampler::split(2, w, 3), (std::vector<std::size_t>{1, 1, 0}));
  // A weight that is not positive and finite: equal parts.
  EXPECT_EQ(ElasticSampler::split(9, std::vector<double>{1.0, 0.0, 2.0}, 3),
            (std::vector<std::size_t>{3, 3, 3}));
  EXPECT_EQ(ElasticSampler::split(9, std::vector<double>{1.0, NAN, 2.0}, 3),
            (std::vector<std::size_t>{3, 3, 3}));
  // Random weights and sizes: the parts cover the step exactly.
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int size = 1 + static_cast<int>(rng() % 9);
    const std::size_t samples = rng() % 600;
    std::vector<double> weights;
    for (int r = 0; r < size; ++r) weights.push_back(1e-3 + (rng() % 100000) / 7.0);
    const auto parts = ElasticSampler::split(samples, weights, size);
    std::size_t sum = 0;
    for (std::size_t p : parts) {
      sum += p;
      if (samples >= static_cast<std::size_t>(size)) {
        EXPECT_GE(p, 1u);
      }
    }
    ASSERT_EQ(sum, samples) << "trial " << trial;
  }
  EXPECT_THROW(ElasticSampler::split(10, w, 2), std::invalid_argument);
  EXPECT_THROW(ElasticSampler::split(10, {}, 0), std::invalid_argument);
  s.start_epoch(0, 990);
  EXPECT_EQ(s.range(4, 6).size(), 6u);
  EXPECT_THROW(s.range(4, 7), std::invalid_argument);
}

// PieceSampler::cut: the unused samples of the epoch's order, in equal runs in rank order.
TEST(PieceSampler, CutsTheUnusedSamplesIntoEqualRunsInRankOrder) {
  const std::vector<std::size_t> order{7, 3, 0, 9, 1, 8, 2, 6, 5, 4};
  std::vector<std::uint8_t> used(10, 0);
  used[3] = used[8] = 1;  // two used already
  std::vector<std::size_t> all;
  for (int r = 0; r < 3; ++r) {
    const auto piece = PieceSampler::cut(order, used, r, 3);
    EXPECT_GE(piece.size(), 2u);
    EXPECT_LE(piece.size(), 3u);
    all.insert(all.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(all, (std::vector<std::size_t>{7, 0, 9, 1, 2, 6, 5, 4}));
  std::fill(used.begin(), used.end(), 1);
  EXPECT_TRUE(PieceSampler::cut(order, used, 0, 2).empty());
  EXPECT_THROW(PieceSampler::cut(order, used, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace kf
