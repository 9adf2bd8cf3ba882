// SPDX-License-Identifier: Apache-2.0
// kf-bench-gloo: Gloo's CPU allreduce algorithms (f32, sum) over its TCP transport on
// 127.0.0.1, measured exactly as kf-bench measures kf's allreduce
// (tools/kf-bench/lib/runner.hpp), so that the rows can be compared. One process per rank:
//   kf-bench-gloo --rank R --size N --store DIR --algo ring|ring_chunked|halving_doubling
//                 [--sizes S,S,...] [--iters K] [--warmup W] [--json]
//                 [--method barrier|back-to-back] [--calls K]
// The ranks meet through files in DIR (gloo's FileStore), which must be empty: keys left by an
// earlier run would point the ranks at dead addresses. For example, with N = 4:
//   d=$(mktemp -d); for r in 0 1 2 3; do
//     kf-bench-gloo --rank $r --size 4 --store $d --algo ring --json & done; wait; rm -r $d
// Gloo's algorithms work in place, so there is no separate receive buffer to poison. A Gloo
// algorithm object is bound to its buffer when constructed, so each size builds one object per
// rotated buffer (see kf-bench's runner) before the first iteration, and each iteration calls
// run() on the object of its buffer. back-to-back (kf-bench/lib/method.hpp): one object on one
// warm buffer, run --calls times per sample.
// Exit codes: 0 when every row is correct; 1 when one is not or Gloo fails; 2 for a usage error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kf-bench/lib/cli_check.hpp"
#include "kf-bench/lib/method.hpp"
#include "kf-bench/lib/parse.hpp"
#include "kf-bench/lib/pattern.hpp"
#include "kf-bench/lib/report.hpp"
#include "kf-bench/lib/slots.hpp"
#include "kf-bench/lib/stats.hpp"

