// SPDX-License-Identifier: Apache-2.0
// Waiting and waking: a Handle's wait, which runs the I/O on the waiting thread when it can
// (Driver::drive_until), the hand-over of the context between the I/O thread and user threads,
// and the sleep of waiters that could not drive.
#include "driver/driver.hpp"

#include <array>
#include <thread>

#include "kf/coll/handle.hpp"
#include "kf/common/error.hpp"

namespace kf {

bool Handle::ready() const noexcept {
  return !state_ || state_->ready.load(std::memory_order_acquire);
}

std::error_code Handle::wait_status() const noexcept {
  if (!state_) return {};
  // Run the I/O on this thread while waiting (detail::Driver); then, or if that could not be
  // arranged, sleep until the collective completes.
  if (state_->driver) state_->driver->drive_until(*state_);
  // Done (the usual case after driving): `ec` was written before `ready` was set and is never
  // written again.
  if (!state_->ready.load(std::memory_order_acquire)) state_->sleep_until_ready();
  return state_->ec;
}

void Handle::wait() const {
  const std::error_code ec = wait_status();
  if (ec) throw Error(ec, message());
}

void Handle::order_on(void* stream) const {
  if (!state_) return;
  if (state_->device) {
    state_->device->order_on(stream);
  } else {
    wait();  // a host collective: its result is in host memory once it is done
  }
}

std::string Handle::message() const {
  // Written once, before `ready`: empty until the operation completed.
  if (!state_ || !state_->ready.load(std::memory_order_acquire)) return {};
  return state_->what;
}

namespace detail {

SleepStripe& sleep_stripe(const void* op) noexcept {
  // Never destroyed: a Peer torn down by a static destructor may still complete operations.
  static auto* const stripes = new std::array<SleepStripe, 16>();
  // OpStates are heap blocks of about 100 bytes: the bits above the allocator's alignment.
  const auto at = reinterpret_cast<std::uintptr_t>(op) >> 6;
  return (*stripes)[(at ^ (at >> 4)) % stripes->size()];
}

namespace {

// The longest a waiter's lease keeps the I/O thread parked (Driver::leased).
constexpr auto kMaxLease = std::chrono::microseconds(1000);

}  // namespace

void Driver::relax() const noexcept {
  if (yield.load(std::memory_order_relaxed)) {
    std::this_thread::yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The hand-over: announce the wish (`wanted`); when the context is free (the I/O thread is
// parked: a waiter drove a moment ago and its lease still holds) take it at once. Otherwise nudge
// the I/O thread out of epoll with an empty handler, and take `mu` once it has parked. While it
// waits for the hand-over the caller yields its core rather than spin on it: on a machine with
// as many busy threads as cores, the I/O thread may need that very core to get to the point
// where it parks.
void Driver::drive_until(const OpState& s) {
  if (s.ready.load(std::memory_order_acquire)) return;
  const auto spin = this->spin();
  // Without polling, handing the I/O over and back costs more wake-ups than it saves.
  if (spin.count() == 0) return;
  // How long to wait for the I/O thread to park before sleeping on the collective instead (it
  // parks between two handlers; one handler rarely runs longer than this).
  constexpr auto kHandOver = std::chrono::microseconds(500);
  wanted.fetch_add(1);
  if (!closed.load()) {
    bool nudged = false;
    Clock::time_point give_up{};  // read when first needed: the context is usually free
    while (!s.ready.load(std::memory_order_acquire)) {
      if (mu.try_lock()) {
        std::lock_guard<RunLock> held(mu, std::adopt_lock);
        Running running(*this);
        // The lease's start when the wait ends before its idle polls read the clock: read now,
        // while the reply is on its way, rather than after it came, between the reply and the
        // next collective's first frame.
        const Clock::time_point began = Clock::now();
        bool slept = false;
        IdleWindow idle;
        // When rings carry the traffic they are polled every time, and the context (an
        // epoll_wait system call when nothing is ready, under the scheduler's lock) less often,
        // never at the first idle poll after work. With more workers than cores each idle poll
        // ends by yielding the core, and a poll that makes the system call takes that much
        // longer to hand it to the worker it waits for: every 4th idle poll (4 workers on 2
        // cores, 4 B, pinned to each of the three pairings, 10.5 / 7.5 / 10.8 -> 9.3 / 6.9 /
        // 7.3 us when it still polled at the first; leaving that out too: three on one core
        // 11.3-12.8 -> 9.8-10.9 us, held by kfrun 5.4-7.4 -> 5.6-6.2 us). With a core each,
        // every 16th: a ring record that lands during the system call waits for it to end (2
        // workers, 4 B 0.66-0.72 -> 0.62-0.68 us, 64 B 0.77-0.80 -> 0.69-0.76). Over TCP, where
        // the context is all there is to poll, it is polled every time (skipping cost 20 %).
        const bool crowded = yield.load(std::memory_order_relaxed);
        const std::chrono::microseconds polling = window();
        Clock::time_point woke{};
        while (!s.ready.load(std::memory_order_acquire) && !stopped()) {
          const bool skip = reads_rings && !context_due &&
                            (crowded ? idle.idle_polls() % 4 != 3 : idle.idle_polls() % 16 != 15);
          if (poll_once(skip) > 0) {
            idle.worked();
          } else if (idle.within(polling)) {
            relax();
          } else {
            // A context that ran out of work stops by itself: then nothing is left to wait for.
            if (ioc->stopped()) break;
            const Clock::time_point window_ended = idle.last_reading();
            block_once();
            woke = Clock::now();
            adapt_window(woke - window_ended, polling);
            slept = true;
            idle.worked();
          }
        }
        // One polling window, but never long: a job that polls for seconds (KF_SPIN_US) must
        // not go without background progress for as long after each wait. It runs from the
        // last reading of the clock, at most a few idle polls old, or from the end of the last
        // sleep in the kernel.
        const auto lease = std::min<Clock::duration>(spin, kMaxLease);
        const Clock::time_point from = std::max(slept ? woke : began, idle.last_reading());
        lease_until.store((from + lease).time_since_epoch().count(), std::memory_order_relaxed);
        break;
      }
      if (!nudged) {
        asio::post(*ioc, [] {});
        nudged = true;
        give_up = Clock::now() + kHandOver;
      }
      if (Clock::now() >= give_up) break;
      std::this_thread::yield();
    }
  }
  // The I/O thread does not wait for this: it looks again when its lease ends. Only a closing
  // peer's destructor waits here for the last driver to leave.
  if (wanted.fetch_sub(1) == 1 && closed.load()) wanted.notify_all();
}

void Driver::run_ready() {
  if (spin().count() == 0 || closed.load(std::memory_order_relaxed)) return;
  if (!mu.try_lock()) return;  // the I/O thread or a waiter runs the context: it runs them
  std::lock_guard<RunLock> held(mu, std::adopt_lock);
  Running running(*this);
  run_ready_locked();
}

void Driver::run_ready_locked() {
  // What a new collective's start made ready (a writer to resume, a lane whose receive came);
  // a bounded number: this is the caller's time, not a wait. (Running only the first handler
  // measured 0.2 us faster at 4 B but 2 us slower at 64 KiB.)
  for (int i = 0; i < 8 && !stopped(); ++i) {
    std::size_t n = ioc->poll_one();
    if (run_woken) n += run_woken();
    if (n == 0) break;
  }
}

bool Driver::leased(Clock::time_point now, Clock::time_point& recheck) const noexcept {
  if (wanted.load(std::memory_order_acquire) > 0) {
    recheck = now + std::chrono::milliseconds(5);
    return true;
  }
  const Clock::time_point until{Clock::duration(lease_until.load(std::memory_order_relaxed))};
  if (now >= until) return false;
  recheck = until;
  return true;
}

}  // namespace detail
}  // namespace kf
