// SPDX-License-Identifier: Apache-2.0
// kf-bench compare: kf's allreduce (f32, sum) against baseline implementations (OpenMPI, Gloo)
// on this machine, in one invocation:
//   1. for each np, `rounds` rounds; in each round every implementation runs once, always in the
//      same order (A B C A B C …), so that drift of the machine (other load, clock frequency,
//      page cache) falls on all of them alike;
//   2. a run is one child job (kfrun, mpirun, or the ranks of a Gloo run) that measures every
//      size and prints one JSON row per size (kf-bench's --json format, report.hpp), every
//      iteration checked;
//   3. per (np, implementation, size): the median over the rounds of the runs' median_us and of
//      their p90_us; algbw and busbw from that median; correct only if every run's row was;
//   4. per np, a table of time and busbw, the time ratio of kf to the fastest baseline of its
//      transport class, and a plot of busbw against size; every raw row goes to a JSON-lines
//      file;
//   5. this machine's copy rate (copy_rate.hpp), measured before the runs and after them with
//      as many threads as the workers have cores, the reference for kf's large-message algbw;
//   6. all of this once per method (method.hpp: barrier, then back-to-back), each with its own
//      tables and plots;
//   7. with another build (--against, compare_builds.hpp), each of kf's implementations also
//      runs from that build's executables as "<impl>@old", beside this build's in every round,
//      and a table per np gives new/old per cell with each side's run-to-run spread.
// Thread-safety: pure functions, except run_compare() (children, files, its streams).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kf-bench/lib/copy_rate.hpp"
#include "kf-bench/lib/method.hpp"
#include "kf-bench/lib/spawn.hpp"
#include "kf-bench/lib/svg_plot.hpp"

