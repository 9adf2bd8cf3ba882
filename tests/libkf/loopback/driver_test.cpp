// SPDX-License-Identifier: Apache-2.0
// A thread that waits on a collective runs the peer's I/O itself (detail::Driver in
// libkf/src/peer.cpp) while the I/O thread parks. These tests force polling on, so the
// hand-over happens whatever the core count, and check that it never lets two threads run the
// I/O at once (results stay exact; ThreadSanitizer watches the build of suite 'sanitize'), never
// strands a waiter, and survives the peer being destroyed under a waiting thread. Also the
// collectives' progress deadline, which the waiting lanes share.
#include "kf/peer.hpp"

#include <sched.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/cores.hpp"
#include "driver/driver.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

PeerOptions polling(std::chrono::microseconds spin) {
  PeerOptions o;
  o.job_token = "test-token";
  o.spin = spin;
  return o;
}

// Several user threads per peer, each with its own stream of collectives, all waiting at once:
// only one of them can hold the I/O at a time, the others sleep on their handles or wait for
// the hand-over, and every result is exact.
TEST(Driver, ManyThreadsWaitingAtOnceAllGetExactResults) {
  constexpr int kPeers = 2, kThreads = 4, kRounds = 150;
  auto peers = test::make_local_cluster(kPeers, polling(std::chrono::microseconds(200)));
  std::atomic<int> wrong{0};
  test::run_all(kPeers, [&](int r) {
    test::run_all(kThreads, [&](int t) {
      std::vector<float> v(1 + 97 * t);  // 4 B to about 1 KiB
      for (int i = 0; i < kRounds; ++i) {
        for (auto& x : v) x = static_cast<float>(r + 1 + i);
        const std::string name = "t" + std::to_string(t) + "#" + std::to_string(i);
        peers[r]->allreduce(name, buffer(v.data(), v.size()), buffer(v.data(), v.size())).wait();
        for (float x : v) wrong += x != static_cast<float>(3 + 2 * i);
      }
    });
  });
  EXPECT_EQ(wrong.load(), 0);
}

// Submitting many collectives first and waiting afterwards (how gradient buckets are used):
// the waits find some collectives done, others in flight, and drive until each is done.
TEST(Driver, WaitingOnManyOutstandingHandlesInAnyOrder) {
  auto peers = test::make_local_cluster(2, polling(std::chrono::microseconds(200)));
  constexpr int kHandles = 64;
  std::vector<std::vector<std::vector<float>>> data(2);
  test::run_all(2, [&](int r) {
    data[r].assign(kHandles, std::vector<float>(4096, static_cast<float>(r + 1)));
    std::vector<Handle> hs;
    for (int i = 0; i < kHandles; ++i) {
      auto& v = data[r][i];
      hs.push_back(peers[r]->allreduce("bucket" + std::to_string(i), buffer(v.data(), v.size()),
                                       buffer(v.data(), v.size())));
    }
    // Last to first, so that most waits start before their collective has finished.
    for (int i = kHandles - 1; i >= 0; --i) hs[i].wait();
  });
  for (int r = 0; r < 2; ++r) {
    for (const auto& v : data[r]) ASSERT_EQ(v.back(), 3.0f);
  }
}

// Collectives take their context and completion state from a per-thread cache
// (common/recycle.hpp). A handle kept after its collective finished keeps that collective's
// outcome however many collectives follow; a handle waited on and dropped by another thread
// leaves its state to that thread; results stay exact throughout.
TEST(Driver, KeptAndHandedOverHandlesKeepTheirOutcomes) {
  auto peers = test::make_local_cluster(2, polling(std::chrono::microseconds(200)));
  test::run_all(2, [&](int r) {
    Peer& p = *peers[r];
    float one = 1.0f;
    double other = 0.0;
    // Refused at once (send and recv differ in type): failed before it started.
    Handle refused = p.allreduce("refused", buffer(&one, 1), buffer(&other, 1));
    float kept_value = static_cast<float>(r + 1);
    Handle kept = p.allreduce("kept", buffer(&kept_value, 1), buffer(&kept_value, 1));
    kept.wait();
    std::vector<float> v(16);
    for (int i = 0; i < 200; ++i) {
      for (auto& x : v) x = static_cast<float>(r + i);
      Handle h = p.allreduce("loop", buffer(v.data(), v.size()), buffer(v.data(), v.size()));
      if (i % 3 == 0) {
        // Waited on and released by a thread of its own, which then ends.
        std::thread([h = std::move(h)] { h.wait(); }).join();
      } else {
        h.wait();
      }
      for (float x : v) ASSERT_EQ(x, static_cast<float>(1 + 2 * i)) << "call " << i;
    }
    EXPECT_EQ(refused.wait_status(), make_error_code(errc::invalid_argument));
    EXPECT_NE(refused.message().find("differ"), std::string::npos) << refused.message();
    EXPECT_FALSE(kept.wait_status());
    EXPECT_TRUE(kept.message().empty()) << kept.message();
    EXPECT_EQ(kept_value, 3.0f);
  });
}

