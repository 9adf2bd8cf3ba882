// SPDX-License-Identifier: Apache-2.0
// This machine's memory copy rate, the reference for large allreduces (docs/performance.md,
// "What bounds 64 MiB"): each of `threads` threads copies its own buffer of `bytes` with memcpy,
// all at once, as the workers of one host do in a large allreduce; a thread's rate is bytes over
// its fastest copy, and the result is the median over the threads. Buffers are written before
// timing, so no page fault is counted.
// Thread-safety: measure_copy_rate starts and joins its own threads; call it from one thread.
#pragma once

#include <cstddef>

namespace kf::tools::bench {

struct CopyRate {
  int threads = 0;
  std::size_t bytes = 0;
  double gbps = 0;  ///< per thread, 1e9 bytes/s
};

/// Copies `repeats` times per thread. Throws: std::invalid_argument for threads < 1, bytes or
/// repeats 0; std::bad_alloc.
CopyRate measure_copy_rate(std::size_t bytes, int threads, int repeats);

}  // namespace kf::tools::bench
