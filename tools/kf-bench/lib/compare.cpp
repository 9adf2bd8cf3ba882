// SPDX-License-Identifier: Apache-2.0
// compare's pure parts: the implementations and their command lines, reading the children's
// rows, and aggregating them over the rounds. compare_report.cpp prints and plots the points;
// compare_run.cpp runs the children.
#include "kf-bench/lib/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "kf-bench/lib/stats.hpp"
#include "kf/common/env.hpp"

namespace kf::tools::bench {

namespace {

namespace fs = std::filesystem;

// The first of `candidates` that is an executable file, else `name` on `path`; or "".
std::string first_executable(const std::vector<fs::path>& candidates, const std::string& name,
                             std::string_view path) {
  for (const fs::path& c : candidates) {
    if (executable_file(c)) return c.lexically_normal().string();
  }
  std::istringstream dirs{std::string(path)};
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path c = fs::path(dir.empty() ? "." : dir) / name;
    if (executable_file(c)) return c.string();
  }
  return {};
}

std::string join_sizes(const std::vector<std::size_t>& sizes) {
  std::string text;
  for (const std::size_t s : sizes) text += (text.empty() ? "" : ",") + std::to_string(s);
  return text;
}

// The options every benchmark takes alike.
void add_common(std::vector<std::string>& argv, const RunRequest& r) {
  argv.insert(argv.end(),
              {"--json", "--sizes", join_sizes(r.sizes), "--warmup", std::to_string(r.warmup)});
  if (r.iters) argv.insert(argv.end(), {"--iters", std::to_string(*r.iters)});
  // Only when asked: a build from before the option knows the barrier method alone.
  if (r.method == Method::back_to_back) {
    argv.insert(argv.end(),
                {"--method", std::string(to_string(r.method)), "--calls", std::to_string(r.calls)});
  }
}

}  // namespace

bool is_kf(std::string_view impl) noexcept {
  return impl == "kf" || impl == "kf-shared" || impl == "kf-unix" || impl == "kf-tcp" ||
         impl == "kf-tcp-nomac";
}

namespace {

// The place of `impl` among the results: known_impls() order, each one run from the other build
// right after this build's, so that the two sit side by side in the tables.
std::size_t impl_order(const std::string& impl) {
  const auto& known = known_impls();
  const std::string_view base = base_impl(impl);
  const auto it = std::find_if(known.begin(), known.end(),
                               [base](const ImplSpec& s) { return s.name == base; });
  return 2 * static_cast<std::size_t>(it - known.begin()) + (is_other_build(impl) ? 1 : 0);
}

}  // namespace

std::string_view to_string(TransportClass c) noexcept {
  return c == TransportClass::tcp ? "tcp" : "local";
}

const std::vector<ImplSpec>& known_impls() {
  static const std::vector<ImplSpec> impls{
      {"kf", "kf", TransportClass::local},
      {"kf-shared", "kf-shared", TransportClass::local},
      {"kf-unix", "kf-unix", TransportClass::local},
      {"kf-tcp", "kf-tcp", TransportClass::tcp},
      {"kf-tcp-nomac", "kf-tcp-nomac", TransportClass::tcp},
      {"mpi-tcp", "mpi-tcp", TransportClass::tcp},
      {"mpi-shm", "mpi-shm", TransportClass::local},
      {"gloo-ring", "gloo-ring", TransportClass::tcp},
      {"gloo-ring_chunked", "gloo-chunked", TransportClass::tcp},
      {"gloo-halving_doubling", "gloo-hd", TransportClass::tcp},
  };
  return impls;
}

