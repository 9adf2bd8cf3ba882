// SPDX-License-Identifier: Apache-2.0
// kf-bench-line-exchange: how long this machine takes to move one cache line between the cores
// that two processes run on, the floor under a small same-host allreduce.
//
// Two processes (a fork) share one page. Each owns one cache line of it; per exchange both
// store the exchange's number into their own line and then spin until the other's line holds
// it, as the two workers of a 2-worker allreduce publish a ring record each and wait for the
// other's (docs/performance.md). The time per exchange is about one line's trip from one core
// to the other and back: the store's invalidation of the other core's copy, and that core's
// miss when it next reads. On a virtual machine it depends on where the host placed the two
// virtual CPUs, which may change while the machine runs: run it next to the measurement it
// explains. Each round prints its own time.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <new>

namespace {

using Clock = std::chrono::steady_clock;

// How long one side may wait for the other before the run is declared broken (the other
// process died, or the machine stopped one of them for that long).
constexpr auto kStall = std::chrono::seconds(10);

struct alignas(64) Line {
  std::atomic<std::uint64_t> value{0};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the lines are shared between processes");

struct Shared {
  Line line[2];
};

void relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Runs `exchanges` exchanges from `first` on; false when the other side stalled.
bool exchange(Shared& s, int me, std::uint64_t first, std::uint64_t exchanges) {
  Line& mine = s.line[me];
  const Line& other = s.line[1 - me];
  for (std::uint64_t i = first; i < first + exchanges; ++i) {
    mine.value.store(i, std::memory_order_release);
    std::uint32_t spins = 0;
    Clock::time_point since{};
    while (other.value.load(std::memory_order_acquire) < i) {
      relax();
      // The clock only now and then: reading it costs about as much as an exchange.
      if (++spins % (1U << 20) != 0) continue;
      const auto now = Clock::now();
      if (since == Clock::time_point{}) {
        since = now;
      } else if (now - since > kStall) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Measures how long two processes take to exchange one cache line (both store, then both "
      "wait for the other's), the floor under a small same-host allreduce."};
  std::uint64_t exchanges = 1000000;
  int rounds = 5;
  app.add_option("--exchanges", exchanges, "exchanges per round")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--rounds", rounds, "rounds, each printed")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  void* page =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("kf-bench-line-exchange: mmap");
    return 1;
  }
  auto* s = new (page) Shared{};
  // Warm-up: both processes running and the lines where they will stay.
  constexpr std::uint64_t kWarmup = 10000;
  std::fflush(stdout);  // nothing buffered twice by the fork
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("kf-bench-line-exchange: fork");
    return 1;
  }
  const int me = child == 0 ? 1 : 0;
  bool ok = exchange(*s, me, 1, kWarmup);
  std::uint64_t next = 1 + kWarmup;
  if (me == 0 && ok) {
    std::printf("# kf-bench-line-exchange: %llu exchanges per round; ns per exchange\n",
                static_cast<unsigned long long>(exchanges));
  }
  for (int r = 0; r < rounds && ok; ++r) {
    const auto t0 = Clock::now();
    ok = exchange(*s, me, next, exchanges);
    const auto t1 = Clock::now();
    next += exchanges;
    if (me == 0 && ok) {
      std::printf("round %d  %.1f\n", r + 1,
                  std::chrono::duration<double, std::nano>(t1 - t0).count() /
                      static_cast<double>(exchanges));
      std::fflush(stdout);
    }
  }
  if (me == 1) ::_exit(ok ? 0 : 1);
  int status = 0;
  if (!ok) ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "kf-bench-line-exchange: the other process stalled or failed\n");
    return 1;
  }
  return 0;
}
