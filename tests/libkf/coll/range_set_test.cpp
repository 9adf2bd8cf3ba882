// SPDX-License-Identifier: Apache-2.0
// RangeSet (libkf/src/engine/range_set.hpp) against a plain bitmap: random adds, and after
// each one every query agrees with the model.
#include "engine/range_set.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kf::detail {
namespace {

constexpr std::size_t kN = 64;

// The gaps of [b, e) in the model, as for_gaps reports them: maximal runs of unset elements.
std::vector<std::pair<std::size_t, std::size_t>> model_gaps(const std::vector<bool>& set,
                                                            std::size_t b, std::size_t e) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = b; i < e;) {
    if (set[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < e && !set[j]) ++j;
    out.emplace_back(i, j);
    i = j;
  }
  return out;
}

TEST(RangeSet, AgreesWithABitmapAfterEveryAdd) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    RangeSet rs;
    std::vector<bool> set(kN, false);
    for (int step = 0; step < 12; ++step) {
      std::size_t b = rng() % kN, e = rng() % (kN + 1);
      if (b > e) std::swap(b, e);
      rs.add(b, e);
      for (std::size_t i = b; i < e; ++i) set[i] = true;
      for (std::size_t qb = 0; qb < kN; qb += 3) {
        for (std::size_t qe = qb + 1; qe <= kN; qe += 5) {  // non-empty queries
          bool none = true;
          for (std::size_t i = qb; i < qe; ++i) none = none && !set[i];
          ASSERT_EQ(rs.disjoint(qb, qe), none)
              << "round " << round << " [" << qb << "," << qe << ")";
          std::vector<std::pair<std::size_t, std::size_t>> got;
          rs.for_gaps(qb, qe, [&](std::size_t gb, std::size_t ge) { got.emplace_back(gb, ge); });
          ASSERT_EQ(got, model_gaps(set, qb, qe))
              << "round " << round << " [" << qb << "," << qe << ")";
        }
      }
    }
  }
}

TEST(RangeSet, TouchingRangesMergeAndEmptyOnesAreIgnored) {
  RangeSet rs;
  rs.add(5, 5);
  EXPECT_TRUE(rs.disjoint(0, 100));
  rs.add(0, 4);
  rs.add(8, 10);
  rs.add(4, 8);  // touches both: one range [0, 10)
  std::vector<std::pair<std::size_t, std::size_t>> got;
  rs.for_gaps(0, 12, [&](std::size_t b, std::size_t e) { got.emplace_back(b, e); });
  EXPECT_EQ(got, (std::vector<std::pair<std::size_t, std::size_t>>{{10, 12}}));
}

}  // namespace
}  // namespace kf::detail
