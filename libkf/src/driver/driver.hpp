// SPDX-License-Identifier: Apache-2.0
// The driver: who runs the peer's I/O context (the I/O thread, or a user thread waiting on a
// collective), the lease that keeps the I/O thread parked between a user thread's collectives,
// and the completion state a Handle waits on. Thread-safety: as each member says; exactly one
// thread at a time runs the context (Driver::mu), and KF_DCHECK_IO checks it in debug builds.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/asio.hpp"
#include "common/clock.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

struct OpState;

/// Polling windows when PeerOptions::spin is unset (PeerImpl::update), measured with kf-bench:
/// 100-1000 us of pause-polling gave the same latencies with 2 workers on 2 cores; with 4
/// workers, 1000 us of yield-polling beat 200 us at 3 of 4 sizes.
inline constexpr auto kDefaultSpin = std::chrono::microseconds(200);
inline constexpr auto kCrowdedSpin = std::chrono::microseconds(1000);

/// With more workers on this host than cores, a collective that moves at least this many bytes
/// (its send or its receive buffer) is started and run by the I/O thread while the caller's wait
/// sleeps, rather than run by the waiting thread (Driver::start_on_io). A waiter that drives
/// polls its idle moments away with sched_yield(), with a window that stretches up to 8 ms; that
/// saves wake-ups worth microseconds, which a collective of milliseconds does not notice, and
/// takes the cores the other workers' copies need. kf-bench, 4 workers on 2 cores, back to back,
/// driven by the waiter against handed to the I/O thread: 64 KiB 55-82 us against 98-126,
/// 256 KiB 227-285 against 184-230, 1 MiB 509-771 against 471-545; 64 MiB 98-107 ms against
/// 62-68, with 1.55 million involuntary context switches against 0.06-0.17 million (figures and
/// the 3-worker sweep that set the threshold: docs/performance.md). With a core each, the waiter
/// drives at every size: the I/O thread's wake-ups cost 2 workers 0.2-0.4 ms at 1 MiB.
inline constexpr std::size_t kCrowdedIoThreadBytes = std::size_t{256} << 10;

/// Whether only the I/O thread may run the context (no polling window, so no hand-over to a
/// waiting user thread). Clang may keep the address of a thread_local across a coroutine's
/// suspension point, and Asio's coroutines read thread_locals when they resume: a coroutine that
/// one thread suspended and another resumed would read the first thread's storage, gone once
/// that thread has ended (a crash in Asio's call stack, seen with clang 16). Built with clang,
/// every coroutine therefore resumes on the I/O thread; GCC builds hand the context over.
#if defined(__clang__)
inline constexpr bool kOnlyIoThreadRuns = true;
#else
inline constexpr bool kOnlyIoThreadRuns = false;
#endif

