// SPDX-License-Identifier: Apache-2.0
// kf-bench compare --against DIR: this build's kf beside another build's, in the same rounds.
// Each of kf's implementations chosen (kf, kf-unix, kf-tcp) also runs as "<impl>@old" from the
// other build's kfrun and kf-bench, which load that build's libkf through their own RUNPATH.
// In every round the two of a pair run one right after the other, which one first alternating
// from round to round, so that neither always meets the machine as the other left it. Per
// (np, size, implementation) the report gives new/old of the medians over the rounds and each
// side's run-to-run spread, and flags a cell where new is slower by more than the tolerance on
// top of that spread.
// Thread-safety: pure functions, except find_other_build() (reads the file system).
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kf-bench/lib/compare.hpp"
#include "kf-bench/lib/spawn.hpp"

namespace kf::tools::bench {

/// How much slower than the run-to-run spread allows new may be before its cell is flagged.
inline constexpr double kSlowerTolerance = 0.05;

/// The executables of a kf build.
struct OtherBuild {
  std::string dir;       ///< as given
  std::string kf_bench;  ///< "" when not found
  std::string kfrun;     ///< "" when not found
  std::string lib_dir;   ///< its libkf's directory in a build tree; "" otherwise
};

/// The kf-bench and kfrun of the build in `dir`: a build tree (tools/kf-bench/kf-bench,
/// tools/kfrun/kfrun, libkf/) or a directory holding both executables (an installed bindir).
OtherBuild find_other_build(const std::string& dir);

/// What `build` lacks, naming where each missing executable was looked for; "" when complete.
std::string missing_in_build(const OtherBuild& build);

/// The library directory of the build that `self` (a kf-bench executable) belongs to, when it
/// is a build tree: ../../libkf from it; else "".
std::string own_lib_dir(const std::string& self);

/// The change to LD_LIBRARY_PATH that makes a kf run load `lib_dir`'s libkf: none while
/// LD_LIBRARY_PATH is unset or empty (each build's RUNPATH then finds its own), else `lib_dir`
/// in front, since LD_LIBRARY_PATH overrides a RUNPATH and would give both sides one libkf.
std::optional<EnvChange> library_path_change(std::string_view lib_dir,
                                             std::optional<std::string_view> ld_library_path);

/// The implementations to run: `impls` with "<impl>@old" right after each of kf's.
std::vector<std::string> with_other_build(const std::vector<std::string>& impls);

/// The order of `impls` (as from with_other_build) in round `round` (from 1): as given in odd
/// rounds; in even rounds each "<impl>@old" before its "<impl>".
std::vector<std::string> round_order(const std::vector<std::string>& impls, int round);

/// A side's run-to-run spread at a point: its slowest per-round median over its fastest
/// (1 for one round, or when the times are not positive).
double spread_of(const Point& p) noexcept;

/// Whether new is slower than old by more than `tolerance` beyond the run-to-run spread:
/// ratio (new/old) > (1 + tolerance) x the larger of the two spreads.
bool slower_beyond_spread(double ratio, double new_spread, double old_spread,
                          double tolerance = kSlowerTolerance) noexcept;

/// One (np, size, implementation) of this build against the other.
struct BuildCell {
  int np = 0;
  std::string impl;  ///< this build's name: "kf-tcp"
  std::size_t bytes = 0;
  double new_us = 0;  ///< median over the rounds
  double old_us = 0;
  double ratio = 0;  ///< new_us / old_us: > 1 when new is slower
  double new_spread = 1;
  double old_spread = 1;
  double limit = 0;      ///< the ratio above which the cell is flagged
  bool correct = false;  ///< every row of both sides was
  bool slower = false;   ///< ratio > limit
};

/// The cells of `np`, ordered by size, then implementation; a cell needs both sides with a
/// positive median.
std::vector<BuildCell> build_cells(const std::vector<Point>& points, int np,
                                   double tolerance = kSlowerTolerance);

/// The table of `np`'s cells and a line naming the flagged ones (or saying there are none).
/// `other_dir` names the other build in the heading.
void print_build_table(std::ostream& out, const std::vector<Point>& points, int np, int rounds,
                       std::string_view other_dir);

}  // namespace kf::tools::bench
