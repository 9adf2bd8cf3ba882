// SPDX-License-Identifier: Apache-2.0
// kf-bench's output: a table (a commented header, then one row per algorithm and size) or one
// JSON object per row. Thread-safety: pure functions over the stream they are given.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kf-bench/lib/method.hpp"
#include "kf/coll/types.hpp"
#include "kf/peer.hpp"

namespace kf::tools::bench {

/// What a table or a row describes, the same for every row of one run.
struct RunInfo {
  CollOp op = CollOp::allreduce;
  int workers = 1;
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;  ///< shown for allreduce and reduce-scatter only
  int root = 0;                     ///< shown for broadcast and gather only
  int warmup = 0;
  Method method = Method::barrier;  ///< how each row was timed (method.hpp)
  int calls = 1;                    ///< back-to-back: allreduces per sample
};

/// One (algorithm, size) measurement. Times are the per-iteration maxima over the workers.
struct Row {
  std::string algo;       ///< "ring", or "auto(ring)" for auto and what it resolved to
  std::size_t bytes = 0;  ///< message bytes per worker, after rounding to whole elements
  std::size_t count = 0;  ///< elements per worker
  int iters = 0;
  double median_us = 0;
  double p90_us = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  bool correct = false;
};

/// Fills `row`'s median_us and p90_us from `times_us` (each a sample's maximum over the workers)
/// and its algbw and busbw from the median, for `op` over `workers`.
void set_statistics(Row& row, const std::vector<double>& times_us, CollOp op, int workers);

/// The name of `op` on the command line ("reduce-scatter").
std::string_view command_name(CollOp op) noexcept;

/// The table's header: the run's parameters, how to read the numbers, the column names.
void print_header(std::ostream& out, const RunInfo& info);
/// One table line (json false) or one JSON object on one line (json true), then a flush.
void print_row(std::ostream& out, const RunInfo& info, const Row& row, bool json);
/// A comment line with the bytes this worker moved by each path over the whole run, warm-up
/// included: where a transfer went, and how much arrived before its receive was posted.
void print_transport(std::ostream& out, const TransportStats& s);
/// The JSON object of one row: op, algo, np, dtype, bytes, count, iters, median_us, p90_us,
/// algbw_gbps, busbw_gbps, correct, method, and reduce_op or root where the collective has
/// one, calls for back-to-back (iters then counts samples, and the times are per call).
nlohmann::ordered_json to_json(const RunInfo& info, const Row& row);

}  // namespace kf::tools::bench