const ImplSpec* find_impl(std::string_view name) noexcept {
  for (const ImplSpec& s : known_impls()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string_view kf_impl_of(TransportClass transport) noexcept {
  return transport == TransportClass::tcp ? "kf-tcp" : "kf";
}

std::string other_build_impl(std::string_view impl) {
  return std::string(impl) + std::string(kOtherBuildSuffix);
}

bool is_other_build(std::string_view impl) noexcept {
  return impl.size() > kOtherBuildSuffix.size() && impl.ends_with(kOtherBuildSuffix);
}

std::string_view base_impl(std::string_view impl) noexcept {
  if (is_other_build(impl)) impl.remove_suffix(kOtherBuildSuffix.size());
  return impl;
}

Binaries find_binaries(const std::string& self, std::string_view path) {
  const fs::path dir = fs::path(self).parent_path();
  const fs::path baselines = dir / ".." / "bench" / "baselines";
  Binaries bin;
  bin.kf_bench = self;
  bin.kfrun = first_executable({dir / ".." / "kfrun" / "kfrun", dir / "kfrun"}, "kfrun", path);
  bin.kf_bench_mpi =
      first_executable({baselines / "kf-bench-mpi", dir / "kf-bench-mpi"}, "kf-bench-mpi", path);
  bin.kf_bench_gloo =
      first_executable({baselines / "kf-bench-gloo", dir / "kf-bench-gloo"}, "kf-bench-gloo", path);
  bin.mpirun = first_executable({}, "mpirun", path);
  return bin;
}

std::string missing_executable(std::string_view impl, const Binaries& bin) {
  if (is_kf(impl)) return bin.kfrun.empty() ? "kfrun" : bin.kf_bench.empty() ? "kf-bench" : "";
  if (impl.starts_with("mpi-")) {
    return bin.mpirun.empty() ? "mpirun" : bin.kf_bench_mpi.empty() ? "kf-bench-mpi" : "";
  }
  if (impl.starts_with("gloo-")) return bin.kf_bench_gloo.empty() ? "kf-bench-gloo" : "";
  return "an implementation named " + std::string(impl);
}

std::string skip_line(std::string_view impl, std::string_view missing) {
  return "# skipping " + std::string(impl) + ": " + std::string(missing) +
         " not found (tools/install-deps --bench installs OpenMPI and Gloo; a build configured "
         "before that needs `meson setup --reconfigure build` and `ninja -C build`)\n";
}

std::vector<Command> commands_for(const RunRequest& r, const Binaries& bin) {
  const std::string np = std::to_string(r.np);
  if (is_kf(r.impl)) {
    Command c;
    c.argv = {bin.kfrun, "-np", np, "--", bin.kf_bench, "allreduce"};
    c.argv.insert(c.argv.end(), {"--algo", "auto", "--dtype", "f32", "--op", "sum"});
    add_common(c.argv, r);
    // Buffers that same-host peers read in place (kf::SharedMemory).
    if (r.impl == "kf-shared") c.argv.insert(c.argv.end(), {"--memory", "shared"});
    // kf's default (same-host sockets, large payloads single-copy) unless told otherwise.
    const bool tcp = r.impl == "kf-tcp" || r.impl == "kf-tcp-nomac";
    c.env.push_back({env::kTransport, tcp                   ? std::optional<std::string>("tcp")
                                      : r.impl == "kf-unix" ? std::optional<std::string>("unix")
                                                            : std::nullopt});
    // The frame MACs' cost shows as kf-tcp against kf-tcp-nomac: unset (MACs on) but there.
    c.env.push_back({env::kFrameAuth,
                     r.impl == "kf-tcp-nomac" ? std::optional<std::string>("off") : std::nullopt});
    return {c};
  }
  if (r.impl.starts_with("mpi-")) {
    Command c;
    // As root; no binding, so ranks are not stacked on one core. --oversubscribe only when there
    // are more ranks than cores: it also makes idle ranks yield the core, which costs latency.
    c.argv = {bin.mpirun, "--allow-run-as-root", "--bind-to", "none"};
    if (r.np > static_cast<int>(std::thread::hardware_concurrency())) {
      c.argv.push_back("--oversubscribe");
    }
    c.argv.insert(c.argv.end(), {"-np", np, "--mca", "pml", "ob1"});
    if (r.impl == "mpi-shm") {
      c.argv.insert(c.argv.end(), {"--mca", "btl", "vader,self"});
    } else {
      c.argv.insert(c.argv.end(),
                    {"--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"});
    }
    // MPI_Allreduce allocates a temporary buffer per call from 32 MiB up; glibc maps and unmaps
    // it each time, and the page faults cut 64 MiB to about 0.2 GB/s here. Keeping freed memory
    // in the heap makes MPI as fast as it can be (kf keeps its scratch buffers in a pool).
    c.argv.insert(c.argv.end(), {"-x", "MALLOC_MMAP_THRESHOLD_", "-x", "MALLOC_TRIM_THRESHOLD_"});
    c.argv.insert(c.argv.end(), {bin.kf_bench_mpi, "--label", r.impl});
    add_common(c.argv, r);
    // Quiet the warnings about InfiniBand components that find no hardware.
    c.env = {{"OMPI_MCA_btl_base_warn_component_unused", "0"},
             {"OMPI_MCA_mtl", "^ofi"},
             {"MALLOC_MMAP_THRESHOLD_", "1073741824"},
             {"MALLOC_TRIM_THRESHOLD_", "4294967296"}};
    return {c};
  }
  std::vector<Command> ranks;
  const std::string algo = r.impl.substr(std::string_view("gloo-").size());
  for (int rank = 0; rank < r.np; ++rank) {
    Command c;
    c.argv = {bin.kf_bench_gloo, "--rank", std::to_string(rank),
              "--size",          np,       "--store",
              r.store_dir,       "--algo", algo};
    add_common(c.argv, r);
    ranks.push_back(std::move(c));
  }
  return ranks;
}

std::optional<nlohmann::ordered_json> parse_row_line(std::string_view line) {
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) {
    line.remove_suffix(1);
  }
  if (line.starts_with('[')) {
    const std::size_t close = line.find("] ");
    const std::string_view rank = line.substr(1, close == line.npos ? 0 : close - 1);
    const bool digits = !rank.empty() && std::all_of(rank.begin(), rank.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    if (!digits || rank != "0") return std::nullopt;
    line.remove_prefix(close + 2);
  }
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) {
    line.remove_prefix(1);
  }
  if (!line.starts_with('{')) return std::nullopt;
  nlohmann::ordered_json row =
      nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!row.is_object() || !row.contains("bytes") || !row["bytes"].is_number_unsigned() ||
      !row.contains("median_us") || !row["median_us"].is_number() || !row.contains("correct") ||
      !row["correct"].is_boolean() || (row.contains("p90_us") && !row["p90_us"].is_number())) {
    return std::nullopt;
  }
  return row;
}