/// The lock that says who runs the I/O context (Driver::mu): one word, taken and given back
/// with one atomic instruction each, and a futex wait only when a thread must block for it (the
/// I/O thread taking the context back). Every collective of a tight loop takes it twice (its
/// start and its wait) and gives it back twice; std::mutex's bookkeeping around the same atomic
/// instructions (owner, user count, kind) cost about 120 instructions of a 4-byte allreduce's
/// 2400 (callgrind).
class RunLock {
 public:
  bool try_lock() noexcept {
    int free = 0;
    return state_.compare_exchange_strong(free, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void lock() noexcept {
    if (try_lock()) return;
    // Held: mark it contended (2), so that the holder's unlock wakes a sleeper, and sleep until
    // it is free. Whoever takes it this way leaves it marked: at worst one needless wake-up.
    while (state_.exchange(2, std::memory_order_acquire) != 0) {
      state_.wait(2, std::memory_order_relaxed);
    }
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) state_.notify_one();
  }

 private:
  std::atomic<int> state_{0};  // 0 free, 1 held, 2 held and a thread may sleep for it
};

/// Who runs the I/O context. Normally the I/O thread (kf-io); but a user thread that waits on a
/// collective takes over and runs it itself until its collective is done, so the reply that
/// completes it is read by the thread that needs it, with no hand-off (a thread wake-up costs
/// about as much as a loopback hop). Exactly one thread runs the context at a time: the one
/// holding `mu`, so handlers still need no locks of their own.
struct Driver {
  explicit Driver(asio::io_context& c) : ioc(&c) {}
  RunLock mu;  // held by whichever thread runs the context
#ifndef NDEBUG
  std::atomic<std::thread::id> runner{};  // debug builds: the thread that holds `mu`
#endif
  /// Whether the calling thread runs the context (holds `mu`). Debug builds only: release
  /// builds do not track the runner, and KF_DCHECK_IO compiles to nothing there.
  bool runs_here() const noexcept {
#ifndef NDEBUG
    return runner.load(std::memory_order_relaxed) == std::this_thread::get_id();
#else
    return true;
#endif
  }
  /// Marks the calling thread as the runner for as long as it lives; made right after `mu` is
  /// taken and destroyed before it is given back.
  class Running {
   public:
    explicit Running(Driver& d) noexcept : d_(d) { d_.mark_running(true); }
    ~Running() { d_.mark_running(false); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

   private:
    Driver& d_;
  };
  void mark_running([[maybe_unused]] bool on) noexcept {
#ifndef NDEBUG
    runner.store(on ? std::this_thread::get_id() : std::thread::id{}, std::memory_order_relaxed);
#endif
  }
  std::atomic<int> wanted{0};       // user threads in drive_until(); the I/O thread parks meanwhile
  std::atomic<bool> closed{false};  // the peer is shutting down: nobody else may drive
  asio::io_context* ioc;
  // Set just before the peer stops the context. The polling loops look at this and not at
  // io_context::stopped(), which takes the scheduler's mutex (a lock and an unlock per look:
  // about 60 instructions, on every poll of a waiting thread).
  std::atomic<bool> stopping{false};
  bool stopped() const noexcept { return stopping.load(std::memory_order_relaxed); }
  // How long a thread running the context polls before it blocks in epoll, in microseconds
  // (PeerOptions::spin, resolved for the current cluster). Zero also turns drive_until off.
  std::atomic<std::int64_t> spin_us{0};
  std::chrono::microseconds spin() const noexcept {
    return std::chrono::microseconds(spin_us.load(std::memory_order_relaxed));
  }
  // A waiting thread's polling window is spin() doubled `stretch` times (at most kMaxStretch,
  // and never past kMaxWindow unless spin() is longer). A wait whose sleep after the window
  // ended within one more window's length stretches it once; a sleep of more than four windows
  // shrinks it once (adapt_window). Beside a busy process on shared cores a worker that waits
  // longer than 200 us for its peer is the rule, and each sleep and wake-up then costs more
  // than the window (2 workers on 2 cores and one busy loop, 64 KiB back to back: 470 us a
  // call with 200 us windows, 10-11 us with 5 ms); a worker whose peer computes between
  // collectives sleeps long, and its window stays short. Touched only under `mu`.
  int stretch = 0;
  static constexpr int kMaxStretch = 5;
  static constexpr auto kMaxWindow = std::chrono::microseconds(8000);
  std::chrono::microseconds window() const noexcept {
    const auto base = spin();
    return std::max(base, std::min(base * (1 << stretch), std::chrono::microseconds(kMaxWindow)));
  }
  /// After a sleep of `slept` that followed a polling window of `window`.
  void adapt_window(Clock::duration slept, std::chrono::microseconds window) noexcept {
    if (slept < window) {
      stretch = std::min(stretch + 1, kMaxStretch);
    } else if (slept > 4 * window && stretch > 0) {
      --stretch;
    }
  }
  // More workers on this host than cores: poll with sched_yield() instead of a pause.
  std::atomic<bool> yield{false};
  /// One poll's pause: a CPU pause, or sched_yield() when crowded.
  void relax() const noexcept;

