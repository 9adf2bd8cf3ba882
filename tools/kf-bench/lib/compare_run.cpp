// SPDX-License-Identifier: Apache-2.0
// compare's runs (run_compare, declared in compare.hpp): the children, compare.jsonl and the
// plots; with --against, the other build's runs too (compare_builds.hpp).
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "kf-bench/lib/compare.hpp"
#include "kf-bench/lib/compare_builds.hpp"
#include "kf-bench/lib/parse.hpp"

namespace kf::tools::bench {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// From SIGTERM to SIGKILL for a run that timed out: kfrun's own grace before it kills its
// workers is shorter, so that they are gone when the group is killed.
constexpr auto kStopGrace = std::chrono::seconds(10);
// The copy rate's buffers (per thread) and copies: 64 MiB, the largest default size.
constexpr std::size_t kCopyBytes = std::size_t{64} << 20;
constexpr int kCopyRepeats = 5;

// A new empty directory under the system's temporary directory. Throws: std::runtime_error.
fs::path make_temp_dir(const std::string& stem) {
  std::string pattern = (fs::temp_directory_path() / (stem + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "cannot create " + pattern);
  }
  return pattern;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

// Why a run failed, or "" when it completed with every row correct.
std::string failure_of(const GroupResult& r, std::size_t rows, std::size_t sizes, bool correct,
                       int timeout_s) {
  if (!r.error.empty()) return r.error;
  if (r.interrupted_by != 0) return "interrupted by signal " + std::to_string(r.interrupted_by);
  if (r.timed_out) return "timed out after " + std::to_string(timeout_s) + " s";
  std::vector<std::string> codes;
  for (const ProcessResult& p : r.processes) codes.push_back(std::to_string(p.exit_code));
  if (!r.ok()) return "exit codes " + join(codes, ",");
  if (rows != sizes) return std::to_string(rows) + " rows for " + std::to_string(sizes) + " sizes";
  if (!correct) return "a result check failed";
  return {};
}

class Compare {
 public:
  Compare(const CompareOptions& o, std::ostream& out, std::ostream& err)
      : o_(o), out_(out), err_(err) {}

  int run() {
    const char* path = std::getenv("PATH");
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    bin_ = find_binaries(self, path ? path : "");
    if (!choose_impls()) return 1;
    if (!o_.against.empty() && !add_other_build(self)) return 1;
    dir_ = o_.out_dir.empty() ? make_temp_dir("kf-bench-compare") : fs::path(o_.out_dir);
    fs::create_directories(dir_);
    jsonl_.open(dir_ / "compare.jsonl", std::ios::trunc);
    if (!jsonl_) throw std::runtime_error("cannot write " + (dir_ / "compare.jsonl").string());
    print_plan();
    measure_copy_rates("before the runs");
    for (const Method method : o_.methods) {
      for (const int np : o_.nps) {
        for (int round = 1; round <= o_.rounds && interrupted_by_ == 0; ++round) {
          for (const std::string& impl : round_order(impls_, round)) {
            if (interrupted_by_ == 0) run_one(impl, np, round, method);
          }
        }
      }
    }
    if (interrupted_by_ == 0) measure_copy_rates("after the runs");
    write_results();
    if (interrupted_by_ != 0) return 128 + interrupted_by_;
    return all_ok_ ? 0 : 1;
  }

 private:
  // The implementations to run, each with its executables found; false when none is left or
  // kf's own are missing.
  bool choose_impls() {
    std::vector<std::string> wanted = o_.impls;
    if (wanted.empty()) {
      for (const ImplSpec& s : known_impls()) wanted.emplace_back(s.name);
    }
    for (const std::string& impl : wanted) {
      if (std::find(impls_.begin(), impls_.end(), impl) != impls_.end()) continue;
      const std::string missing = missing_executable(impl, bin_);
      if (missing.empty()) {
        impls_.push_back(impl);
      } else if (is_kf(impl)) {
        err_ << "kf-bench compare: cannot run " << impl << ": " << missing << " not found beside "
             << bin_.kf_bench << " or on PATH\n";
        return false;
      } else {
        out_ << skip_line(impl, missing);
      }
    }
    if (impls_.empty()) err_ << "kf-bench compare: no implementation to run\n";
    return !impls_.empty();
  }

  // With --against: the other build's executables, and its twin of each of kf's implementations
  // chosen; false when the build lacks an executable or no kf implementation was chosen.
  bool add_other_build(const std::string& self) {
    other_ = find_other_build(o_.against);
    if (const std::string missing = missing_in_build(other_); !missing.empty()) {
      err_ << "kf-bench compare: --against " << o_.against << ": " << missing << "\n";
      return false;
    }
    if (std::none_of(impls_.begin(), impls_.end(), [](const std::string& i) { return is_kf(i); })) {
      err_ << "kf-bench compare: --against needs one of kf's implementations in --impl\n";
      return false;
    }
    other_bin_.kf_bench = other_.kf_bench;
    other_bin_.kfrun = other_.kfrun;
    own_lib_dir_ = own_lib_dir(self);
    if (const char* ld = std::getenv("LD_LIBRARY_PATH")) ld_library_path_ = ld;
    impls_ = with_other_build(impls_);
    return true;
  }

  void print_plan() {
    std::vector<std::string> nps;
    for (const int np : o_.nps) nps.push_back(std::to_string(np));
    std::vector<std::string> sizes;
    for (const std::size_t s : o_.sizes) sizes.push_back(format_bytes(s));
    std::vector<std::string> methods;
    for (const Method m : o_.methods) {
      methods.push_back(std::string(to_string(m)) +
                        (m == Method::back_to_back ? " (" + std::to_string(o_.calls) + " calls)"
                                                   : std::string()));
    }
    out_ << "# kf-bench compare: f32 sum allreduce; np " << join(nps, ",") << "; sizes "
         << join(sizes, ",") << "; methods " << join(methods, ", ") << "; " << o_.rounds
         << " round(s) of " << join(impls_, " ") << "\n";
    if (!o_.against.empty()) {
      out_ << "# old: " << other_.kfrun << " and " << other_.kf_bench << "; new: " << bin_.kfrun
           << " and " << bin_.kf_bench << "\n";
    }
    out_ << "# output: " << dir_.string() << std::endl;
  }

  // The copy rate with as many threads as np workers have cores here, for each np; the faster
  // of the two measurements (before and after the runs) is the reference.
  static int copy_threads(int np) {
    const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
    return std::min(np, cores);
  }
  void measure_copy_rates(const char* when) {
    std::set<int> counts;
    for (const int np : o_.nps) counts.insert(copy_threads(np));
    for (const int threads : counts) {
      const CopyRate r = measure_copy_rate(kCopyBytes, threads, kCopyRepeats);
      char line[160];
      std::snprintf(line, sizeof line,
                    "copy rate %s: memcpy of %s, %d thread(s) at once: %.2f GB/s each", when,
                    format_bytes(r.bytes).c_str(), threads, r.gbps);
      err_ << line << std::endl;
      if (r.gbps > copy_[threads].gbps) copy_[threads] = r;
    }
  }

  void run_one(const std::string& impl, int np, int round, Method method) {
    const bool other = is_other_build(impl);
    RunRequest request{
        std::string(base_impl(impl)), np, o_.sizes, o_.iters, o_.warmup, {}, method, o_.calls};
    const bool gloo = impl.starts_with("gloo-");
    if (gloo) request.store_dir = make_temp_dir("kf-bench-gloo").string();
    std::vector<Command> commands = commands_for(request, other ? other_bin_ : bin_);
    if (!o_.against.empty() && is_kf(request.impl)) {
      const auto change =
          library_path_change(other ? other_.lib_dir : own_lib_dir_, ld_library_path_);
      if (change) commands[0].env.push_back(*change);
    }
    const auto start = Clock::now();
    const GroupResult r =
        run_group(commands, GroupLimits{std::chrono::seconds(o_.timeout_s), kStopGrace});
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (gloo) {
      std::error_code ec;
      fs::remove_all(request.store_dir, ec);
    }
    interrupted_by_ = r.interrupted_by;

    RunRows run{impl, np, round, parse_rows(r.processes.empty() ? "" : r.processes[0].out), method};
    const bool correct = std::all_of(run.rows.begin(), run.rows.end(),
                                     [](const auto& row) { return row.value("correct", false); });
    for (const auto& row : run.rows) jsonl_ << annotated_row(row, run).dump() << '\n';
    jsonl_.flush();
    const std::string failure =
        failure_of(r, run.rows.size(), o_.sizes.size(), correct, o_.timeout_s);
    char line[128];
    std::snprintf(line, sizeof line, "%s np=%d round %d/%d %-22s %7.1f s",
                  std::string(to_string(method)).c_str(), np, round, o_.rounds, impl.c_str(),
                  seconds);
    err_ << line << (failure.empty() ? "" : "  FAILED: ") << failure << std::endl;
    if (!failure.empty()) {
      all_ok_ = false;
      for (std::size_t i = 0; i < r.processes.size(); ++i) {
        if (r.processes[i].err.empty()) continue;
        err_ << "--- stderr of " << impl << (r.processes.size() > 1 ? " process " : "")
             << (r.processes.size() > 1 ? std::to_string(i) : "") << ":\n"
             << r.processes[i].err << (r.processes[i].err.ends_with('\n') ? "" : "\n");
      }
    }
    runs_.push_back(std::move(run));
  }

  // Per method, its tables and plots (compare-np2.svg for barrier, compare-back-to-back-np2.svg).
  void write_results() {
    std::vector<std::string> files{(dir_ / "compare.jsonl").string()};
    for (const Method method : o_.methods) {
      std::vector<RunRows> runs;
      std::copy_if(runs_.begin(), runs_.end(), std::back_inserter(runs),
                   [method](const RunRows& r) { return r.method == method; });
      const std::vector<Point> points = aggregate(runs);
      out_ << "\n## method " << to_string(method)
           << (method == Method::back_to_back
                   ? ": per sample a barrier, then " + std::to_string(o_.calls) +
                         " in-place calls on one warm buffer; times per call"
                   : std::string(": a barrier before each call, cache-cold buffers"))
           << "\n";
      const std::string stem = method == Method::barrier
                                   ? "compare-np"
                                   : "compare-" + std::string(to_string(method)) + "-np";
      for (const int np : o_.nps) {
        out_ << "\n";
        print_tables(out_, points, np, o_.rounds, copy_[copy_threads(np)]);
        if (!o_.against.empty()) {
          out_ << "\n";
          print_build_table(out_, points, np, o_.rounds, o_.against);
        }
        const fs::path svg = dir_ / (stem + std::to_string(np) + ".svg");
        std::ofstream file(svg, std::ios::trunc);
        file << svg_plot(busbw_plot(points, np));
        if (!file.flush()) throw std::runtime_error("cannot write " + svg.string());
        files.push_back(svg.string());
      }
    }
    out_ << "\n# wrote " << join(files, " ") << std::endl;
  }

  const CompareOptions& o_;
  std::ostream& out_;
  std::ostream& err_;
  Binaries bin_;
  OtherBuild other_;    // with --against
  Binaries other_bin_;  // its kfrun and kf-bench
  std::string own_lib_dir_;
  std::optional<std::string> ld_library_path_;
  std::vector<std::string> impls_;
  fs::path dir_;
  std::ofstream jsonl_;
  std::vector<RunRows> runs_;
  std::map<int, CopyRate> copy_;  // per thread count, the faster of the two measurements
  bool all_ok_ = true;
  int interrupted_by_ = 0;
};

}  // namespace

int run_compare(const CompareOptions& o, std::ostream& out, std::ostream& err) noexcept {
  try {
    return Compare(o, out, err).run();
  } catch (const std::exception& e) {
    err << "kf-bench compare: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace kf::tools::bench
