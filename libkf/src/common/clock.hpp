// SPDX-License-Identifier: Apache-2.0
// The clocks of the polling loops and of the signs of life: a cheap, rounded-up reading of the
// steady clock, and the idle window that decides when a polling loop blocks.
// Thread-safety: coarse_now is; an IdleWindow belongs to one loop.
#pragma once

#include <chrono>
#include <cstdint>

namespace kf::detail {

using Clock = std::chrono::steady_clock;

/// Clock::now() read cheaply, to within a few milliseconds: CLOCK_MONOTONIC_COARSE is
/// steady_clock's clock as of the last kernel tick, read without the TSC (5 against 20 ns
/// here), and it is rounded up by its resolution (1-4 ms), so that it is mostly not behind (on
/// this VM ticks come up to 0.4 ms late). For the signs of life (PeerState::last_rx, last_tx)
/// that every frame stamps and that only timeouts of hundreds of milliseconds look at.
/// (Collective deadlines set from it measured 25 % slower with 4 workers on 2 cores at 4 B, for
/// reasons not found; they read Clock.)
Clock::time_point coarse_now() noexcept;

/// A polling loop's idle window: whether it should go on polling or block, decided from the
/// clock only every kCheckEvery idle polls (reading the clock costs about as much as one poll of
/// the rings, and a loop that waits for one peer polls thousands of times). The window starts
/// at the kCheckEvery-th idle poll, not the first: most waits end within a few polls (with more
/// workers than cores, after one yield each), and a clock read for each of them was the largest
/// user-space cost of 4 workers on 2 cores (9 % of their user time, 20 ns a read here).
class IdleWindow {
 public:
  static constexpr std::uint32_t kCheckEvery = 16;
  /// The last poll did work: the window starts again.
  void worked() noexcept { idle_ = 0; }
  /// The window is over already: the next idle poll blocks.
  void expire() noexcept {
    idle_ = 2 * kCheckEvery - 1;
    since_ = Clock::time_point{};
  }
  /// Idle polls since the last work.
  std::uint32_t idle_polls() const noexcept { return idle_; }
  /// The clock as within() last read it (the epoch when it never did).
  Clock::time_point last_reading() const noexcept { return last_; }
  /// An idle poll: whether `spin` has not passed yet since the window started.
  bool within(std::chrono::microseconds spin) noexcept {
    if (spin.count() == 0) return false;
    if (++idle_ % kCheckEvery != 0) return true;
    const auto now = Clock::now();
    last_ = now;
    if (idle_ == kCheckEvery) {
      since_ = now;
      return true;
    }
    return now - since_ < spin;
  }

 private:
  std::uint32_t idle_ = 0;  // idle polls since the last work
  Clock::time_point since_{};
  Clock::time_point last_{};
};

}  // namespace kf::detail