namespace kf::tools::bench {

/// How an implementation moves bytes between processes of one host.
enum class TransportClass { tcp, local };

std::string_view to_string(TransportClass c) noexcept;

struct ImplSpec {
  std::string_view name;   ///< on the command line and in the JSON rows: "gloo-ring"
  std::string_view label;  ///< a table column's heading (at most 15 characters)
  TransportClass transport;
};

/// Every implementation compare knows, in the order they run and are shown: kf, kf-shared (kf
/// with its buffers in kf::SharedMemory), kf-unix,
/// kf-tcp, kf-tcp-nomac (kf-tcp with KF_FRAME_AUTH=off), mpi-tcp, mpi-shm, gloo-ring,
/// gloo-ring_chunked, gloo-halving_doubling.
const std::vector<ImplSpec>& known_impls();
/// The spec of `name`, or nullptr when compare does not know it.
const ImplSpec* find_impl(std::string_view name) noexcept;

/// Whether `impl` is one of kf's own (kf, kf-shared, kf-unix, kf-tcp, kf-tcp-nomac) rather than
/// a baseline.
bool is_kf(std::string_view impl) noexcept;

/// kf's implementation in `transport`'s class: kf-tcp for tcp, kf for local.
std::string_view kf_impl_of(TransportClass transport) noexcept;

/// What marks an implementation run from the other build (--against): "kf-tcp@old".
inline constexpr std::string_view kOtherBuildSuffix = "@old";

/// `impl` run from the other build: "kf" -> "kf@old".
std::string other_build_impl(std::string_view impl);
/// Whether `impl` runs from the other build.
bool is_other_build(std::string_view impl) noexcept;
/// `impl` without the other build's suffix: "kf@old" -> "kf"; other names unchanged.
std::string_view base_impl(std::string_view impl) noexcept;

/// kf-bench compare's command line.
struct CompareOptions {
  std::vector<int> nps{2, 4};
  std::vector<std::size_t> sizes;  ///< message bytes per worker
  std::vector<std::string> impls;  ///< empty: every one whose executables are found
  int rounds = 3;
  std::optional<int> iters;  ///< passed to every run; each benchmark's default when empty
  int warmup = 5;
  std::string out_dir;  ///< empty: a new directory under the system's temporary directory
  int timeout_s = 300;  ///< per run, from start to SIGTERM
  std::string against;  ///< another kf build to run kf from as well (compare_builds.hpp); or ""
  /// How the runs time the calls, each method measured in turn (method.hpp).
  std::vector<Method> methods{Method::barrier, Method::back_to_back};
  int calls = kDefaultCalls;  ///< back-to-back: calls per sample
};

/// The executables the runs need; an empty path where one was not found.
struct Binaries {
  std::string kf_bench;
  std::string kfrun;
  std::string mpirun;
  std::string kf_bench_mpi;
  std::string kf_bench_gloo;
};

/// Looks for the executables beside `self` (the running kf-bench): kfrun in ../kfrun/ (the build
/// tree), the baselines in ../bench/baselines/, then each in self's own directory (installed:
/// all in bindir), then on `path` (a PATH value), where mpirun is looked for only.
Binaries find_binaries(const std::string& self, std::string_view path);

/// Why `impl` cannot run with `bin` (the missing executable), or an empty string.
std::string missing_executable(std::string_view impl, const Binaries& bin);

/// The line compare prints for a baseline it skips because `missing` is not there, with how to
/// get it: install the packages, and reconfigure a build configured before them (Meson looks
/// for libraries only when it configures).
std::string skip_line(std::string_view impl, std::string_view missing);

/// One run: every size of `impl` on `np` processes.
struct RunRequest {
  std::string impl;
  int np = 2;
  std::vector<std::size_t> sizes;
  std::optional<int> iters;
  int warmup = 5;
  std::string store_dir;  ///< Gloo's rendezvous directory, fresh per run
  Method method = Method::barrier;
  int calls = kDefaultCalls;  ///< back-to-back: calls per sample
};

/// The processes of one run; the first prints the rows. Gloo's ranks are started directly,
/// rank 0 first; kf and MPI are one launcher each.
std::vector<Command> commands_for(const RunRequest& request, const Binaries& bin);

/// The JSON row on a line of a child's stdout, with kfrun's "[rank] " prefix or without one;
/// nullopt for other lines, and for another rank's. A row is an object with at least bytes,
/// median_us and correct.
std::optional<nlohmann::ordered_json> parse_row_line(std::string_view line);
/// The rows among `out`'s lines.
std::vector<nlohmann::ordered_json> parse_rows(std::string_view out);

/// The rows of one run.
struct RunRows {
  std::string impl;
  int np = 0;
  int round = 0;  ///< from 1
  std::vector<nlohmann::ordered_json> rows;
  Method method = Method::barrier;
};

/// One (np, implementation, size) over the rounds.
struct Point {
  int np = 0;
  std::string impl;
  std::size_t bytes = 0;
  int runs = 0;          ///< rows aggregated
  double median_us = 0;  ///< median over the runs of their median_us
  double min_us = 0;     ///< the fastest run's median_us
  double max_us = 0;     ///< the slowest run's median_us
  double p90_us = 0;     ///< median over the runs of their p90_us
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  bool correct = false;  ///< every run's row was
};

/// The points of `runs`, ordered by np, implementation (known_impls() order, unknown ones after
/// by name) and bytes.
std::vector<Point> aggregate(const std::vector<RunRows>& runs);

/// The point of (np, impl, bytes), or nullptr.
const Point* find_point(const std::vector<Point>& points, int np, std::string_view impl,
                        std::size_t bytes) noexcept;

struct BestBaseline {
  std::string impl;  ///< the fastest correct baseline of the class
  double ratio = 0;  ///< kf's median time / its median time: < 1 when kf is faster
};

/// kf's implementation in `transport`'s class (or `kf_impl`, when given) against the fastest
/// correct baseline of that class at (np, bytes); nullopt when either is missing.
std::optional<BestBaseline> best_baseline(const std::vector<Point>& points, int np,
                                          std::size_t bytes, TransportClass transport,
                                          std::string_view kf_impl = {});

/// The tables of `np`: time and busbw per implementation; then kf against the best baselines,
/// and kf's algbw against `copy` (measured in the run; none when its gbps is 0) and a loopback
/// TCP stream for messages of 1 MiB and more.
void print_tables(std::ostream& out, const std::vector<Point>& points, int np, int rounds,
                  const CopyRate& copy = {});

/// The plot of `np`: busbw against size, one series per implementation (dashed: tcp class).
Plot busbw_plot(const std::vector<Point>& points, int np);

/// `row` with impl, class, round, np and method added, for compare.jsonl; the class of "kf@old"
/// is kf's.
nlohmann::ordered_json annotated_row(const nlohmann::ordered_json& row, const RunRows& run);

/// kf-bench compare: the runs, the tables on `out`, progress and failures on `err`, the files in
/// o.out_dir. Returns the exit code: 0 when every run completed and every row was correct; 1
/// otherwise (or when kf's own executables or the output directory are missing); 128 + the
/// signal when interrupted. Never throws.
int run_compare(const CompareOptions& o, std::ostream& out, std::ostream& err) noexcept;

}  // namespace kf::tools::bench