namespace {

namespace bench = kf::tools::bench;
using Clock = std::chrono::steady_clock;

constexpr int kIncorrect = 1;
constexpr int kUsageError = 2;
constexpr int kMaxRanks = 4096;
struct Options {
  int rank = 0;
  int size = 1;
  std::string store;
  std::string algo = "ring";
  std::vector<std::string> sizes{"4", "1K", "64K", "1M", "16M", "64M"};
  std::optional<int> iters;
  int warmup = 5;
  std::string method = "barrier";
  int calls = bench::kDefaultCalls;
  bool json = false;
};

std::unique_ptr<gloo::Algorithm> make_allreduce(const Options& o,
                                                const std::shared_ptr<gloo::Context>& context,
                                                float* data, int count) {
  const std::vector<float*> ptrs{data};
  if (o.algo == "ring_chunked") {
    return std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
  }
  if (o.algo == "halving_doubling") {
    return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
  }
  return std::make_unique<gloo::AllreduceRing<float>>(context, ptrs, count);
}

// `times_us` holds the timed samples and one element more: takes the maximum of each over the
// ranks and whether every rank was `correct`, and fills the row's statistics.
void finish(bench::Row& row, std::vector<double>& times_us, bool correct,
            const std::shared_ptr<gloo::Context>& context, int workers) {
  times_us.back() = correct ? 0.0 : 1.0;
  gloo::AllreduceRing<double>(context, {times_us.data()}, static_cast<int>(times_us.size()),
                              gloo::ReductionFunction<double>::max)
      .run();
  row.correct = times_us.back() == 0.0;
  times_us.pop_back();
  bench::set_statistics(row, times_us, kf::CollOp::allreduce, workers);
}

// Measures one message size; every rank calls it with the same arguments.
// Throws: gloo::Exception (a std::runtime_error) when a transfer fails; std::bad_alloc.
bench::Row run_size(const Options& o, const std::shared_ptr<gloo::Context>& context,
                    gloo::BarrierAllToOne& barrier, const bench::Pattern& pattern,
                    std::size_t bytes) {
  bench::Row row;
  row.algo = "gloo-" + o.algo;
  row.count = bench::element_count(bytes, kf::DType::f32);
  row.bytes = row.count * sizeof(float);
  row.iters = o.iters.value_or(bench::default_iterations(row.bytes));
  const int total = o.warmup + row.iters;

  // Gloo works in place: one buffer per slot.
  const bench::Slots slots(row.bytes, 0, total);
  const std::size_t rotation = slots.count();
  const auto data = [&](std::uint64_t i) { return reinterpret_cast<float*>(slots.send(i)); };
  std::vector<std::unique_ptr<gloo::Algorithm>> allreduce;
  for (std::size_t s = 0; s < rotation; ++s) {
    allreduce.push_back(make_allreduce(o, context, data(s), static_cast<int>(row.count)));
  }
  // Each object allocates its scratch buffers when constructed and first touches them in run().
  // A gloo user pays those page faults once per buffer, not per call, so each object runs once
  // here (on garbage; the fill below overwrites it): otherwise, when there are as many objects
  // as iterations, every timed call would include them.
  for (const auto& a : allreduce) a->run();
  for (std::size_t s = 0; s < rotation && s < static_cast<std::size_t>(total); ++s) {
    pattern.fill(data(s), row.count, o.rank, 0, s);
  }

  // One extra element after the times: 1 where this rank saw a wrong result, so that a single
  // max allreduce yields both the per-iteration maxima and whether any rank failed.
  std::vector<double> times_us(static_cast<std::size_t>(row.iters) + 1, 0.0);
  bool correct = true;
  for (int t = 0; t < total; ++t) {
    const auto iter = static_cast<std::uint64_t>(t);
    barrier.run();
    const auto start = Clock::now();
    allreduce[iter % rotation]->run();
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    // Warmup results are checked too: a wrong result is a bug whenever it happens.
    correct = pattern.matches_reduced(data(iter), row.count, 0, iter) && correct;
    if (t >= o.warmup) times_us[static_cast<std::size_t>(t - o.warmup)] = elapsed.count();
    if (iter + rotation < static_cast<std::uint64_t>(total)) {
      pattern.fill(data(iter), row.count, o.rank, 0, iter + rotation);
    }
  }
  finish(row, times_us, correct, context, o.size);
  return row;
}

// back-to-back: a barrier, then o.calls runs of one algorithm object on one warm buffer.
bench::Row run_size_back_to_back(const Options& o, const std::shared_ptr<gloo::Context>& context,
                                 gloo::BarrierAllToOne& barrier, std::size_t bytes) {
  bench::Row row;
  row.algo = "gloo-" + o.algo;
  row.count = bench::element_count(bytes, kf::DType::f32);
  row.bytes = row.count * sizeof(float);
  row.iters = o.iters.value_or(bench::default_iterations(row.bytes));
  std::vector<float> data(std::max<std::size_t>(row.count, 1));
  const auto allreduce = make_allreduce(o, context, data.data(), static_cast<int>(row.count));
  allreduce->run();  // its scratch buffers' page faults, once (see run_size)
  std::vector<double> times_us(static_cast<std::size_t>(row.iters) + 1, 0.0);
  bool correct = true;
  for (int t = 0; t < o.warmup + row.iters; ++t) {
    bench::fill_back_to_back(data.data(), row.count, o.rank);
    barrier.run();
    const auto start = Clock::now();
    for (int c = 0; c < o.calls; ++c) allreduce->run();
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    correct = bench::matches_back_to_back(data.data(), row.count, o.size, o.calls) && correct;
    if (t >= o.warmup) times_us[static_cast<std::size_t>(t - o.warmup)] = elapsed.count() / o.calls;
  }
  finish(row, times_us, correct, context, o.size);
  return row;
}

// Connects the ranks, runs every size and prints the rows on rank 0. Returns whether every row
// was correct. Throws: gloo::Exception when the rendezvous or a transfer fails.
bool run(const Options& o) {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(o.store);
  const auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  context->connectFullMesh(store, device);

  const bench::Method method = *bench::parse_method(o.method);
  const bench::RunInfo info{kf::CollOp::allreduce,
                            o.size,
                            kf::DType::f32,
                            kf::ReduceOp::sum,
                            0,
                            o.warmup,
                            method,
                            o.calls};
  if (o.rank == 0 && !o.json) {
    std::cout << "# kf-bench-gloo: gloo allreduce " << o.algo << " over tcp on 127.0.0.1\n";
    bench::print_header(std::cout, info);
  }
  gloo::BarrierAllToOne barrier(context);
  const bench::Pattern pattern(kf::DType::f32, kf::ReduceOp::sum, o.size);
  bool all_correct = true;
  for (const std::string& s : o.sizes) {
    const std::size_t bytes = bench::parse_bytes(s);
    const bench::Row row = method == bench::Method::back_to_back
                               ? run_size_back_to_back(o, context, barrier, bytes)
                               : run_size(o, context, barrier, pattern, bytes);
    if (o.rank == 0) bench::print_row(std::cout, info, row, o.json);
    all_correct = all_correct && row.correct;
  }
  return all_correct;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Measures Gloo's allreduce (f32, sum, tcp on 127.0.0.1) the way kf-bench "
      "measures kf's allreduce. Start one process per rank.",
      "kf-bench-gloo"};
  Options o;
  const CLI::Validator size_check = bench::float_size_check();
  CLI::Option* rank = app.add_option("--rank", o.rank, "this process's rank, 0 to --size - 1")
                          ->required()
                          ->check(CLI::Range(0, kMaxRanks - 1));
  app.add_option("--size", o.size, "number of ranks")->required()->check(CLI::Range(1, kMaxRanks));
  app.add_option("--store", o.store, "an empty directory shared by the ranks (rendezvous)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--algo", o.algo, "ring, ring_chunked or halving_doubling")
      ->check(CLI::IsMember({"ring", "ring_chunked", "halving_doubling"}))
      ->capture_default_str();
  app.add_option("--sizes", o.sizes,
                 "message bytes per rank, comma-separated, suffixes K, M, G (powers of 1024), "
                 "rounded down to whole floats (at least one)")
      ->delimiter(',')
      ->check(size_check)
      ->capture_default_str();
  app.add_option("--iters", o.iters,
                 "timed iterations per size (default: 2000 up to 4K, 500 up to 64K, 50 up to "
                 "1M, 20 up to 16M, 10 above)")
      ->check(CLI::Range(1, bench::kMaxIterations));
  app.add_option("--warmup", o.warmup, "untimed iterations before each size")
      ->check(CLI::Range(0, bench::kMaxIterations))
      ->capture_default_str();
  app.add_option("--method", o.method,
                 "barrier (a barrier before each call, rotated buffers) or back-to-back "
                 "(--calls calls on one warm buffer per sample)")
      ->check(CLI::IsMember({"barrier", "back-to-back"}))
      ->capture_default_str();
  app.add_option("--calls", o.calls, "back-to-back: calls per sample")
      ->check(CLI::Range(1, bench::kMaxCalls))
      ->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON object per size instead of a table");

  try {
    app.parse(argc, argv);
    if (o.rank >= o.size) {
      throw CLI::ValidationError(
          rank->get_name(),
          std::to_string(o.rank) + " is not below --size " + std::to_string(o.size));
    }
    if (o.method == "back-to-back") {
      if (std::string why = bench::check_back_to_back_calls(o.calls, o.size); !why.empty()) {
        throw CLI::ValidationError(std::move(why));
      }
    }
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kUsageError;
  }

  try {
    return run(o) ? 0 : kIncorrect;
  } catch (const std::exception& e) {
    std::cerr << "kf-bench-gloo: rank " << o.rank << ": " << e.what() << std::endl;
    return kIncorrect;
  }
}
