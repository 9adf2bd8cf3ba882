// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/stats.hpp"

#include <gtest/gtest.h>

namespace kf::tools::bench {
namespace {

TEST(Quantile, InterpolatesBetweenNearestRanks) {
  EXPECT_EQ(quantile({}, 0.5), 0.0);
  EXPECT_EQ(quantile({7.0}, 0.9), 7.0);
  EXPECT_DOUBLE_EQ(quantile({4.0, 1.0, 3.0, 2.0}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({5.0, 1.0, 3.0}, 0.5), 3.0);
  std::vector<double> ten;
  for (int i = 1; i <= 10; ++i) ten.push_back(i);
  EXPECT_DOUBLE_EQ(quantile(ten, 0.9), 9.1);
  EXPECT_DOUBLE_EQ(quantile(ten, 1.0), 10.0);
}

TEST(Bandwidth, FollowsNcclTestsDefinitions) {
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::allgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::reduce_scatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::gather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::broadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::allreduce, 1), 0.0);
  EXPECT_EQ(algbw_bytes(CollOp::allreduce, 100, 4), 100u);
  EXPECT_EQ(algbw_bytes(CollOp::broadcast, 100, 4), 100u);
  EXPECT_EQ(algbw_bytes(CollOp::allgather, 100, 4), 400u);
  EXPECT_EQ(algbw_bytes(CollOp::reduce_scatter, 100, 4), 400u);
  EXPECT_EQ(algbw_bytes(CollOp::gather, 100, 4), 400u);
}

TEST(DefaultIterations, SmallMessagesRunMore) {
  EXPECT_EQ(default_iterations(4), 2000);
  EXPECT_EQ(default_iterations(4 * 1024), 2000);
  EXPECT_EQ(default_iterations(4 * 1024 + 1), 500);
  EXPECT_EQ(default_iterations(64 * 1024), 500);
  EXPECT_EQ(default_iterations(64 * 1024 + 1), 50);
  EXPECT_EQ(default_iterations(1 << 20), 50);
  EXPECT_EQ(default_iterations(16 << 20), 20);
  EXPECT_EQ(default_iterations((16 << 20) + 1), 10);
}

}  // namespace
}  // namespace kf::tools::bench