  // The peer's shared-memory rings, which no epoll reports: whoever runs the context polls them
  // with the context, and announces in them when it is about to sleep (Mesh::poll_rings,
  // Mesh::rings_asleep). Set once before the I/O thread starts.
  std::function<std::size_t()> poll_rings;
  std::function<bool(bool)> rings_asleep;
  // The collective lanes whose events were set (Engine::run_woken): no handler runs them,
  // so whoever runs the context runs them after each handler or ring record.
  std::function<std::size_t()> run_woken;
  // Whether this peer reads any shared-memory ring (Mesh::reads_rings);
  // touched only under `mu`.
  bool reads_rings = false;
  // Counts what the mesh and the engine post to the context (a writer to wake, a coroutine to
  // start): a collective's start that posted nothing needs no poll of the context after it,
  // which with nothing ready would be an epoll_wait system call on the submitting thread.
  // Touched only by the runner.
  std::uint64_t handlers_posted = 0;
  // Something was posted to the context that should run soon (a lane that stopped to let it
  // run: Engine::advance): the next polling round polls the context even where it would
  // skip it. Touched only under `mu`.
  bool context_due = false;
  /// One round of polling: ready handlers, ring records and woken lanes; the number run.
  /// `skip_context` leaves the context out (its epoll_wait is a system call when idle).
  std::size_t poll_once(bool skip_context = false) {
    std::size_t n = 0;
    if (!skip_context) {
      context_due = false;
      n = ioc->poll_one();
    }
    if (poll_rings) n += poll_rings();
    if (run_woken) n += run_woken();
    return n;
  }
  /// Sleeps in epoll until one handler ran, unless a ring has a record waiting.
  void block_once() {
    if (rings_asleep && !rings_asleep(true)) return;
    ioc->run_one();
    if (rings_asleep) rings_asleep(false);
  }

  /// Runs the context on the calling thread until `s` is ready, or returns early when the I/O
  /// thread cannot hand it over promptly (another user thread drives) or the peer is closing;
  /// the caller then waits on `s` as usual.
  void drive_until(const OpState& s);
  /// Runs the handlers that are ready now (a collective just submitted: its first sends) on the
  /// calling thread, when nobody else runs the context; otherwise leaves them to whoever does.
  void run_ready();
  /// Runs `f` (a collective's start) on the calling thread when nobody else runs the context,
  /// followed by what it made ready (run_ready); otherwise posts it to whoever does.
  /// `f` returns whether it posted handlers to the context; if not, only the lanes it woke run.
  template <typename F>
  void start(F&& f) {
    bool ran = false;
    if (spin().count() > 0 && !closed.load(std::memory_order_relaxed) && mu.try_lock()) {
      std::lock_guard<RunLock> held(mu, std::adopt_lock);
      Running running(*this);
      if (!stopped()) {
        if (f()) {
          run_ready_locked();
        } else if (run_woken) {
          run_woken();
        }
        ran = true;
      }
    }
    if (!ran) asio::post(*ioc, std::forward<F>(f));
  }
  /// Posts `f` (a long collective's start) to the I/O thread, which runs it and the collective
  /// while the caller sleeps in its wait (the operation has no driver): ends a lease, so that a
  /// parked I/O thread takes the context back at once.
  template <typename F>
  void start_on_io(F&& f) {
    asio::post(*ioc, std::forward<F>(f));
    if (lease_until.load(std::memory_order_relaxed) > Clock::now().time_since_epoch().count()) {
      lease_until.store(0, std::memory_order_relaxed);
      wake_io();
    }
  }
  /// run_ready's work, by a thread that holds `mu`.
  void run_ready_locked();

