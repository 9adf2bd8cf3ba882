// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/compare_builds.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "kf-bench/lib/parse.hpp"
#include "kf-bench/lib/spawn.hpp"

namespace kf::tools::bench {

namespace {

namespace fs = std::filesystem;

// Where an executable of a build in `dir` may be: its build tree's place, then `dir` itself.
std::vector<fs::path> candidates(const fs::path& dir, const std::string& subdir,
                                 const std::string& name) {
  return {dir / "tools" / subdir / name, dir / name};
}

std::string first_executable(const std::vector<fs::path>& paths) {
  for (const fs::path& p : paths) {
    if (executable_file(p)) return p.string();
  }
  return {};
}

fs::path absolute_dir(const std::string& dir) {
  std::error_code ec;
  const fs::path abs = fs::absolute(dir, ec);
  return (ec ? fs::path(dir) : abs).lexically_normal();
}

std::string looked_for(const std::string& name, const std::vector<fs::path>& paths) {
  std::string text = name + " not found (looked for";
  for (std::size_t i = 0; i < paths.size(); ++i) {
    text += (i == 0 ? " " : " and ") + paths[i].string();
  }
  return text + ")";
}

}  // namespace

OtherBuild find_other_build(const std::string& dir) {
  const fs::path root = absolute_dir(dir);
  OtherBuild b;
  b.dir = dir;
  b.kf_bench = first_executable(candidates(root, "kf-bench", "kf-bench"));
  b.kfrun = first_executable(candidates(root, "kfrun", "kfrun"));
  std::error_code ec;
  if (fs::is_directory(root / "libkf", ec)) b.lib_dir = (root / "libkf").string();
  return b;
}

std::string missing_in_build(const OtherBuild& b) {
  const fs::path root = absolute_dir(b.dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return root.string() + " is not a directory";
  std::vector<std::string> missing;
  if (b.kf_bench.empty()) {
    missing.push_back(looked_for("kf-bench", candidates(root, "kf-bench", "kf-bench")));
  }
  if (b.kfrun.empty()) missing.push_back(looked_for("kfrun", candidates(root, "kfrun", "kfrun")));
  if (missing.empty()) return {};
  std::string text = root.string() + " is not a kf build: ";
  for (std::size_t i = 0; i < missing.size(); ++i) text += (i == 0 ? "" : "; ") + missing[i];
  return text;
}

std::string own_lib_dir(const std::string& self) {
  const fs::path lib = (fs::path(self).parent_path() / ".." / ".." / "libkf").lexically_normal();
  std::error_code ec;
  return fs::is_directory(lib, ec) ? lib.string() : std::string();
}

std::optional<EnvChange> library_path_change(std::string_view lib_dir,
                                             std::optional<std::string_view> ld_library_path) {
  if (lib_dir.empty() || !ld_library_path || ld_library_path->empty()) return std::nullopt;
  return EnvChange{"LD_LIBRARY_PATH", std::string(lib_dir) + ":" + std::string(*ld_library_path)};
}

std::vector<std::string> with_other_build(const std::vector<std::string>& impls) {
  std::vector<std::string> all;
  for (const std::string& impl : impls) {
    all.push_back(impl);
    if (is_kf(impl)) all.push_back(other_build_impl(impl));
  }
  return all;
}

std::vector<std::string> round_order(const std::vector<std::string>& impls, int round) {
  std::vector<std::string> order = impls;
  if (round % 2 != 0) return order;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    if (!is_other_build(order[i]) && order[i + 1] == other_build_impl(order[i])) {
      std::swap(order[i], order[i + 1]);
      ++i;
    }
  }
  return order;
}

double spread_of(const Point& p) noexcept {
  if (p.min_us <= 0 || p.max_us <= 0) return 1;
  return std::max(1.0, p.max_us / p.min_us);
}

bool slower_beyond_spread(double ratio, double new_spread, double old_spread,
                          double tolerance) noexcept {
  return ratio > (1 + tolerance) * std::max({1.0, new_spread, old_spread});
}

std::vector<BuildCell> build_cells(const std::vector<Point>& points, int np, double tolerance) {
  std::set<std::size_t> sizes;
  for (const Point& p : points) {
    if (p.np == np) sizes.insert(p.bytes);
  }
  std::vector<BuildCell> cells;
  for (const std::size_t bytes : sizes) {
    for (const ImplSpec& spec : known_impls()) {
      if (!is_kf(spec.name)) continue;
      const Point* now = find_point(points, np, spec.name, bytes);
      const Point* old = find_point(points, np, other_build_impl(spec.name), bytes);
      if (now == nullptr || old == nullptr || now->median_us <= 0 || old->median_us <= 0) {
        continue;
      }
      BuildCell c;
      c.np = np;
      c.impl = spec.name;
      c.bytes = bytes;
      c.new_us = now->median_us;
      c.old_us = old->median_us;
      c.ratio = c.new_us / c.old_us;
      c.new_spread = spread_of(*now);
      c.old_spread = spread_of(*old);
      c.limit = (1 + tolerance) * std::max(c.new_spread, c.old_spread);
      c.correct = now->correct && old->correct;
      c.slower = slower_beyond_spread(c.ratio, c.new_spread, c.old_spread, tolerance);
      cells.push_back(std::move(c));
    }
  }
  return cells;
}

void print_build_table(std::ostream& out, const std::vector<Point>& points, int np, int rounds,
                       std::string_view other_dir) {
  const std::vector<BuildCell> cells = build_cells(points, np);
  out << "# np=" << np << ": this build (new) against " << other_dir
      << " (old); per side the median over " << rounds
      << " round(s) of each run's median time (us)\n"
      << "# new/old < 1: new is faster; spread: a side's slowest per-round median / its fastest\n"
      << "# SLOWER: new/old above limit = " << 1 + kSlowerTolerance << " x the larger spread"
      << (rounds < 2 ? " (one round measures no spread: the limit is the tolerance alone)" : "")
      << "\n";
  if (cells.empty()) {
    out << "# np=" << np << ": no cell ran on both builds\n" << std::flush;
    return;
  }
  char line[200];
  std::snprintf(line, sizeof line, "#  size  %-8s %9s %9s  %8s  %10s  %10s  %7s\n", "impl",
                "new us", "old us", "new/old", "spread new", "spread old", "limit");
  out << line;
  std::vector<std::string> slower;
  bool any_incorrect = false;
  for (const BuildCell& c : cells) {
    std::snprintf(line, sizeof line, "%7s  %-8s %9.1f %9.1f  %8.3f  %10.3f  %10.3f  %7.3f%c%s\n",
                  format_bytes(c.bytes).c_str(), c.impl.c_str(), c.new_us, c.old_us, c.ratio,
                  c.new_spread, c.old_spread, c.limit, c.correct ? ' ' : '!',
                  c.slower ? " SLOWER" : "");
    out << line;
    any_incorrect = any_incorrect || !c.correct;
    if (c.slower) slower.push_back(c.impl + " " + format_bytes(c.bytes));
  }
  if (any_incorrect) out << "# !: a run's result check failed there\n";
  if (slower.empty()) {
    out << "# np=" << np << ": no cell slower by more than " << kSlowerTolerance * 100
        << " % beyond the spread\n";
  } else {
    out << "# np=" << np << ": " << slower.size() << " cell(s) slower by more than "
        << kSlowerTolerance * 100 << " % beyond the spread:";
    for (std::size_t i = 0; i < slower.size(); ++i) out << (i == 0 ? " " : ", ") << slower[i];
    out << "\n";
  }
  out << std::flush;
}

}  // namespace kf::tools::bench
