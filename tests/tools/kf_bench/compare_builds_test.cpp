// SPDX-License-Identifier: Apache-2.0
// kf-bench compare --against: the other build's names, order and executables, the ratio, spread
// and flag of each cell, and the option's validation; no process is started.
#include "kf-bench/lib/compare_builds.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kf-bench/lib/compare_cli.hpp"

namespace kf::tools::bench {
namespace {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

Json cell_row(std::size_t bytes, double median_us, bool correct = true) {
  return Json{{"bytes", bytes}, {"median_us", median_us}, {"correct", correct}};
}

// `impl`'s runs over the rounds at one size: one median per round.
std::vector<RunRows> rounds_of(const std::string& impl, int np, std::size_t bytes,
                               const std::vector<double>& medians, bool correct = true) {
  std::vector<RunRows> runs;
  for (std::size_t i = 0; i < medians.size(); ++i) {
    runs.push_back(
        RunRows{impl, np, static_cast<int>(i) + 1, {cell_row(bytes, medians[i], correct)}});
  }
  return runs;
}

std::vector<RunRows> concat(std::initializer_list<std::vector<RunRows>> parts) {
  std::vector<RunRows> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

TEST(CompareBuildsNames, OldSuffixIsAddedAndStripped) {
  EXPECT_EQ(other_build_impl("kf-tcp"), "kf-tcp@old");
  EXPECT_TRUE(is_other_build("kf@old"));
  EXPECT_FALSE(is_other_build("kf"));
  EXPECT_FALSE(is_other_build("@old"));
  EXPECT_EQ(base_impl("kf-unix@old"), "kf-unix");
  EXPECT_EQ(base_impl("mpi-shm"), "mpi-shm");
}

TEST(CompareBuildsOrder, TwinsFollowKfImplementationsOnly) {
  EXPECT_EQ(
      with_other_build({"kf", "kf-tcp", "mpi-tcp", "gloo-ring"}),
      (std::vector<std::string>{"kf", "kf@old", "kf-tcp", "kf-tcp@old", "mpi-tcp", "gloo-ring"}));
  EXPECT_EQ(with_other_build({"mpi-shm"}), (std::vector<std::string>{"mpi-shm"}));
}

TEST(CompareBuildsOrder, EvenRoundsRunTheOldBuildFirst) {
  const std::vector<std::string> impls{"kf", "kf@old", "kf-tcp", "kf-tcp@old", "mpi-tcp"};
  EXPECT_EQ(round_order(impls, 1), impls);
  EXPECT_EQ(round_order(impls, 3), impls);
  EXPECT_EQ(round_order(impls, 2),
            (std::vector<std::string>{"kf@old", "kf", "kf-tcp@old", "kf-tcp", "mpi-tcp"}));
  // Without twins the order is the same in every round.
  const std::vector<std::string> plain{"kf", "kf-unix", "mpi-shm"};
  EXPECT_EQ(round_order(plain, 2), plain);
}

TEST(CompareBuildsAggregate, KeepsTheFastestAndSlowestRoundAndOrdersTwinsBesideTheirImpl) {
  const auto points = aggregate(concat({
      rounds_of("mpi-tcp", 2, 4, {9}),
      rounds_of("kf-tcp@old", 2, 4, {5}),
      rounds_of("kf@old", 2, 4, {3}),
      rounds_of("kf-tcp", 2, 4, {4}),
      rounds_of("kf", 2, 4, {10, 14, 12}),
  }));
  ASSERT_EQ(points.size(), 5u);
  EXPECT_EQ(points[0].impl, "kf");
  EXPECT_EQ(points[1].impl, "kf@old");
  EXPECT_EQ(points[2].impl, "kf-tcp");
  EXPECT_EQ(points[3].impl, "kf-tcp@old");
  EXPECT_EQ(points[4].impl, "mpi-tcp");
  EXPECT_DOUBLE_EQ(points[0].median_us, 12);
  EXPECT_DOUBLE_EQ(points[0].min_us, 10);
  EXPECT_DOUBLE_EQ(points[0].max_us, 14);
  EXPECT_DOUBLE_EQ(spread_of(points[0]), 1.4);
  EXPECT_DOUBLE_EQ(spread_of(points[1]), 1.0);  // one round
  Point zero;
  EXPECT_DOUBLE_EQ(spread_of(zero), 1.0);
}

TEST(CompareBuildsFlag, SlowerOnlyBeyondTheToleranceOnTopOfTheLargerSpread) {
  EXPECT_TRUE(slower_beyond_spread(1.06, 1.0, 1.0));
  EXPECT_FALSE(slower_beyond_spread(1.04, 1.0, 1.0));
  // Limit 1.05 x 1.03 = 1.0815, whichever side's spread is the larger.
  EXPECT_FALSE(slower_beyond_spread(1.08, 1.03, 1.01));
  EXPECT_FALSE(slower_beyond_spread(1.08, 1.01, 1.03));
  EXPECT_TRUE(slower_beyond_spread(1.09, 1.01, 1.03));
  EXPECT_FALSE(slower_beyond_spread(0.5, 1.0, 1.0));
  EXPECT_TRUE(slower_beyond_spread(1.02, 1.0, 1.0, 0.01));
  // A spread below 1 (not produced by spread_of) does not tighten the limit.
  EXPECT_FALSE(slower_beyond_spread(1.04, 0.5, 0.5));
}

TEST(CompareBuildsCells, RatioSpreadLimitAndFlagPerSizeAndImplementation) {
  const auto points = aggregate(concat({
      // kf at 4 B: new 20 (spread 22/18), old 10 (spread 1.1): 2x slower, flagged.
      rounds_of("kf", 2, 4, {18, 20, 22}),
      rounds_of("kf@old", 2, 4, {10, 11, 10}),
      // kf at 64 KiB: 3 % slower, within the tolerance.
      rounds_of("kf", 2, 65536, {103, 103, 103}),
      rounds_of("kf@old", 2, 65536, {100, 100, 100}),
      // kf-tcp at 4 B: 10 % slower, but old's rounds spread by 20 %.
      rounds_of("kf-tcp", 2, 4, {33, 33, 33}),
      rounds_of("kf-tcp@old", 2, 4, {25, 30, 30}),
      // kf-unix ran on one side only: no cell.
      rounds_of("kf-unix", 2, 4, {5}),
      // A baseline: no cell.
      rounds_of("mpi-tcp", 2, 4, {1}),
      // Another np.
      rounds_of("kf", 4, 4, {1}),
      rounds_of("kf@old", 4, 4, {1}),
  }));
  const auto cells = build_cells(points, 2);
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_EQ(cells[0].impl, "kf");  // by size, then implementation
  EXPECT_EQ(cells[0].bytes, 4u);
  EXPECT_EQ(cells[1].impl, "kf-tcp");
  EXPECT_EQ(cells[1].bytes, 4u);
  EXPECT_EQ(cells[2].bytes, 65536u);

  EXPECT_DOUBLE_EQ(cells[0].new_us, 20);
  EXPECT_DOUBLE_EQ(cells[0].old_us, 10);
  EXPECT_DOUBLE_EQ(cells[0].ratio, 2.0);
  EXPECT_DOUBLE_EQ(cells[0].new_spread, 22.0 / 18.0);
  EXPECT_DOUBLE_EQ(cells[0].old_spread, 1.1);
  EXPECT_DOUBLE_EQ(cells[0].limit, 1.05 * 22.0 / 18.0);
  EXPECT_TRUE(cells[0].slower);
  EXPECT_TRUE(cells[0].correct);

  EXPECT_DOUBLE_EQ(cells[1].ratio, 1.1);
  EXPECT_DOUBLE_EQ(cells[1].old_spread, 1.2);
  EXPECT_FALSE(cells[1].slower);

  EXPECT_DOUBLE_EQ(cells[2].ratio, 1.03);
  EXPECT_DOUBLE_EQ(cells[2].limit, 1.05);
  EXPECT_FALSE(cells[2].slower);
  EXPECT_TRUE(build_cells(points, 8).empty());
}

TEST(CompareBuildsCells, AFailedCheckOnEitherSideMarksTheCell) {
  const auto points = aggregate(
      concat({rounds_of("kf-tcp", 2, 4, {10}), rounds_of("kf-tcp@old", 2, 4, {10}, false)}));
  const auto cells = build_cells(points, 2);
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_FALSE(cells[0].correct);
  std::ostringstream out;
  print_build_table(out, points, 2, 1, "/old");
  EXPECT_NE(out.str().find("!: a run's result check failed"), std::string::npos) << out.str();
}

TEST(CompareBuildsTable, NamesTheSlowerCellsAndTheOtherBuild) {
  const auto points = aggregate(concat({
      rounds_of("kf", 2, 65536, {30.75, 30.75}),
      rounds_of("kf@old", 2, 65536, {20, 21}),
      rounds_of("kf-tcp", 2, 65536, {20, 20}),
      rounds_of("kf-tcp@old", 2, 65536, {20, 20}),
  }));
  std::ostringstream out;
  print_build_table(out, points, 2, 2, "/builds/old");
  const std::string text = out.str();
  EXPECT_NE(text.find("against /builds/old (old)"), std::string::npos) << text;
  EXPECT_NE(text.find("1.500"), std::string::npos) << text;  // kf's new/old
  EXPECT_NE(text.find("1.050"), std::string::npos) << text;  // kf@old's spread
  EXPECT_NE(text.find("1 cell(s) slower by more than 5 % beyond the spread: kf 64K"),
            std::string::npos)
      << text;
  std::size_t flagged = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.ends_with(" SLOWER")) {
      ++flagged;
      EXPECT_NE(line.find(" kf "), std::string::npos) << line;
    }
    EXPECT_LE(line.size(), 140u) << line;
  }
  EXPECT_EQ(flagged, 1u) << text;

