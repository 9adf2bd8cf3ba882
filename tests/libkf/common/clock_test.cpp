// SPDX-License-Identifier: Apache-2.0
// The polling loops' clocks: coarse_now reads the steady clock to within a few milliseconds, and
// an IdleWindow keeps a loop polling for its window, counted from its 16th idle poll, and then
// tells it to block.
#include "common/clock.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace kf::detail {
namespace {

using std::chrono::milliseconds;

// The steady clock's own base (not the wall clock, not another unit), to within a few of the
// kernel's ticks: it lags by up to a tick and is rounded up by one, and on a VM ticks come late
// (up to 0.4 ms past the tick measured here), so the bound is loose.
TEST(Clock, CoarseNowReadsTheSteadyClockToWithinAFewTicks) {
  for (int i = 0; i < 20000; ++i) {
    const auto before = Clock::now();
    const auto coarse = coarse_now();
    const auto after = Clock::now();
    ASSERT_GT(coarse, before - milliseconds(50)) << i;
    ASSERT_LT(coarse, after + milliseconds(50)) << i;
    if (i % 5000 == 0) std::this_thread::sleep_for(milliseconds(3));
  }
}

TEST(Clock, AnIdleWindowPollsUntilItsSpinHasPassedThenBlocks) {
  IdleWindow w;
  EXPECT_FALSE(w.within(std::chrono::microseconds(0)));  // no window at all
  w.worked();
  // A window of 1 us: it starts at the 16th idle poll; the 32nd looks at the clock again.
  for (std::uint32_t i = 1; i < 2 * IdleWindow::kCheckEvery; ++i) {
    if (i == IdleWindow::kCheckEvery + 1) std::this_thread::sleep_for(milliseconds(1));
    EXPECT_TRUE(w.within(std::chrono::microseconds(1))) << i;
    EXPECT_EQ(w.idle_polls(), i);
  }
  EXPECT_FALSE(w.within(std::chrono::microseconds(1)));
  // Work starts the window again; a window that has not passed keeps polling.
  w.worked();
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(w.within(std::chrono::seconds(60))) << i;
  // Expired: the next idle poll blocks, however long the window.
  w.expire();
  EXPECT_FALSE(w.within(std::chrono::seconds(60)));
}

}  // namespace
}  // namespace kf::detail
