// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/stats.hpp"

#include <algorithm>
#include <cmath>

namespace kf::tools::bench {

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(pos));
  const std::size_t above = std::min(below + 1, values.size() - 1);
  const double frac = pos - static_cast<double>(below);
  return values[below] + (values[above] - values[below]) * frac;
}

std::size_t algbw_bytes(CollOp op, std::size_t bytes, int workers) noexcept {
  switch (op) {
    case CollOp::allgather:
    case CollOp::reduce_scatter:
    case CollOp::gather: return bytes * static_cast<std::size_t>(workers);
    default: return bytes;
  }
}

double bus_factor(CollOp op, int workers) noexcept {
  const double n = workers;
  switch (op) {
    case CollOp::allreduce: return 2.0 * (n - 1) / n;
    case CollOp::allgather:
    case CollOp::reduce_scatter:
    case CollOp::gather: return (n - 1) / n;
    case CollOp::broadcast: return 1.0;
    default: return 0.0;
  }
}

std::string bandwidth_definition(CollOp op) {
  switch (op) {
    case CollOp::allreduce:
      return "allreduce: bytes = the buffer on each worker; algbw = bytes/time; "
             "busbw = algbw*2(n-1)/n";
    case CollOp::broadcast:
      return "broadcast: bytes = the buffer; algbw = bytes/time; busbw = algbw";
    case CollOp::allgather:
      return "allgather: bytes = each worker's send block; algbw = n*bytes/time; "
             "busbw = algbw*(n-1)/n";
    case CollOp::reduce_scatter:
      return "reduce-scatter: bytes = each worker's result block (send = n*bytes); "
             "algbw = n*bytes/time; busbw = algbw*(n-1)/n";
    case CollOp::gather:
      return "gather: bytes = each worker's send block; algbw = n*bytes/time; "
             "busbw = algbw*(n-1)/n";
    case CollOp::barrier: return "barrier: no data; bytes, algbw and busbw are 0";
    default: return std::string(to_string(op));
  }
}

int default_iterations(std::size_t bytes) noexcept {
  constexpr std::size_t kKiB = 1024;
  constexpr std::size_t kMiB = 1024 * kKiB;
  // Small sizes get enough iterations to span several scheduler time slices (3-4 ms): with
  // more workers than cores, 200 iterations of a 5-15 us collective fit in one, and a run's
  // median then shows whichever placement of the processes that slice happened to have.
  if (bytes <= 4 * kKiB) return 2000;
  if (bytes <= 64 * kKiB) return 500;
  if (bytes <= kMiB) return 50;
  if (bytes <= 16 * kMiB) return 20;
  return 10;
}

}  // namespace kf::tools::bench