  const auto even =
      aggregate(concat({rounds_of("kf", 2, 4, {10}), rounds_of("kf@old", 2, 4, {10})}));
  std::ostringstream same;
  print_build_table(same, even, 2, 1, "/b");
  EXPECT_NE(same.str().find("no cell slower by more than 5 % beyond the spread"), std::string::npos)
      << same.str();
  EXPECT_NE(same.str().find("one round measures no spread"), std::string::npos) << same.str();
  EXPECT_EQ(same.str().find(" SLOWER\n"), std::string::npos) << same.str();
  std::ostringstream none;
  print_build_table(none, even, 4, 1, "/b");
  EXPECT_NE(none.str().find("no cell ran on both builds"), std::string::npos) << none.str();
}

TEST(CompareBuildsTable, TimeTableLabelsTheOldBuildsColumns) {
  const auto points =
      aggregate(concat({rounds_of("kf-unix", 2, 4, {10}), rounds_of("kf-unix@old", 2, 4, {11})}));
  std::ostringstream out;
  print_tables(out, points, 2, 1);
  EXPECT_NE(out.str().find("kf-unix@old"), std::string::npos) << out.str();
  const Plot plot = busbw_plot(points, 2);
  ASSERT_EQ(plot.series.size(), 2u);
  EXPECT_EQ(plot.series[1].name, "kf-unix@old");
}

TEST(CompareBuildsRows, AnOldBuildsRowKeepsItsNameAndGetsItsClass) {
  const Json j = annotated_row(cell_row(4, 1), RunRows{"kf-tcp@old", 2, 2, {}});
  EXPECT_EQ(j.value("impl", ""), "kf-tcp@old");
  EXPECT_EQ(j.value("class", ""), "tcp");
  EXPECT_EQ(annotated_row(cell_row(4, 1), RunRows{"kf@old", 2, 1, {}}).value("class", ""), "local");
}

TEST(CompareBuildsLibraryPath, ChangedOnlyWhenSetSinceItOverridesRunpath) {
  EXPECT_FALSE(library_path_change("/b/libkf", std::nullopt).has_value());
  EXPECT_FALSE(library_path_change("/b/libkf", "").has_value());
  EXPECT_FALSE(library_path_change("", "/x").has_value());
  const auto change = library_path_change("/b/libkf", "/x:/y");
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->name, "LD_LIBRARY_PATH");
  EXPECT_EQ(change->value, "/b/libkf:/x:/y");
}