// A thread waits (and drives) on a collective that cannot finish, because the other worker never
// takes part; destroying the peer fails the collective, and the waiter returns with the error
// instead of running a context that no longer exists.
TEST(Driver, DestroyingThePeerReleasesAWaitingThread) {
  auto peers = test::make_local_cluster(2, polling(std::chrono::microseconds(200)));
  int x = 1;
  CollOptions o;
  o.timeout = std::chrono::milliseconds(60000);  // only the destruction can end it
  Handle h = peers[0]->allreduce("never", buffer(&x, 1), buffer(&x, 1), o);
  std::error_code got;
  std::thread waiter([&] { got = h.wait_status(); });
  peers[0].reset();
  waiter.join();
  EXPECT_TRUE(got) << "the collective reported success without its peer";
}

// With polling off the waiter leaves the I/O to the I/O thread and sleeps on the handle.
TEST(Driver, WithoutPollingResultsAreTheSame) {
  auto peers = test::make_local_cluster(2, polling(std::chrono::microseconds(0)));
  std::vector<int> v(2);
  test::run_all(2, [&](int r) {
    for (int i = 0; i < 50; ++i) {
      v[r] = r + i;
      peers[r]->allreduce("x" + std::to_string(i), buffer(&v[r], 1), buffer(&v[r], 1)).wait();
      ASSERT_EQ(v[r], 1 + 2 * i);
    }
  });
}

// After user threads have driven, the I/O thread has handed the context over and back many
// times, and stays parked for a waiter's lease after the last wait. A collective nobody waits on
// must still complete on the I/O thread alone (background progress: gradients reduced while the
// user computes). Both peers only look at ready() here. With a polling window of a minute the
// lease must still end soon (it is capped), or nothing moves for that minute.
class DriverLease : public ::testing::TestWithParam<std::chrono::microseconds> {};

TEST_P(DriverLease, ACollectiveNobodyWaitsOnStillCompletes) {
  auto peers = test::make_local_cluster(2, polling(GetParam()));
  std::vector<std::vector<float>> v(2, std::vector<float>(300));
  test::run_all(2, [&](int r) {
    for (int i = 0; i < 20; ++i) {  // waiting threads drive
      std::fill(v[r].begin(), v[r].end(), 1.0f);
      peers[r]->allreduce("warm", buffer(v[r].data(), 300), buffer(v[r].data(), 300)).wait();
    }
    std::fill(v[r].begin(), v[r].end(), static_cast<float>(r + 1));
    Handle h = peers[r]->allreduce("unwaited", buffer(v[r].data(), 300), buffer(v[r].data(), 300));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!h.ready() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_TRUE(h.ready()) << "rank " << r << ": no progress without a waiting thread";
    if (!h.ready()) h.wait_status();  // the buffers must not go while still in use
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(v[r][299], 3.0f) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Loopback, DriverLease,
                         ::testing::Values(std::chrono::microseconds(1000),
                                           std::chrono::microseconds(60'000'000)),
                         [](const auto& tpi) { return std::to_string(tpi.param.count()) + "us"; });

// The progress deadline, kept by one timer for every waiting lane: a collective that a member
// never joins fails with a timeout once that member has been silent for the collective's
// timeout, and the message names it. Heartbeats are off, so nothing else could end the wait.
PeerOptions silent_when_idle() {
  PeerOptions o = polling(std::chrono::microseconds(200));
  o.heartbeat_interval = std::chrono::milliseconds(0);
  o.heartbeat_timeout = std::chrono::milliseconds(0);
  return o;
}

// A waiting thread's polling window doubles after each wait whose sleep ended within one more
// window (the peer came back soon: a longer window would have caught it), up to 32 times the
// spin or 8 ms, and halves after each sleep of more than four windows; a longer spin of the
// user's own is never shortened.
TEST(Driver, AWaitsPollingWindowStretchesAfterShortSleepsAndShrinksAfterLongOnes) {
  using std::chrono::microseconds;
  boost::asio::io_context ioc;
  detail::Driver d(ioc);
  d.spin_us.store(200);
  EXPECT_EQ(d.window(), microseconds(200));
  for (const int want : {400, 800, 1600, 3200, 6400, 6400}) {
    d.adapt_window(microseconds(150), d.window());
    EXPECT_EQ(d.window(), microseconds(want));
  }
  d.adapt_window(microseconds(6400 * 4), d.window());  // not more than four windows: as it was
  EXPECT_EQ(d.window(), microseconds(6400));
  d.adapt_window(microseconds(6400 * 4 + 1), d.window());
  EXPECT_EQ(d.window(), microseconds(3200));
  for (int i = 0; i < 10; ++i) d.adapt_window(std::chrono::seconds(1), d.window());
  EXPECT_EQ(d.window(), microseconds(200));
  // Stretched as far as it goes: 8 ms at most, or the spin when that is longer.
  for (int i = 0; i < 10; ++i) d.adapt_window(microseconds(0), d.window());
  d.spin_us.store(1000);
  EXPECT_EQ(d.window(), microseconds(8000));
  d.spin_us.store(20000);
  EXPECT_EQ(d.window(), microseconds(20000));
}

// On crowded cores a long collective is handed to the I/O thread (Driver::start_on_io) while its
// waiter sleeps: posted to the context, and a lease that keeps the I/O thread parked ends at
// once, so that the parked thread takes the context back instead of sleeping out the lease. An
// ended lease stays ended, and one that ran out already is left as it is.
TEST(Driver, AHandOverToTheIoThreadEndsALease) {
  boost::asio::io_context ioc;
  detail::Driver d(ioc);
  d.spin_us.store(1000);
  const auto now = detail::Clock::now();
  d.lease_until.store((now + std::chrono::seconds(10)).time_since_epoch().count());
  detail::Clock::time_point recheck;
  ASSERT_TRUE(d.leased(now, recheck));
  int ran = 0;
  d.start_on_io([&] { ++ran; });
  EXPECT_FALSE(d.leased(detail::Clock::now(), recheck));
  EXPECT_EQ(d.lease_until.load(), 0);
  d.start_on_io([&] { ++ran; });
  EXPECT_EQ(d.lease_until.load(), 0);
  const auto past = (now - std::chrono::seconds(1)).time_since_epoch().count();
  d.lease_until.store(past);
  d.start_on_io([&] { ++ran; });
  EXPECT_EQ(d.lease_until.load(), past);
  EXPECT_EQ(ioc.poll(), 3u);
  EXPECT_EQ(ran, 3);
}

// Whether a host's workers outnumber its cores is judged by the cores this process may use (its
// affinity mask), not the machine's: two workers held to one core must yield while they poll.
TEST(Driver, CoresAreCountedFromTheAffinityMask) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  EXPECT_EQ(detail::usable_cores(), static_cast<unsigned>(CPU_COUNT(&allowed)));
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  unsigned seen = 0;
  std::thread held([&] {  // a thread of its own, so that this one keeps its mask
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) seen = detail::usable_cores();
  });
  held.join();
  EXPECT_EQ(seen, 1u);
}