std::vector<nlohmann::ordered_json> parse_rows(std::string_view out) {
  std::vector<nlohmann::ordered_json> rows;
  while (!out.empty()) {
    const std::size_t newline = out.find('\n');
    if (auto row = parse_row_line(out.substr(0, newline))) rows.push_back(std::move(*row));
    out.remove_prefix(newline == out.npos ? out.size() : newline + 1);
  }
  return rows;
}

std::vector<Point> aggregate(const std::vector<RunRows>& runs) {
  struct Samples {
    std::vector<double> median_us;
    std::vector<double> p90_us;
    bool correct = true;
  };
  // (np, place in known_impls(), impl, bytes): the order of the result.
  std::map<std::tuple<int, std::size_t, std::string, std::size_t>, Samples> samples;
  for (const RunRows& run : runs) {
    for (const nlohmann::ordered_json& row : run.rows) {
      const auto bytes = row.value("bytes", std::size_t{0});
      Samples& s = samples[{run.np, impl_order(run.impl), run.impl, bytes}];
      s.median_us.push_back(row.value("median_us", 0.0));
      s.p90_us.push_back(row.value("p90_us", row.value("median_us", 0.0)));
      s.correct = s.correct && row.value("correct", false);
    }
  }
  std::vector<Point> points;
  for (const auto& [key, s] : samples) {
    Point p;
    std::tie(p.np, std::ignore, p.impl, p.bytes) = key;
    p.runs = static_cast<int>(s.median_us.size());
    p.median_us = quantile(s.median_us, 0.5);
    p.min_us = *std::min_element(s.median_us.begin(), s.median_us.end());
    p.max_us = *std::max_element(s.median_us.begin(), s.median_us.end());
    p.p90_us = quantile(s.p90_us, 0.5);
    if (p.median_us > 0) {
      p.algbw_gbps =
          static_cast<double>(algbw_bytes(CollOp::allreduce, p.bytes, p.np)) / (p.median_us * 1e3);
    }
    p.busbw_gbps = p.algbw_gbps * bus_factor(CollOp::allreduce, p.np);
    p.correct = s.correct;
    points.push_back(std::move(p));
  }
  return points;
}

const Point* find_point(const std::vector<Point>& points, int np, std::string_view impl,
                        std::size_t bytes) noexcept {
  for (const Point& p : points) {
    if (p.np == np && p.impl == impl && p.bytes == bytes) return &p;
  }
  return nullptr;
}

std::optional<BestBaseline> best_baseline(const std::vector<Point>& points, int np,
                                          std::size_t bytes, TransportClass transport,
                                          std::string_view kf_impl) {
  const Point* kf =
      find_point(points, np, kf_impl.empty() ? kf_impl_of(transport) : kf_impl, bytes);
  if (kf == nullptr || kf->median_us <= 0) return std::nullopt;
  const Point* best = nullptr;
  for (const Point& p : points) {
    const ImplSpec* spec = find_impl(p.impl);
    if (p.np != np || p.bytes != bytes || is_kf(p.impl) || spec == nullptr ||
        spec->transport != transport || !p.correct || p.median_us <= 0) {
      continue;
    }
    if (best == nullptr || p.median_us < best->median_us) best = &p;
  }
  if (best == nullptr) return std::nullopt;
  return BestBaseline{best->impl, kf->median_us / best->median_us};
}

nlohmann::ordered_json annotated_row(const nlohmann::ordered_json& row, const RunRows& run) {
  nlohmann::ordered_json j = row;
  const ImplSpec* spec = find_impl(base_impl(run.impl));
  j["impl"] = run.impl;
  j["class"] = spec != nullptr ? to_string(spec->transport) : "unknown";
  j["round"] = run.round;
  j["np"] = run.np;
  j["method"] = to_string(run.method);
  return j;
}

}  // namespace kf::tools::bench
