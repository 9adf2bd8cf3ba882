// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/binding.hpp"

#include <gtest/gtest.h>

namespace kf::tools {
namespace {

TEST(Bind, ParsesAutoAndNoneOnly) {
  EXPECT_EQ(parse_bind("auto"), Bind::automatic);
  EXPECT_EQ(parse_bind("none"), Bind::none);
  EXPECT_EQ(parse_bind("core"), std::nullopt);
  EXPECT_EQ(parse_bind(""), std::nullopt);
}

TEST(Bind, LeavesWorkersFreeWhileThereAreEnoughCores) {
  const std::vector<int> cpus{0, 1, 2, 3};
  for (int slot = 0; slot < 4; ++slot) {
    EXPECT_EQ(cpu_for_slot(Bind::automatic, slot, 4, cpus), std::nullopt) << slot;
    EXPECT_EQ(cpu_for_slot(Bind::automatic, slot, 1, cpus), std::nullopt) << slot;
  }
}

TEST(Bind, SpreadsSlotsOverTheAllowedCpusWhenCrowded) {
  // The CPUs kfrun may use, not 0..n-1: a taskset or cpuset leaves gaps.
  const std::vector<int> cpus{2, 5};
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 0, 4, cpus), 2);
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 1, 4, cpus), 5);
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 2, 4, cpus), 2);
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 3, 4, cpus), 5);
  // Three workers on two cores: crowded too.
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 2, 3, cpus), 2);
}

TEST(Bind, NoneAnUnreadableMaskOrANegativeSlotHoldNothing) {
  const std::vector<int> cpus{0, 1};
  EXPECT_EQ(cpu_for_slot(Bind::none, 0, 4, cpus), std::nullopt);
  EXPECT_EQ(cpu_for_slot(Bind::automatic, 0, 4, {}), std::nullopt);
  EXPECT_EQ(cpu_for_slot(Bind::automatic, -1, 4, cpus), std::nullopt);
}

TEST(Bind, AllowedCpusIsThisThreadsMaskInOrder) {
  const auto cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  for (std::size_t i = 1; i < cpus.size(); ++i) EXPECT_LT(cpus[i - 1], cpus[i]);
}

}  // namespace
}  // namespace kf::tools
