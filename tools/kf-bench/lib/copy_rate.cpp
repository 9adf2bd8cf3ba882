// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/copy_rate.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <latch>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kf-bench/lib/stats.hpp"

namespace kf::tools::bench {

CopyRate measure_copy_rate(std::size_t bytes, int threads, int repeats) {
  if (threads < 1 || bytes == 0 || repeats < 1) {
    throw std::invalid_argument("measure_copy_rate: threads, bytes and repeats must be positive");
  }
  const auto n = static_cast<std::size_t>(threads);
  std::vector<std::vector<std::byte>> src(n), dst(n);
  for (std::size_t t = 0; t < n; ++t) {
    src[t].assign(bytes, std::byte{1});
    dst[t].assign(bytes, std::byte{0});
  }
  std::vector<double> best_s(n, 0.0);
  std::latch start(threads);
  std::vector<std::jthread> workers;
  for (std::size_t t = 0; t < n; ++t) {
    workers.emplace_back([&, t] {
      start.arrive_and_wait();
      double best = 0.0;
      for (int r = 0; r < repeats; ++r) {
        const auto begin = std::chrono::steady_clock::now();
        std::memcpy(dst[t].data(), src[t].data(), bytes);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - begin;
        // Read back, so that no compiler takes the copy for a dead store.
        const volatile std::byte seen = dst[t][bytes / 2];
        (void)seen;
        if (r == 0 || took.count() < best) best = took.count();
      }
      best_s[t] = best;
    });
  }
  workers.clear();  // joins
  std::vector<double> rates;
  for (const double s : best_s) rates.push_back(s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0);
  return CopyRate{threads, bytes, quantile(rates, 0.5)};
}

}  // namespace kf::tools::bench
