// SPDX-License-Identifier: Apache-2.0
#include "common/clock.hpp"

#include <time.h>

namespace kf::detail {

Clock::time_point coarse_now() noexcept {
  static const std::chrono::nanoseconds tick = [] {
    timespec r{};
    if (::clock_getres(CLOCK_MONOTONIC_COARSE, &r) != 0) return std::chrono::nanoseconds(-1);
    return std::chrono::seconds(r.tv_sec) + std::chrono::nanoseconds(r.tv_nsec);
  }();
  timespec ts{};
  if (tick.count() < 0 || ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0) return Clock::now();
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec) + tick));
}

}  // namespace kf::detail
