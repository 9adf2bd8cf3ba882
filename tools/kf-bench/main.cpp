// SPDX-License-Identifier: Apache-2.0
// kf-bench: measures kf's collectives across the workers of a job started by kfrun:
//   kfrun -np N kf-bench allreduce|broadcast|allgather|reduce-scatter|gather|barrier
//         [--algo A[,A...]|all] [--dtype T] [--sizes S,S,...] [--op R] [--root R]
//         [--iters K] [--warmup W] [--json] [--device cpu|cuda|standin] [--memory heap|shared]
//         [--method barrier|back-to-back] [--calls K]   (allreduce only)
// or compares kf's allreduce with OpenMPI's and Gloo's, starting the jobs itself
// (lib/compare.hpp):
//   kf-bench compare [--impl I,...] [--np N,...] [--sizes S,...] [--rounds K] [--iters K]
//         [--warmup W] [--out DIR] [--timeout-s T] [--against BUILD_DIR]
//         [--method barrier,back-to-back] [--calls K]
// or measures kf's allreduce on device buffers against raw NCCL (lib/nccl_baseline.hpp):
//   kfrun -np N kf-bench nccl-baseline [--sizes S,...] [--iters K] [--rounds R] [--shrink]
// Exit codes: 0 when every row is correct; 1 when one is not or a collective (compare: a run)
// fails; 2 for a usage error.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "kf-bench/lib/cli_check.hpp"
#include "kf-bench/lib/compare_cli.hpp"
#include "kf-bench/lib/nccl_baseline.hpp"
#include "kf-bench/lib/parse.hpp"
#include "kf-bench/lib/report.hpp"
#include "kf-bench/lib/runner.hpp"
#include "kf-bench/lib/stats.hpp"