// A scratch directory with executable files at the given relative paths.
class CompareBuildsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("compare_builds_test." + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void make_exe(const std::string& relative) {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "#!/bin/sh\n";
    fs::permissions(p, fs::perms::owner_all);
  }

  fs::path root_;
};

TEST_F(CompareBuildsDir, FindsABuildTree) {
  make_exe("tools/kf-bench/kf-bench");
  make_exe("tools/kfrun/kfrun");
  fs::create_directories(root_ / "libkf");
  const OtherBuild b = find_other_build(root_.string());
  EXPECT_EQ(b.kf_bench, (root_ / "tools/kf-bench/kf-bench").string());
  EXPECT_EQ(b.kfrun, (root_ / "tools/kfrun/kfrun").string());
  EXPECT_EQ(b.lib_dir, (root_ / "libkf").string());
  EXPECT_EQ(missing_in_build(b), "");
  EXPECT_EQ(own_lib_dir(b.kf_bench), (root_ / "libkf").string());
}

TEST_F(CompareBuildsDir, FindsADirectoryHoldingBothExecutables) {
  make_exe("kf-bench");
  make_exe("kfrun");
  const OtherBuild b = find_other_build(root_.string());
  EXPECT_EQ(b.kf_bench, (root_ / "kf-bench").string());
  EXPECT_EQ(b.kfrun, (root_ / "kfrun").string());
  EXPECT_EQ(b.lib_dir, "");
  EXPECT_EQ(missing_in_build(b), "");
  EXPECT_EQ(own_lib_dir(b.kf_bench), "");
}

