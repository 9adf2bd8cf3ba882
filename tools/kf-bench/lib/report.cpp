// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/report.hpp"

#include <cstdio>

#include "kf-bench/lib/stats.hpp"

namespace kf::tools::bench {

namespace {

bool has_reduce_op(CollOp op) { return op == CollOp::allreduce || op == CollOp::reduce_scatter; }
bool has_root(CollOp op) { return op == CollOp::broadcast || op == CollOp::gather; }

}  // namespace

void set_statistics(Row& row, const std::vector<double>& times_us, CollOp op, int workers) {
  row.median_us = quantile(times_us, 0.5);
  row.p90_us = quantile(times_us, 0.9);
  if (row.median_us > 0) {
    const double moved = static_cast<double>(algbw_bytes(op, row.bytes, workers));
    row.algbw_gbps = moved / (row.median_us * 1e-6) / 1e9;
    row.busbw_gbps = row.algbw_gbps * bus_factor(op, workers);
  }
}

std::string_view command_name(CollOp op) noexcept {
  return op == CollOp::reduce_scatter ? "reduce-scatter" : to_string(op);
}

void print_header(std::ostream& out, const RunInfo& info) {
  out << "# kf-bench " << command_name(info.op) << ": np=" << info.workers
      << " dtype=" << to_string(info.dtype);
  if (has_reduce_op(info.op)) out << " op=" << to_string(info.reduce);
  if (has_root(info.op)) out << " root=" << info.root;
  out << " warmup=" << info.warmup << " method=" << to_string(info.method);
  if (info.method == Method::back_to_back) out << " calls=" << info.calls;
  out << "\n";
  if (info.method == Method::back_to_back) {
    out << "# time: per sample (a barrier, then " << info.calls
        << " in-place allreduces of one warm buffer back to back) the slowest worker's time for "
           "them divided by their number; median and p90 over the samples, in us\n";
  } else {
    out << "# time: per iteration (a barrier, then one call on a cache-cold buffer) the slowest "
           "worker's submit-to-wait() time; median and p90 over the iterations, in us\n";
  }
  out << "# " << bandwidth_definition(info.op) << "; GB/s = 1e9 bytes/s (nccl-tests)\n";
  char line[160];
  std::snprintf(line, sizeof line, "# %12s %12s %11s %6s %11s %11s %11s %11s %8s\n", "algo",
                "bytes", "count", "iters", "median_us", "p90_us", "algbw_gbps", "busbw_gbps",
                "correct");
  out << line << std::flush;
}

void print_transport(std::ostream& out, const TransportStats& s) {
  out << "# rank 0 sent: tcp " << s.tcp_bytes << " B, same-host socket " << s.socket_bytes
      << " B, shared-memory ring " << s.shm_bytes << " B, single copy " << s.single_copy_bytes
      << " B; received before the receive was posted: " << s.early_bytes
      << " B; read in place from peers' shared memory: " << s.shared_read_bytes << " B\n"
      << std::flush;
}

void print_row(std::ostream& out, const RunInfo& info, const Row& row, bool json) {
  if (json) {
    out << to_json(info, row).dump() << std::endl;
    return;
  }
  char line[200];
  std::snprintf(line, sizeof line, "  %12s %12zu %11zu %6d %11.2f %11.2f %11.3f %11.3f %8s\n",
                row.algo.c_str(), row.bytes, row.count, row.iters, row.median_us, row.p90_us,
                row.algbw_gbps, row.busbw_gbps, row.correct ? "true" : "FALSE");
  out << line << std::flush;
}

nlohmann::ordered_json to_json(const RunInfo& info, const Row& row) {
  nlohmann::ordered_json j;
  j["op"] = command_name(info.op);
  j["algo"] = row.algo;
  j["np"] = info.workers;
  j["dtype"] = to_string(info.dtype);
  if (has_reduce_op(info.op)) j["reduce_op"] = to_string(info.reduce);
  if (has_root(info.op)) j["root"] = info.root;
  j["bytes"] = row.bytes;
  j["count"] = row.count;
  j["iters"] = row.iters;
  j["median_us"] = row.median_us;
  j["p90_us"] = row.p90_us;
  j["algbw_gbps"] = row.algbw_gbps;
  j["busbw_gbps"] = row.busbw_gbps;
  j["correct"] = row.correct;
  j["method"] = to_string(info.method);
  if (info.method == Method::back_to_back) j["calls"] = info.calls;
  return j;
}

}  // namespace kf::tools::bench