  // The lease: a waiter that drove leaves the context to user threads for one polling window
  // after it is done. The I/O thread stays parked meanwhile (without holding `mu`), so the next
  // collective's submit and wait take the context at once: no wake-up of the I/O thread and no
  // hand-over back and forth for each collective of a tight loop. After the window the I/O
  // thread takes over again (background progress while the user computes).
  std::atomic<Clock::rep> lease_until{0};
  /// The I/O thread: whether to stay parked, and until when at most before it looks again.
  bool leased(Clock::time_point now, Clock::time_point& recheck) const noexcept;
  std::mutex park_mu;  // the I/O thread's sleep while parked; notified only on close
  std::condition_variable park_cv;
  void wake_io() {
    std::lock_guard<std::mutex> lk(park_mu);
    park_cv.notify_all();
  }
};

/// Where waiters that could not drive the I/O sleep: a few mutexes and condition variables
/// shared by all operations, picked by the operation's address. A completion wakes every sleeper
/// of its stripe, and each looks again at its own operation. (A mutex and a condition variable
/// in every OpState were built and torn down for every collective, though nearly every wait
/// ends without sleeping.)
struct SleepStripe {
  std::mutex mu;
  std::condition_variable cv;
};
SleepStripe& sleep_stripe(const void* op) noexcept;

/// A device collective's result as a mark in device streams (the backend's): Handle::order_on.
struct DeviceDone {
  virtual ~DeviceDone() = default;
  /// Work enqueued on `stream` from now on waits for the result.
  virtual void order_on(void* stream) = 0;
};

/// Completion state shared by a Handle (any thread) and the I/O thread.
///
/// Most waits end without sleeping (the waiter ran the I/O itself: Driver), so completing takes
/// no lock unless a waiter said it sleeps: `ready` and `sleepers` are a store-then-load pair on
/// each side (sequentially consistent), so either the completer sees the sleeper and wakes it
/// under its stripe's mutex, or the sleeper sees `ready` before it waits. (Locking for every
/// completion cost about 70 instructions of a 4-byte collective's 2500.)
struct OpState {
  std::atomic<bool> claimed{false};  // complete() was called: the first call wins
  std::atomic<int> sleepers{0};      // waiters that sleep, or are about to
  std::atomic<bool> ready{false};
  std::error_code ec;                  // written once, before `ready`
  std::string what;                    // written once, before `ready`
  std::shared_ptr<Driver> driver;      // set for collectives: a waiter may run the I/O itself
  std::shared_ptr<DeviceDone> device;  // device collectives: set before the handle is returned

  /// The first call wins: a waiter that saw `ready` reads `ec` and `what`.
  void complete(std::error_code e, std::string w) {
    if (claimed.exchange(true, std::memory_order_acq_rel)) return;
    ec = e;
    what = std::move(w);
    publish();
  }
  /// complete() without an error or a message, by the engine: `ec` and `what` stay as a fresh
  /// state has them (empty). Only the thread that runs the I/O context completes a host
  /// collective's state (the engine, its deadlines, the peer's shutdown), so nothing can claim
  /// it meanwhile and the claim needs no read-modify-write.
  void complete_ok() {
    if (claimed.load(std::memory_order_relaxed)) return;
    claimed.store(true, std::memory_order_relaxed);
    publish();
  }
  /// Back to a fresh state for the next collective (make_recycled): called by the last owner,
  /// when nobody waits on it. The driver stays (the next user sets its own).
  void recycle() noexcept {
    claimed.store(false, std::memory_order_relaxed);
    sleepers.store(0, std::memory_order_relaxed);
    ready.store(false, std::memory_order_relaxed);
    ec = {};
    what.clear();
    device.reset();
  }
  /// Sleeps until complete() has run.
  void sleep_until_ready() {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    SleepStripe& st = sleep_stripe(this);
    std::unique_lock<std::mutex> lk(st.mu);
    st.cv.wait(lk, [&] { return ready.load(std::memory_order_seq_cst); });
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  /// `ready`, and a wake-up for the sleepers if any.
  void publish() {
    ready.store(true, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      SleepStripe& st = sleep_stripe(this);
      std::lock_guard<std::mutex> lk(st.mu);
      st.cv.notify_all();
    }
  }
};

}  // namespace kf::detail

// Thread confinement: the I/O-only methods (the mesh's, the mailbox's, the engine's) run on
// whichever thread runs the context, and assert it at their entry in debug builds.
#ifdef NDEBUG
#define KF_DCHECK_IO(driver) ((void)0)
#else
#define KF_DCHECK_IO(driver) \
  KF_CHECK((driver).runs_here(), "an I/O-only method was called off the I/O context's runner")
#endif