TEST_F(CompareBuildsDir, NamesWhatIsMissingAndWhereItLooked) {
  make_exe("tools/kf-bench/kf-bench");
  std::ofstream(root_ / "kfrun") << "not executable\n";
  const std::string why = missing_in_build(find_other_build(root_.string()));
  EXPECT_NE(why.find("is not a kf build"), std::string::npos) << why;
  EXPECT_NE(why.find("kfrun not found (looked for " + (root_ / "tools/kfrun/kfrun").string() +
                     " and " + (root_ / "kfrun").string() + ")"),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("kf-bench not found"), std::string::npos) << why;

  const std::string empty = missing_in_build(find_other_build((root_ / "tools").string()));
  EXPECT_NE(empty.find("kf-bench not found"), std::string::npos) << empty;
  EXPECT_NE(empty.find("kfrun not found"), std::string::npos) << empty;

  const std::string absent = missing_in_build(find_other_build((root_ / "nothing").string()));
  EXPECT_NE(absent.find("is not a directory"), std::string::npos) << absent;
}

void parse(std::vector<std::string> args, CompareCommand& c) {
  CLI::App app;
  add_compare_command(app, c);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  app.parse(args);
}

// The ParseError's message of `args`, or "" when they parse.
std::string parse_error(const std::vector<std::string>& args) {
  CompareCommand c;
  try {
    parse(args, c);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return {};
}

TEST_F(CompareBuildsDir, AgainstTakesABuildAndRefusesADirectoryWithoutOne) {
  make_exe("tools/kf-bench/kf-bench");
  make_exe("tools/kfrun/kfrun");
  CompareCommand good;
  parse({"compare", "--impl", "kf-tcp,mpi-tcp", "--against", root_.string()}, good);
  EXPECT_EQ(compare_options(good).against, root_.string());
  CompareCommand all;
  parse({"compare", "--against", root_.string()}, all);  // every implementation, kf's included
  EXPECT_EQ(compare_options(all).against, root_.string());
  CompareCommand without;
  parse({"compare"}, without);
  EXPECT_EQ(compare_options(without).against, "");

  const std::string no_kf =
      parse_error({"compare", "--impl", "mpi-shm", "--against", root_.string()});
  EXPECT_NE(no_kf.find("--against"), std::string::npos) << no_kf;
  EXPECT_NE(no_kf.find("kf-tcp"), std::string::npos) << no_kf;

  const std::string missing = parse_error({"compare", "--against", (root_ / "tools").string()});
  EXPECT_NE(missing.find("--against"), std::string::npos) << missing;
  EXPECT_NE(missing.find("kfrun not found"), std::string::npos) << missing;
  EXPECT_NE(missing.find("kf-bench not found"), std::string::npos) << missing;
}

}  // namespace
}  // namespace kf::tools::bench