namespace {

using kf::CollOp;
namespace bench = kf::tools::bench;

constexpr int kUsageError = 2;
using bench::checked_by;
using bench::kMaxIterations;

const char* const kTiming =
    "Per iteration: a barrier, then each worker times the collective from submit to the return "
    "of wait(); the row's median_us and p90_us are over the iterations' maxima across workers. "
    "Every iteration's result is checked on every worker; 'correct' is true only if all were.";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures kf's collectives between the workers of a job (run it under kfrun).",
               "kf-bench"};
  app.require_subcommand(1);
  app.footer(std::string(kTiming) + "\nBandwidth (nccl-tests; GB/s = 1e9 bytes/s):\n  " +
             bench::bandwidth_definition(CollOp::allreduce) + "\n  " +
             bench::bandwidth_definition(CollOp::broadcast) + "\n  " +
             bench::bandwidth_definition(CollOp::allgather) + "\n  " +
             bench::bandwidth_definition(CollOp::reduce_scatter) + "\n  " +
             bench::bandwidth_definition(CollOp::gather) +
             "\nExit code: 0 when every row is correct, 1 when one is not or a collective fails, "
             "2 for a usage error.");

  bench::BenchOptions options;
  std::vector<std::string> algos{"auto"};
  std::string dtype = "f32";
  std::string reduce = "sum";
  std::vector<std::string> sizes{"4", "1K", "64K", "1M", "16M", "64M"};
  std::string method = "barrier";
  std::string memory = "heap";

  const auto algo_check = checked_by(
      [](const std::string& s) { return !bench::parse_algorithms(s).empty(); }, "an algorithm");
  const auto dtype_check =
      checked_by([](const std::string& s) { return kf::parse_dtype(s).has_value(); },
                 "a dtype (f32, f64, f16, bf16, i32, i64, u8)");
  const auto reduce_check =
      checked_by([](const std::string& s) { return kf::parse_reduce_op(s).has_value(); },
                 "a reduction (sum, min, max, prod, avg)");
  const auto size_check =
      checked_by([](const std::string& s) { return bench::parse_bytes(s) > 0; }, "a size");

  for (const CollOp op : {CollOp::allreduce, CollOp::broadcast, CollOp::allgather,
                          CollOp::reduce_scatter, CollOp::gather, CollOp::barrier}) {
    const std::string name(bench::command_name(op));
    CLI::App* sub = app.add_subcommand(name, "measure " + name);
    sub->footer(std::string(kTiming) + "\n" + bench::bandwidth_definition(op) +
                " (GB/s = 1e9 bytes/s, nccl-tests)");
    sub->final_callback([&options, op] { options.op = op; });
    sub->add_option(
           "--algo", algos,
           "star, ring, tree, clique, rhd, hierarchical, auto, or all (= every one, auto last); "
           "a comma-separated list is measured in order")
        ->delimiter(',')
        ->check(algo_check)
        ->capture_default_str();
    sub->add_option("--dtype", dtype, "element type: f32, f64, f16, bf16, i32, i64, u8")
        ->check(dtype_check)
        ->capture_default_str();
    sub->add_option("--sizes", sizes,
                    "message bytes per worker, comma-separated, suffixes K, M, G (powers of "
                    "1024), rounded down to whole elements (at least one). The message is the "
                    "buffer (allreduce, broadcast), each worker's send block (allgather, "
                    "gather) or each worker's result block (reduce-scatter); barrier ignores it")
        ->delimiter(',')
        ->check(size_check)
        ->capture_default_str();
    if (op == CollOp::allreduce || op == CollOp::reduce_scatter) {
      sub->add_option("--op", reduce, "reduction: sum, min, max, prod, avg")
          ->check(reduce_check)
          ->capture_default_str();
    }
    if (op == CollOp::allreduce) {
      sub->add_option("--method", method,
                      "barrier (a barrier before each call on a cache-cold buffer) or "
                      "back-to-back (a barrier before each sample, then --calls in-place "
                      "allreduces of one warm buffer timed together, as training issues them; "
                      "f32 sum on host memory only; --iters and --warmup then count samples)")
          ->check(CLI::IsMember({"barrier", "back-to-back"}))
          ->capture_default_str();
      sub->add_option("--calls", options.calls,
                      "back-to-back: allreduces per sample (each multiplies the values by the "
                      "worker count: at most 128 with 2 workers, 64 with 4)")
          ->check(CLI::Range(1, bench::kMaxCalls))
          ->capture_default_str();
    }
    if (op == CollOp::broadcast || op == CollOp::gather) {
      sub->add_option("--root", options.root, "root rank")
          ->check(CLI::NonNegativeNumber)
          ->capture_default_str();
    }
    if (op != CollOp::barrier) {
      sub->add_option("--memory", memory,
                      "where host buffers live: heap, or shared (kf::SharedMemory, which "
                      "same-host peers read in place instead of copying it out first)")
          ->check(CLI::IsMember({"heap", "shared"}))
          ->capture_default_str();
    }
    sub->add_option("--iters", options.iters,
                    "timed iterations per row (default: 2000 up to 4K, 500 up to 64K, 50 up to "
                    "1M, 20 up to 16M, 10 above)")
        ->check(CLI::Range(1, kMaxIterations));
    sub->add_option("--warmup", options.warmup, "untimed iterations before each row")
        ->check(CLI::Range(0, kMaxIterations))
        ->capture_default_str();
    sub->add_flag("--json", options.json, "print one JSON object per row instead of a table");
    sub->add_option("--device", options.device,
                    "where the buffers are: cpu, cuda (the backend is KF_DEVICE_BACKEND's: "
                    "nccl or staging), or standin (host memory standing in for a device)")
        ->check(CLI::IsMember({"cpu", "cuda", "standin"}))
        ->capture_default_str();
  }

  bench::CompareCommand compare;
  bench::add_compare_command(app, compare);

  // Several workers on one GPU (tests, benchmarks): NCCL refuses two ranks of one host on one
  // device, so each worker gives NCCL a host id of its own.
  bool one_gpu = false;
  app.add_flag("--one-gpu", one_gpu,
               "the workers share one GPU: each sets NCCL_HOSTID to its own address, so that "
               "NCCL takes them for separate hosts (set NCCL_SOCKET_IFNAME=lo as well)");

  bench::BaselineOptions baseline;
  std::vector<std::string> baseline_sizes{"4", "64K", "1M", "16M", "64M"};
  CLI::App* nccl = app.add_subcommand(
      "nccl-baseline",
      "kf's allreduce on device buffers (NCCL backend) against raw ncclAllReduce, in one run");
  nccl->add_option("--sizes", baseline_sizes, "message bytes per worker (f32)")
      ->delimiter(',')
      ->check(size_check)
      ->capture_default_str();
  nccl->add_option("--iters", baseline.iters, "timed iterations per block")
      ->check(CLI::Range(1, kMaxIterations))
      ->capture_default_str();
  nccl->add_option("--rounds", baseline.rounds, "blocks of raw and of kf iterations per size")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  nccl->add_option("--warmup", baseline.warmup, "untimed iterations of each per size")
      ->check(CLI::Range(0, kMaxIterations))
      ->capture_default_str();
  nccl->add_flag("--shrink", baseline.shrink,
                 "then the last worker leaves (3 or more workers): time the survivors' first "
                 "allreduce after the shrink");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  if (one_gpu) {
    if (const char* self = std::getenv("KF_SELF")) {
      setenv("NCCL_HOSTID", (std::string("kf-") + self).c_str(), 1);
    }
  }
  if (app.got_subcommand("nccl-baseline")) {
    for (const std::string& s : baseline_sizes) baseline.sizes.push_back(bench::parse_bytes(s));
    return bench::run_nccl_baseline(baseline, std::cout, std::cerr);
  }
  if (app.got_subcommand("compare")) {
    return bench::run_compare(bench::compare_options(compare), std::cout, std::cerr);
  }
  options.algorithms.clear();
  for (const std::string& a : algos) {
    for (const kf::Algorithm x : bench::parse_algorithms(a)) options.algorithms.push_back(x);
  }
  options.method = *bench::parse_method(method);
  options.shared_memory = memory == "shared";
  options.dtype = *kf::parse_dtype(dtype);
  options.reduce = *kf::parse_reduce_op(reduce);
  for (const std::string& s : sizes) options.sizes.push_back(bench::parse_bytes(s));
  return bench::run_worker(options, std::cout, std::cerr);
}
