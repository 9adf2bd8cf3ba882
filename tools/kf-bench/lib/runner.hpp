// SPDX-License-Identifier: Apache-2.0
// kf-bench's measurement loop. For each algorithm and message size, every worker:
//   1. fills the buffers of the first iterations (Pattern), rotating through enough buffers that
//      each iteration's were last touched tens of MiB earlier (cache-cold sends and receives);
//   2. runs `warmup` untimed iterations, then `iters` timed ones; before each, a barrier;
//   3. times each collective from submit to the return of wait() (steady_clock);
//   4. checks the result of every iteration, and refills the buffers for a later iteration,
//      both outside the timed region;
//   5. takes the maximum over the workers of each iteration's time, and the minimum of the
//      workers' "all iterations correct" flags (two allreduces);
//   6. reports, on rank 0, the median and p90 of the per-iteration maxima and the bandwidths.
// Thread-safety: run from one thread per worker; the Peer's own rules apply.
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>
#include <vector>

#include "kf-bench/lib/method.hpp"
#include "kf/coll/types.hpp"
#include "kf/peer.hpp"

namespace kf::tools::bench {

/// What to measure (kf-bench's command line).
struct BenchOptions {
  CollOp op = CollOp::allreduce;
  std::vector<Algorithm> algorithms{Algorithm::auto_select};
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;  ///< allreduce and reduce-scatter
  int root = 0;                     ///< broadcast and gather
  /// Message bytes per worker (see bandwidth_definition()); ignored for barrier.
  std::vector<std::size_t> sizes;
  std::optional<int> iters;  ///< timed iterations; default_iterations() when empty
  int warmup = 5;
  /// barrier (the steps above) or back-to-back (method.hpp: allreduce only, host memory; a
  /// barrier before each sample, then `calls` in-place allreduces of one warm buffer, timed
  /// together; `iters` and `warmup` count samples).
  Method method = Method::barrier;
  int calls = kDefaultCalls;
  bool json = false;
  /// cuda: the buffers are in device memory (copied from and to the host slots outside the
  /// timed region); standin: host memory standing in for a device (checks the device path
  /// without a GPU).
  std::string device = "cpu";
  /// Host buffers from the heap, or (shared_memory) from kf::SharedMemory, which same-host
  /// peers read in place (kf/shared_memory.hpp).
  bool shared_memory = false;
};

/// Measures every (algorithm, size) of `o` in that order and prints the rows on rank 0 (a
/// header first unless o.json). Every worker of the job must call it with the same options.
/// Returns whether every iteration of every row was correct on every worker.
/// Throws: std::invalid_argument when o.root is not a rank of the job, or back-to-back is asked
/// of another collective than allreduce or of device buffers; kf::Error when a
/// collective fails (a peer lost, a timeout).
bool run_bench(Peer& peer, const BenchOptions& o, std::ostream& out);

/// kf-bench's worker: joins the job described by the KF_* environment (kfrun), runs the
/// benchmark and returns the process exit code: 0 when every row is correct; 1 when a row is
/// not, or on a kf::Error or another runtime failure (a message on `err`); 2 for a setup error
/// (a missing or malformed KF_* variable, a root out of range). Never throws.
int run_worker(const BenchOptions& o, std::ostream& out, std::ostream& err) noexcept;

}  // namespace kf::tools::bench
