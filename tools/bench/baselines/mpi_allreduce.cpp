// SPDX-License-Identifier: Apache-2.0
// kf-bench-mpi: OpenMPI's MPI_Allreduce (f32, MPI_SUM) measured exactly as kf-bench measures
// kf's allreduce (tools/kf-bench/lib/runner.hpp), so that the rows can be compared:
//   mpirun ... kf-bench-mpi [--sizes S,S,...] [--iters K] [--warmup W] [--label NAME] [--json]
//                           [--method barrier|back-to-back] [--calls K]
// barrier (the default): out of place (separate send and receive buffers), like kf-bench's;
// MPI_IN_PLACE would let MPI skip a copy that kf cannot. back-to-back (kf-bench/lib/method.hpp):
// --calls MPI_Allreduce(MPI_IN_PLACE) on one warm buffer per sample, as kf-bench does then.
//
// Command lines that work as root on one host (Debian 12, OpenMPI 4.1.4, 2 cores). Debian's
// /etc/openmpi/openmpi-mca-params.conf already excludes the openib, ofi and UCX components and
// silences the warnings about unused ones; --mca pml ob1 keeps UCX out where that file differs.
// --allow-run-as-root (or OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1) is needed
// as root. Add --oversubscribe only when np exceeds the cores: it also makes idle ranks yield
// the CPU, which costs latency when they need not.
//   common="--allow-run-as-root --bind-to none --mca pml ob1"
// TCP over loopback only (the ob1 PML over the tcp BTL; self for a rank's messages to itself):
//   mpirun $common -np 2 --mca btl tcp,self --mca btl_tcp_if_include lo
//       kf-bench-mpi --label mpi-tcp --sizes 4,4K,64K,1M,16M,64M --json
// Shared memory (the vader BTL; its CMA single copy works here as root; where ptrace is
// forbidden, as in Docker without CAP_SYS_PTRACE, add btl_vader_single_copy_mechanism none):
//   mpirun $common -np 2 --mca btl vader,self kf-bench-mpi --label mpi-shm ...
// np = 4 on 2 cores: the same with --oversubscribe -np 4.
// From 32 MiB up, MPI_Allreduce mallocs a temporary buffer that glibc maps and unmaps on every
// call, and the page faults dominate (0.2 GB/s instead of 1.5 over TCP). To measure MPI without
// them, keep freed memory in the heap:
//   mpirun ... -x MALLOC_MMAP_THRESHOLD_=1073741824 -x MALLOC_TRIM_THRESHOLD_=4294967296 ...
// Exit codes: 0 when every row is correct; 1 when one is not or MPI fails; 2 for a usage error.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
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
struct Options {
  std::vector<std::string> sizes{"4", "1K", "64K", "1M", "16M", "64M"};
  std::optional<int> iters;
  int warmup = 5;
  std::string label = "mpi";
  std::string method = "barrier";
  int calls = bench::kDefaultCalls;
  bool json = false;
};

// MPI reports errors as codes (MPI_ERRORS_RETURN is set on the communicator); turn them into
// exceptions that name the call.
void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(call) + ": " + std::string(text, length));
}

// `times_us` holds the timed samples and one element more: takes the maximum of each over the
// ranks and whether every rank was `correct`, and fills the row's statistics.
void finish(bench::Row& row, std::vector<double>& times_us, bool correct, int workers) {
  times_us.back() = correct ? 0.0 : 1.0;
  check(MPI_Allreduce(MPI_IN_PLACE, times_us.data(), static_cast<int>(times_us.size()), MPI_DOUBLE,
                      MPI_MAX, MPI_COMM_WORLD),
        "MPI_Allreduce(max)");
  row.correct = times_us.back() == 0.0;
  times_us.pop_back();
  bench::set_statistics(row, times_us, kf::CollOp::allreduce, workers);
}

