// SPDX-License-Identifier: Apache-2.0
#include "common/cores.hpp"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace kf::detail {

// The affinity mask is what the workers started alike on this host share.
// hardware_concurrency() counts every online core: with two workers held to one core it called
// them uncrowded, and each spun out its whole polling window while the other, which it waited
// for, could not run (kf-bench, 2 workers under `taskset -c 0`, TCP, 4 B: 420 us; yielding,
// 17 us).
unsigned usable_cores() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace kf::detail