TEST(Deadline, ACollectiveASilentMemberNeverJoinsTimesOut) {
  auto peers = test::make_local_cluster(2, silent_when_idle());
  int x = 1;
  CollOptions o;
  o.timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  Handle h = peers[0]->allreduce("alone", buffer(&x, 1), buffer(&x, 1), o);
  const std::error_code ec = h.wait_status();
  EXPECT_GE(std::chrono::steady_clock::now() - start, o.timeout);
  EXPECT_EQ(ec, make_error_code(errc::timeout)) << ec.message();
  EXPECT_NE(h.message().find(peers[1]->endpoint().str()), std::string::npos) << h.message();
  EXPECT_NE(h.message().find("no progress for 300 ms"), std::string::npos) << h.message();
}

// A member that is late to a collective but keeps talking meanwhile (other collectives) is
// waited for: the deadline moves with its last frame, whatever the timeout.
TEST(Deadline, AMemberThatKeepsTalkingIsWaitedFor) {
  auto peers = test::make_local_cluster(2, silent_when_idle());
  CollOptions late_opts;
  late_opts.timeout = std::chrono::milliseconds(100);
  std::vector<int> late{1, 2};
  std::vector<std::error_code> got(2);
  test::run_all(2, [&](int r) {
    Peer& p = *peers[static_cast<std::size_t>(r)];
    Handle h;
    if (r == 0) h = p.allreduce("late", buffer(&late[0], 1), buffer(&late[0], 1), late_opts);
    // Rank 0 decides how long the others keep it busy: 5 of the late collective's timeouts.
    const auto until = std::chrono::steady_clock::now() + 5 * late_opts.timeout;
    std::error_code& mine = got[static_cast<std::size_t>(r)];
    for (int i = 0; !mine; ++i) {
      int more = r == 0 && std::chrono::steady_clock::now() < until ? 1 : 0;
      CollOptions max;
      max.op = ReduceOp::max;
      mine = p.allreduce("talk#" + std::to_string(i), buffer(&more, 1), buffer(&more, 1), max)
                 .wait_status();
      if (more == 0) break;
    }
    if (r == 1 && !mine) {
      h = p.allreduce("late", buffer(&late[1], 1), buffer(&late[1], 1), late_opts);
    }
    const std::error_code ec = h.wait_status();  // (rank 0's buffer is in use until then)
    if (!mine) mine = ec;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(got[static_cast<std::size_t>(r)])
        << "rank " << r << ": " << got[static_cast<std::size_t>(r)].message();
    EXPECT_EQ(late[static_cast<std::size_t>(r)], 3) << "rank " << r;
  }
}

}  // namespace
}  // namespace kf
