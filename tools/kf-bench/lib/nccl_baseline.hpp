// SPDX-License-Identifier: Apache-2.0
// kf-bench nccl-baseline: kf's allreduce on device buffers (the NCCL backend) against raw
// ncclAllReduce on the same workers, in one run: for each size, rounds that alternate a block of
// raw NCCL iterations and a block of kf iterations, so that drift of the machine hits both
// alike. Each iteration: a kf barrier, then on each worker the time from the call to the end of
// the operation on the host (raw: cudaStreamSynchronize; kf: Handle::wait); the row's medians
// are over the iterations' maxima across workers. Also times making the communicator (raw: id
// broadcast and ncclCommInitRank; kf: its first allreduce, which makes it), and with --shrink
// (3 or more workers) the last worker leaving: the survivors' first allreduce of the new version
// (kf shrinks its communicator) against their next one. Rank 0 prints the table.
// Thread-safety: one thread per worker.
#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

namespace kf::tools::bench {

struct BaselineOptions {
  std::vector<std::size_t> sizes;  ///< message bytes per worker (f32, sum)
  int iters = 20;                  ///< timed iterations per block
  int rounds = 3;                  ///< blocks of each per size
  int warmup = 3;                  ///< untimed iterations of each before a size's rounds
  bool shrink = false;
};

/// kf-bench nccl-baseline's worker (under kfrun). Returns the exit code: 0 when every result
/// was right, 1 when one was not or something failed (a message on `err`). Never throws.
int run_nccl_baseline(const BaselineOptions& o, std::ostream& out, std::ostream& err) noexcept;

}  // namespace kf::tools::bench
