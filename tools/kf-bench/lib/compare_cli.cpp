// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/compare_cli.hpp"

#include <algorithm>

#include "kf-bench/lib/cli_check.hpp"
#include "kf-bench/lib/compare_builds.hpp"
#include "kf-bench/lib/parse.hpp"

namespace kf::tools::bench {

namespace {

// More processes than this on one host measure the scheduler rather than the collective.
constexpr int kMaxProcesses = 64;
constexpr int kMaxRounds = 1000;
constexpr int kMaxTimeoutS = 24 * 3600;

}  // namespace

CLI::App* add_compare_command(CLI::App& app, CompareCommand& command) {
  CompareOptions& o = command.options;
  CLI::App* sub = app.add_subcommand(
      "compare",
      "run kf's allreduce and baselines (OpenMPI, Gloo) interleaved, round by round, on this "
      "host; print tables; write the raw rows (compare.jsonl) and busbw plots (compare-npN.svg, "
      "compare-back-to-back-npN.svg)");
  sub->footer(
      "Implementations (transport class): kf (local: kf's default, same-host sockets with "
      "large payloads single-copy), kf-shared (local: kf with its buffers in kf::SharedMemory, "
      "which same-host peers read in place; kf-bench --memory shared), kf-unix (local: "
      "KF_TRANSPORT=unix, every payload through "
      "the socket), kf-tcp (tcp: KF_TRANSPORT=tcp), kf-tcp-nomac (tcp: also KF_FRAME_AUTH=off, to "
      "show the frame MACs' cost), mpi-tcp (tcp), mpi-shm (local), gloo-ring, "
      "gloo-ring_chunked, "
      "gloo-halving_doubling (tcp). A baseline whose executables are missing is skipped.\n"
      "With --against DIR, each of kf's implementations chosen also runs from the kf build in "
      "DIR as <impl>@old (kf@old, kf-unix@old, kf-tcp@old), right beside this build's in every "
      "round, which of the two first alternating by round; per np a further table gives, per "
      "size and implementation, new/old of the medians over the rounds, each side's spread (its "
      "slowest per-round median / its fastest), and SLOWER where new/old exceeds 1.05 x the "
      "larger spread.\n"
      "Exit code: 0 when every run completed and every row was correct, 1 otherwise, 2 for a "
      "usage error.");
  std::string names;
  for (const ImplSpec& s : known_impls())
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  sub->add_option("--impl", o.impls, "implementations to run, comma-separated (default: all)")
      ->delimiter(',')
      ->check(checked_by([](const std::string& s) { return find_impl(s) != nullptr; },
                         "an implementation (" + names + ")"));
  sub->add_option("--np", o.nps, "numbers of processes, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(2, kMaxProcesses))
      ->capture_default_str();
  sub->add_option("--sizes", command.sizes,
                  "message bytes per worker, comma-separated, suffixes K, M, G (powers of 1024)")
      ->delimiter(',')
      ->check(checked_by([](const std::string& s) { return parse_bytes(s) > 0; }, "a size"))
      ->capture_default_str();
  sub->add_option("--rounds", o.rounds, "runs of every implementation per np, interleaved")
      ->check(CLI::Range(1, kMaxRounds))
      ->capture_default_str();
  sub->add_option("--iters", o.iters, "timed iterations per size (default: kf-bench's)")
      ->check(CLI::Range(1, kMaxIterations));
  sub->add_option("--warmup", o.warmup, "untimed iterations before each size")
      ->check(CLI::Range(0, kMaxIterations))
      ->capture_default_str();
  sub->add_option("--method", command.methods,
                  "how the runs time the calls, comma-separated, each measured in turn: barrier "
                  "(a barrier before each call, cache-cold buffers), back-to-back (per sample a "
                  "barrier, then --calls in-place calls on one warm buffer)")
      ->delimiter(',')
      ->check(CLI::IsMember({"barrier", "back-to-back"}))
      ->capture_default_str();
  sub->add_option("--calls", o.calls, "back-to-back: calls per sample")
      ->check(CLI::Range(1, kMaxCalls))
      ->capture_default_str();
  sub->add_option("--out", o.out_dir, "output directory (default: a new one under /tmp)");
  sub->add_option("--timeout-s", o.timeout_s,
                  "limit per run in seconds; then its processes are stopped and it fails")
      ->check(CLI::Range(1, kMaxTimeoutS))
      ->capture_default_str();
  sub->add_option("--against", o.against,
                  "another kf build (its build directory, or a directory holding its kfrun and "
                  "kf-bench) whose kf runs beside this one's, as <impl>@old")
      ->check(
          CLI::Validator([](std::string& dir) { return missing_in_build(find_other_build(dir)); },
                         "", "a kf build"))
      ->type_name("DIR");
  // Twins are made of kf's implementations only; with none chosen there is nothing to compare.
  sub->callback([&o] {
    if (!o.against.empty() && !o.impls.empty() &&
        std::none_of(o.impls.begin(), o.impls.end(),
                     [](const std::string& i) { return is_kf(i); })) {
      throw CLI::ValidationError("--against",
                                 "needs one of kf, kf-unix, kf-tcp, kf-tcp-nomac in --impl");
    }
  });
  return sub;
}

CompareOptions compare_options(const CompareCommand& command) {
  CompareOptions o = command.options;
  o.sizes.clear();
  for (const std::string& s : command.sizes) o.sizes.push_back(parse_bytes(s));
  o.methods.clear();
  for (const std::string& m : command.methods) {
    const Method method = *parse_method(m);
    if (std::find(o.methods.begin(), o.methods.end(), method) == o.methods.end()) {
      o.methods.push_back(method);
    }
  }
  return o;
}

}  // namespace kf::tools::bench
