// SPDX-License-Identifier: Apache-2.0
// kf-bench's arithmetic: quantiles of the per-iteration times, the bandwidth definitions of
// nccl-tests (src/*.cu, *GetBw) and the default iteration counts. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kf/coll/types.hpp"

namespace kf::tools::bench {

/// The q-quantile (0 <= q <= 1) of `values`, interpolating linearly between the two nearest
/// ranks (numpy's default); 0 for no values.
double quantile(std::vector<double> values, double q);

/// The bytes that algbw divides by, for a message of `bytes` per worker (nccl-tests): the total
/// over the workers for allgather, reduce-scatter and gather, the message itself otherwise.
std::size_t algbw_bytes(CollOp op, std::size_t bytes, int workers) noexcept;

/// busbw / algbw (nccl-tests): 2(n-1)/n for allreduce; (n-1)/n for allgather, reduce-scatter
/// and gather; 1 for broadcast; 0 for barrier (no bandwidth).
double bus_factor(CollOp op, int workers) noexcept;

/// One line stating what bytes, algbw and busbw mean for `op`, for --help and the table header.
std::string bandwidth_definition(CollOp op);

/// Timed iterations when --iters is not given: 2000 up to 4 KiB, 500 up to 64 KiB, 50 up to
/// 1 MiB, 20 up to 16 MiB, 10 above.
int default_iterations(std::size_t bytes) noexcept;

}  // namespace kf::tools::bench