// Measures one message size; every rank calls it with the same arguments.
// Throws: std::runtime_error when an MPI call fails; std::bad_alloc.
bench::Row run_size(const Options& o, const bench::Pattern& pattern, int rank, int workers,
                    std::size_t bytes) {
  bench::Row row;
  row.algo = o.label;
  row.count = bench::element_count(bytes, kf::DType::f32);
  row.bytes = row.count * sizeof(float);
  row.iters = o.iters.value_or(bench::default_iterations(row.bytes));
  const int total = o.warmup + row.iters;
  const auto count = static_cast<int>(row.count);

  const bench::Slots slots(row.bytes, row.bytes, total);
  const std::size_t rotation = slots.count();
  const auto send = [&](std::uint64_t i) { return slots.send(i); };
  const auto recv = [&](std::uint64_t i) { return slots.recv(i); };
  const auto prepare = [&](std::uint64_t i, std::uint64_t iter) {
    pattern.fill(send(i), row.count, rank, 0, iter);
    pattern.poison(recv(i), row.count);
  };
  for (std::size_t s = 0; s < rotation && s < static_cast<std::size_t>(total); ++s) prepare(s, s);

  // One extra element after the times: 1 where this rank saw a wrong result, so that a single
  // MAX allreduce yields both the per-iteration maxima and whether any rank failed.
  std::vector<double> times_us(static_cast<std::size_t>(row.iters) + 1, 0.0);
  bool correct = true;
  for (int t = 0; t < total; ++t) {
    const auto iter = static_cast<std::uint64_t>(t);
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto start = Clock::now();
    const int code =
        MPI_Allreduce(send(iter), recv(iter), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    check(code, "MPI_Allreduce");
    // Warmup results are checked too: a wrong result is a bug whenever it happens.
    correct = pattern.matches_reduced(recv(iter), row.count, 0, iter) && correct;
    if (t >= o.warmup) times_us[static_cast<std::size_t>(t - o.warmup)] = elapsed.count();
    if (iter + rotation < static_cast<std::uint64_t>(total)) prepare(iter, iter + rotation);
  }
  finish(row, times_us, correct, workers);
  return row;
}

// back-to-back: a barrier, then o.calls in-place allreduces of one warm buffer, timed together.
bench::Row run_size_back_to_back(const Options& o, int rank, int workers, std::size_t bytes) {
  bench::Row row;
  row.algo = o.label;
  row.count = bench::element_count(bytes, kf::DType::f32);
  row.bytes = row.count * sizeof(float);
  row.iters = o.iters.value_or(bench::default_iterations(row.bytes));
  const auto count = static_cast<int>(row.count);
  std::vector<float> data(std::max<std::size_t>(row.count, 1));
  std::vector<double> times_us(static_cast<std::size_t>(row.iters) + 1, 0.0);
  bool correct = true;
  for (int t = 0; t < o.warmup + row.iters; ++t) {
    bench::fill_back_to_back(data.data(), row.count, rank);
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto start = Clock::now();
    for (int c = 0; c < o.calls; ++c) {
      check(MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
    }
    const std::chrono::duration<double, std::micro> elapsed = Clock::now() - start;
    correct = bench::matches_back_to_back(data.data(), row.count, workers, o.calls) && correct;
    if (t >= o.warmup) times_us[static_cast<std::size_t>(t - o.warmup)] = elapsed.count() / o.calls;
  }
  finish(row, times_us, correct, workers);
  return row;
}

// Runs every size and prints the rows on rank 0. Returns whether every row was correct.
bool run(const Options& o, int rank, int workers) {
  check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  const bench::Method method = *bench::parse_method(o.method);
  const bench::RunInfo info{kf::CollOp::allreduce,
                            workers,
                            kf::DType::f32,
                            kf::ReduceOp::sum,
                            0,
                            o.warmup,
                            method,
                            o.calls};
  if (rank == 0 && !o.json) {
    std::cout << "# kf-bench-mpi: MPI_Allreduce, label " << o.label << "\n";
    bench::print_header(std::cout, info);
  }
  const bench::Pattern pattern(kf::DType::f32, kf::ReduceOp::sum, workers);
  bool all_correct = true;
  for (const std::string& s : o.sizes) {
    const std::size_t bytes = bench::parse_bytes(s);
    const bench::Row row = method == bench::Method::back_to_back
                               ? run_size_back_to_back(o, rank, workers, bytes)
                               : run_size(o, pattern, rank, workers, bytes);
    if (rank == 0) bench::print_row(std::cout, info, row, o.json);
    all_correct = all_correct && row.correct;
  }
  return all_correct;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI_Init first: every rank parses the same command line, and only rank 0 prints.
  MPI_Init(&argc, &argv);
  int rank = 0;
  int workers = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &workers);

  CLI::App app{
      "Measures MPI_Allreduce (f32, sum) the way kf-bench measures kf's allreduce. "
      "Run it under mpirun.",
      "kf-bench-mpi"};
  Options o;
  const CLI::Validator size_check = bench::float_size_check();
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
  app.add_option("--label", o.label, "the rows' algo field, e.g. mpi-tcp or mpi-shm")
      ->capture_default_str();
  app.add_option("--method", o.method,
                 "barrier (out of place, a barrier before each call) or back-to-back (--calls "
                 "in-place calls on one warm buffer per sample)")
      ->check(CLI::IsMember({"barrier", "back-to-back"}))
      ->capture_default_str();
  app.add_option("--calls", o.calls, "back-to-back: calls per sample")
      ->check(CLI::Range(1, bench::kMaxCalls))
      ->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON object per size instead of a table");

  int code = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help goes to stdout and a usage error to stderr, once for the job.
    if (rank == 0) code = app.exit(e);
    if (e.get_exit_code() != 0) code = kUsageError;
    MPI_Finalize();
    return code;
  }

  if (o.method == "back-to-back") {
    if (const std::string why = bench::check_back_to_back_calls(o.calls, workers); !why.empty()) {
      if (rank == 0) std::cerr << "kf-bench-mpi: " << why << std::endl;
      MPI_Finalize();
      return kUsageError;
    }
  }

  try {
    code = run(o, rank, workers) ? 0 : kIncorrect;
  } catch (const std::exception& e) {
    std::cerr << "kf-bench-mpi: rank " << rank << ": " << e.what() << std::endl;
    // The other ranks may be blocked in a collective that will never complete.
    MPI_Abort(MPI_COMM_WORLD, kIncorrect);
    return kIncorrect;
  }
  MPI_Finalize();
  return code;
}
