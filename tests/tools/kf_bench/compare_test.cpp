// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/compare.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kf-bench/lib/compare_cli.hpp"
#include "kf-bench/lib/svg_plot.hpp"

namespace kf::tools::bench {
namespace {

using Json = nlohmann::ordered_json;

Json row(std::size_t bytes, double median_us, bool correct = true, double p90_us = -1) {
  return Json{{"op", "allreduce"},
              {"algo", "x"},
              {"np", 2},
              {"bytes", bytes},
              {"median_us", median_us},
              {"p90_us", p90_us < 0 ? median_us : p90_us},
              {"correct", correct}};
}

RunRows run(const std::string& impl, int np, int round, std::vector<Json> rows) {
  return RunRows{impl, np, round, std::move(rows)};
}

TEST(CompareParseRowLine, ReadsRowsWithAndWithoutKfrunPrefix) {
  const std::string json = row(4096, 12.5).dump();
  const auto plain = parse_row_line(json);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->value("bytes", 0u), 4096u);
  const auto prefixed = parse_row_line("[0] " + json + "\r");
  ASSERT_TRUE(prefixed.has_value());
  EXPECT_DOUBLE_EQ(prefixed->value("median_us", 0.0), 12.5);
  EXPECT_TRUE(parse_row_line("   " + json).has_value());
}

TEST(CompareParseRowLine, SkipsOtherRanksAndOtherLines) {
  const std::string json = row(4, 1.0).dump();
  EXPECT_FALSE(parse_row_line("[1] " + json).has_value());
  EXPECT_FALSE(parse_row_line("[12] " + json).has_value());
  EXPECT_FALSE(parse_row_line("[x] " + json).has_value());
  EXPECT_FALSE(parse_row_line("[0]" + json).has_value());
  EXPECT_FALSE(parse_row_line("# kf-bench allreduce: np=2").has_value());
  EXPECT_FALSE(parse_row_line("[0] kfrun: worker 1 exited").has_value());
  EXPECT_FALSE(parse_row_line("{\"bytes\": 4, \"median_us\": ").has_value());
  EXPECT_FALSE(parse_row_line("{\"bytes\": 4, \"median_us\": 1.0}").has_value());  // no correct
  EXPECT_FALSE(parse_row_line("{\"bytes\": -4, \"median_us\": 1, \"correct\": true}"));
  EXPECT_FALSE(
      parse_row_line("{\"bytes\": 4, \"median_us\": 1, \"p90_us\": \"2\", \"correct\": true}"));
  EXPECT_FALSE(parse_row_line("").has_value());
}

TEST(CompareParseRows, KeepsRankZeroRowsInOrder) {
  const std::string out = "[0] " + row(4, 1).dump() + "\n[1] " + row(4, 9).dump() + "\nnoise\n" +
                          row(64, 2).dump();  // last line without a newline
  const auto rows = parse_rows(out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].value("bytes", 0u), 4u);
  EXPECT_EQ(rows[1].value("bytes", 0u), 64u);
}

TEST(CompareAggregate, TakesTheMedianOverRounds) {
  const std::size_t mib = 1 << 20;
  const auto points = aggregate({
      run("kf", 2, 1, {row(mib, 1000, true, 1500), row(4, 10)}),
      run("kf", 2, 2, {row(mib, 3000, true, 3100), row(4, 30)}),
      run("kf", 2, 3, {row(mib, 2000, true, 2500), row(4, 20, false)}),
  });
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].bytes, 4u);  // ordered by bytes
  EXPECT_DOUBLE_EQ(points[0].median_us, 20);
  EXPECT_FALSE(points[0].correct);
  const Point& large = points[1];
  EXPECT_EQ(large.np, 2);
  EXPECT_EQ(large.impl, "kf");
  EXPECT_EQ(large.runs, 3);
  EXPECT_DOUBLE_EQ(large.median_us, 2000);
  EXPECT_DOUBLE_EQ(large.p90_us, 2500);
  EXPECT_TRUE(large.correct);
  EXPECT_DOUBLE_EQ(large.algbw_gbps, mib / 2000e3);
  EXPECT_DOUBLE_EQ(large.busbw_gbps, large.algbw_gbps);  // 2(n-1)/n = 1 for n = 2
}

TEST(CompareAggregate, OrdersByNpThenKnownImplementationOrder) {
  const auto points = aggregate({
      run("gloo-ring", 4, 1, {row(4, 5)}),
      run("mpi-shm", 2, 1, {row(4, 5)}),
      run("kf-tcp", 2, 1, {row(4, 5)}),
      run("kf", 4, 1, {row(4, 8)}),
  });
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[0].impl, "kf-tcp");
  EXPECT_EQ(points[1].impl, "mpi-shm");
  EXPECT_EQ(points[2].impl, "kf");
  EXPECT_EQ(points[3].impl, "gloo-ring");
  EXPECT_DOUBLE_EQ(points[2].busbw_gbps, points[2].algbw_gbps * 1.5);  // 2(n-1)/n for n = 4
}

TEST(CompareBestBaseline, PicksTheFastestCorrectBaselineOfTheClass) {
  const auto points = aggregate({
      run("kf", 2, 1, {row(64, 20)}), run("kf-tcp", 2, 1, {row(64, 30)}),
      run("mpi-tcp", 2, 1, {row(64, 60)}), run("mpi-shm", 2, 1, {row(64, 10)}),
      run("gloo-ring", 2, 1, {row(64, 40)}),
      run("gloo-ring_chunked", 2, 1, {row(64, 5, false)}),  // fastest, but wrong
  });
  const auto tcp = best_baseline(points, 2, 64, TransportClass::tcp);
  ASSERT_TRUE(tcp.has_value());
  EXPECT_EQ(tcp->impl, "gloo-ring");
  EXPECT_DOUBLE_EQ(tcp->ratio, 30.0 / 40.0);
  const auto local = best_baseline(points, 2, 64, TransportClass::local);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->impl, "mpi-shm");
  EXPECT_DOUBLE_EQ(local->ratio, 2.0);
  EXPECT_FALSE(best_baseline(points, 4, 64, TransportClass::tcp).has_value());
  EXPECT_FALSE(best_baseline(points, 2, 4, TransportClass::tcp).has_value());
}

TEST(CompareBestBaseline, KfUnixIsKfNotABaseline) {
  const auto points = aggregate({run("kf", 2, 1, {row(64, 20)}), run("kf-unix", 2, 1, {row(64, 5)}),
                                 run("mpi-shm", 2, 1, {row(64, 10)})});
  const auto local = best_baseline(points, 2, 64, TransportClass::local);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->impl, "mpi-shm");
  EXPECT_TRUE(is_kf("kf-unix"));
  EXPECT_FALSE(is_kf("mpi-shm"));
}

TEST(CompareBestBaseline, NeedsKfAndABaseline) {
  const auto only_kf = aggregate({run("kf", 2, 1, {row(4, 2)}), run("kf-tcp", 2, 1, {row(4, 3)})});
  EXPECT_FALSE(best_baseline(only_kf, 2, 4, TransportClass::tcp).has_value());
  EXPECT_FALSE(best_baseline(only_kf, 2, 4, TransportClass::local).has_value());
  const auto no_kf = aggregate({run("mpi-tcp", 2, 1, {row(4, 2)})});
  EXPECT_FALSE(best_baseline(no_kf, 2, 4, TransportClass::tcp).has_value());
}

TEST(CompareTables, ShowEveryImplementationAndTheRatios) {
  const std::size_t mib = 1 << 20;
  const auto points = aggregate({
      run("kf", 2, 1, {row(mib, 1000), row(4, 10)}),
      run("kf-tcp", 2, 1, {row(mib, 2000), row(4, 20)}),
      run("gloo-halving_doubling", 2, 1, {row(mib, 4000), row(4, 40, false)}),
  });
  std::ostringstream out;
  print_tables(out, points, 2, 1);
  const std::string text = out.str();
  EXPECT_NE(text.find("gloo-hd"), std::string::npos) << text;
  EXPECT_NE(text.find("1M"), std::string::npos) << text;
  EXPECT_NE(text.find("0.50 (gloo-halving_doubling)"), std::string::npos) << text;
  EXPECT_NE(text.find("!"), std::string::npos) << text;  // the incorrect 4-byte row
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 140u) << line;
  std::ostringstream none;
  print_tables(none, points, 4, 1);
  EXPECT_NE(none.str().find("no results"), std::string::npos);
  EXPECT_NE(text.find("no copy rate measured"), std::string::npos) << text;

  // With the copy rate measured in the run, kf's algbw is shown as a fraction of it.
  std::ostringstream with_copy;
  print_tables(with_copy, points, 2, 1, CopyRate{2, std::size_t{64} << 20, 2.0});
  const std::string copy_text = with_copy.str();
  EXPECT_NE(copy_text.find("2.00 GB/s (memcpy of 64M per thread, 2 at once, this run)"),
            std::string::npos)
      << copy_text;
  EXPECT_NE(copy_text.find("   1.049   0.52"), std::string::npos) << copy_text;  // kf at 1 MiB
}

TEST(CopyRate, MeasuresEveryThreadsCopiesAndRefusesNothingToDo) {
  const CopyRate r = measure_copy_rate(std::size_t{1} << 20, 2, 2);
  EXPECT_EQ(r.threads, 2);
  EXPECT_EQ(r.bytes, std::size_t{1} << 20);
  EXPECT_GT(r.gbps, 0.0);
  EXPECT_THROW(measure_copy_rate(0, 1, 1), std::invalid_argument);
  EXPECT_THROW(measure_copy_rate(64, 0, 1), std::invalid_argument);
  EXPECT_THROW(measure_copy_rate(64, 1, 0), std::invalid_argument);
}

// kf-tcp-nomac is kf's, not a baseline; its table gives both against the best TCP baseline and
// the MACs' share of kf-tcp's time.
TEST(CompareTables, ShowTheFrameMacsCostWhenKfRanWithoutThem) {
  const auto points = aggregate({
      run("kf-tcp", 2, 1, {row(4, 20)}),
      run("kf-tcp-nomac", 2, 1, {row(4, 15)}),
      run("mpi-tcp", 2, 1, {row(4, 16)}),
  });
  EXPECT_TRUE(is_kf("kf-tcp-nomac"));
  const auto off = best_baseline(points, 2, 4, TransportClass::tcp, "kf-tcp-nomac");
  ASSERT_TRUE(off.has_value());
  EXPECT_EQ(off->impl, "mpi-tcp");
  EXPECT_DOUBLE_EQ(off->ratio, 15.0 / 16.0);
  std::ostringstream out;
  print_tables(out, points, 2, 1);
  const std::string text = out.str();
  EXPECT_NE(text.find("the frame MACs over TCP"), std::string::npos) << text;
  EXPECT_NE(text.find("1.25 (mpi-tcp)"), std::string::npos) << text;
  EXPECT_NE(text.find("0.94 (mpi-tcp)"), std::string::npos) << text;
  EXPECT_NE(text.find("25%"), std::string::npos) << text;
  std::ostringstream without;
  print_tables(without, aggregate({run("kf-tcp", 2, 1, {row(4, 20)})}), 2, 1);
  EXPECT_EQ(without.str().find("frame MACs"), std::string::npos) << without.str();
}

// kf-shared is kf's, not a baseline; its table gives it against the best local baseline and
// against kf with heap buffers, with its algbw against the copy rate.
TEST(CompareTables, ShowKfWithSharedMemoryBuffersWhenItRan) {
  const std::size_t mib = 1 << 20;
  const auto points = aggregate({
      run("kf", 2, 1, {row(mib, 1000)}),
      run("kf-shared", 2, 1, {row(mib, 500)}),
      run("mpi-shm", 2, 1, {row(mib, 800)}),
  });
  const auto local = best_baseline(points, 2, mib, TransportClass::local);
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->impl, "mpi-shm") << "kf-shared must not count as a baseline";
  std::ostringstream out;
  print_tables(out, points, 2, 1, CopyRate{2, std::size_t{64} << 20, 2.0});
  const std::string text = out.str();
  EXPECT_NE(text.find("kf-shared (buffers in kf::SharedMemory"), std::string::npos) << text;
  EXPECT_NE(text.find("0.62 (mpi-shm)"), std::string::npos) << text;   // 500 / 800
  EXPECT_NE(text.find("          0.50"), std::string::npos) << text;   // 500 / 1000
  EXPECT_NE(text.find("   2.097   1.05"), std::string::npos) << text;  // algbw, /copy
  std::istringstream lines(text.substr(text.find("kf-shared (buffers")));
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 140u) << line;
  std::ostringstream without;
  print_tables(without, aggregate({run("kf", 2, 1, {row(mib, 1000)})}), 2, 1);
  EXPECT_EQ(without.str().find("kf-shared"), std::string::npos) << without.str();
}

TEST(CompareCommands, KfRunsUnderKfrunWithItsTransportChosen) {
  Binaries bin{"/b/kf-bench", "/b/kfrun", "/u/mpirun", "/b/kf-bench-mpi", "/b/kf-bench-gloo"};
  const auto kf = commands_for(RunRequest{"kf", 4, {4, 65536}, 7, 1, {}}, bin);
  ASSERT_EQ(kf.size(), 1u);
  const auto& argv = kf[0].argv;
  EXPECT_EQ(argv[0], "/b/kfrun");
  EXPECT_NE(std::find(argv.begin(), argv.end(), "/b/kf-bench"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "4,65536"), argv.end());
  EXPECT_NE(std::find(argv.begin(), argv.end(), "--json"), argv.end());
  ASSERT_EQ(kf[0].env.size(), 2u);
  EXPECT_EQ(kf[0].env[0].name, "KF_TRANSPORT");
  EXPECT_FALSE(kf[0].env[0].value.has_value());
  EXPECT_EQ(kf[0].env[1].name, "KF_FRAME_AUTH");
  EXPECT_FALSE(kf[0].env[1].value.has_value());  // unset: MACs on, whatever compare was given
  const auto tcp = commands_for(RunRequest{"kf-tcp", 2, {4}, {}, 1, {}}, bin);
  ASSERT_EQ(tcp[0].env.size(), 2u);
  EXPECT_EQ(tcp[0].env[0].value, "tcp");
  EXPECT_FALSE(tcp[0].env[1].value.has_value());
  EXPECT_EQ(std::find(tcp[0].argv.begin(), tcp[0].argv.end(), "--iters"), tcp[0].argv.end());
  const auto nomac = commands_for(RunRequest{"kf-tcp-nomac", 2, {4}, {}, 1, {}}, bin);
  ASSERT_EQ(nomac[0].env.size(), 2u);
  EXPECT_EQ(nomac[0].env[0].value, "tcp");
  EXPECT_EQ(nomac[0].env[1].value, "off");
  const auto unix_socket = commands_for(RunRequest{"kf-unix", 2, {4}, {}, 1, {}}, bin);
  ASSERT_EQ(unix_socket[0].env.size(), 2u);
  EXPECT_EQ(unix_socket[0].env[0].value, "unix");
  EXPECT_EQ(std::find(unix_socket[0].argv.begin(), unix_socket[0].argv.end(), "--memory"),
            unix_socket[0].argv.end());
  // kf-shared: kf's default transport, with its buffers in kf::SharedMemory.
  const auto shared = commands_for(RunRequest{"kf-shared", 2, {4}, {}, 1, {}}, bin);
  ASSERT_EQ(shared[0].env.size(), 2u);
  EXPECT_FALSE(shared[0].env[0].value.has_value());
  const auto memory = std::find(shared[0].argv.begin(), shared[0].argv.end(), "--memory");
  ASSERT_NE(memory, shared[0].argv.end());
  ASSERT_NE(memory + 1, shared[0].argv.end());
  EXPECT_EQ(*(memory + 1), "shared");
  EXPECT_TRUE(is_kf("kf-shared"));
}

TEST(CompareCommands, BaselinesUseTheirTransports) {
  Binaries bin{"/b/kf-bench", "/b/kfrun", "/u/mpirun", "/b/kf-bench-mpi", "/b/kf-bench-gloo"};
  const auto shm = commands_for(RunRequest{"mpi-shm", 2, {4}, {}, 1, {}}, bin);
  ASSERT_EQ(shm.size(), 1u);
  EXPECT_EQ(shm[0].argv[0], "/u/mpirun");
  EXPECT_NE(std::find(shm[0].argv.begin(), shm[0].argv.end(), "vader,self"), shm[0].argv.end());
  EXPECT_NE(std::find(shm[0].argv.begin(), shm[0].argv.end(), "mpi-shm"), shm[0].argv.end());
  const auto mtcp = commands_for(RunRequest{"mpi-tcp", 2, {4}, {}, 1, {}}, bin);
  EXPECT_NE(std::find(mtcp[0].argv.begin(), mtcp[0].argv.end(), "tcp,self"), mtcp[0].argv.end());
  const auto gloo = commands_for(RunRequest{"gloo-ring_chunked", 3, {4}, {}, 1, "/tmp/s"}, bin);
  ASSERT_EQ(gloo.size(), 3u);
  for (std::size_t r = 0; r < gloo.size(); ++r) {
    const auto& argv = gloo[r].argv;
    EXPECT_EQ(argv[0], "/b/kf-bench-gloo");
    const auto rank = std::find(argv.begin(), argv.end(), "--rank");
    ASSERT_NE(rank, argv.end());
    EXPECT_EQ(*(rank + 1), std::to_string(r));  // rank 0 first: it prints the rows
    EXPECT_NE(std::find(argv.begin(), argv.end(), "ring_chunked"), argv.end());
    EXPECT_NE(std::find(argv.begin(), argv.end(), "/tmp/s"), argv.end());
  }
}

TEST(CompareCommands, MissingExecutablesAreNamed) {
  Binaries bin{"/b/kf-bench", "/b/kfrun", "", "/b/kf-bench-mpi", ""};
  EXPECT_EQ(missing_executable("kf", bin), "");
  EXPECT_EQ(missing_executable("mpi-tcp", bin), "mpirun");
  EXPECT_EQ(missing_executable("gloo-ring", bin), "kf-bench-gloo");
  bin.kfrun.clear();
  EXPECT_EQ(missing_executable("kf-tcp", bin), "kfrun");
}

TEST(CompareCommands, ASkippedBaselineSaysHowToGetIt) {
  const std::string line = skip_line("mpi-shm", "kf-bench-mpi");
  EXPECT_EQ(line.rfind("# skipping mpi-shm: kf-bench-mpi not found (", 0), 0u) << line;
  EXPECT_NE(line.find("tools/install-deps --bench"), std::string::npos) << line;
  EXPECT_NE(line.find("meson setup --reconfigure build"), std::string::npos) << line;
  EXPECT_EQ(line.back(), '\n');
}

TEST(CompareBinaries, FoundBesideTheBuildTreeThenOnPath) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("compare_test." + std::to_string(::getpid()));
  fs::remove_all(root);
  const auto make_exe = [](const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "#!/bin/sh\n";
    fs::permissions(p, fs::perms::owner_all);
  };
  make_exe(root / "tools/kf-bench/kf-bench");
  make_exe(root / "tools/kfrun/kfrun");
  make_exe(root / "tools/bench/baselines/kf-bench-gloo");
  make_exe(root / "bin/mpirun");
  make_exe(root / "bin/kf-bench-mpi");
  const Binaries bin = find_binaries((root / "tools/kf-bench/kf-bench").string(),
                                     "/nonexistent:" + (root / "bin").string());
  EXPECT_EQ(bin.kfrun, (root / "tools/kfrun/kfrun").string());
  EXPECT_EQ(bin.kf_bench_gloo, (root / "tools/bench/baselines/kf-bench-gloo").string());
  EXPECT_EQ(bin.kf_bench_mpi, (root / "bin/kf-bench-mpi").string());
  EXPECT_EQ(bin.mpirun, (root / "bin/mpirun").string());
  const Binaries none = find_binaries((root / "bin/kf-bench").string(), "");
  EXPECT_EQ(none.kfrun, "");
  fs::remove_all(root);
}

TEST(CompareAnnotatedRow, AddsImplClassRoundAndNp) {
  const RunRows r = run("mpi-shm", 4, 3, {});
  const Json j = annotated_row(row(4, 1), r);
  EXPECT_EQ(j.value("impl", ""), "mpi-shm");
  EXPECT_EQ(j.value("class", ""), "local");
  EXPECT_EQ(j.value("round", 0), 3);
  EXPECT_EQ(j.value("np", 0), 4);
  EXPECT_EQ(j.value("bytes", 0u), 4u);
  EXPECT_EQ(annotated_row(row(4, 1), run("gloo-ring", 2, 1, {})).value("class", ""), "tcp");
  EXPECT_EQ(j.value("method", ""), "barrier");
  RunRows b2b = run("kf", 2, 1, {});
  b2b.method = Method::back_to_back;
  EXPECT_EQ(annotated_row(row(4, 1), b2b).value("method", ""), "back-to-back");
}

// Back-to-back is asked of every benchmark alike, and only when wanted (an older build's
// kf-bench knows the barrier method alone).
TEST(CompareCommands, BackToBackIsPassedToEveryBenchmark) {
  const Binaries bin{"/b/kf-bench", "/b/kfrun", "/usr/bin/mpirun", "/b/kf-bench-mpi",
                     "/b/kf-bench-gloo"};
  for (const char* impl : {"kf", "kf-tcp", "mpi-shm", "mpi-tcp", "gloo-ring"}) {
    RunRequest r{impl, 2, {4}, {}, 1, "/tmp/s"};
    for (const auto& c : commands_for(r, bin)) {
      EXPECT_EQ(std::find(c.argv.begin(), c.argv.end(), "--method"), c.argv.end()) << impl;
    }
    r.method = Method::back_to_back;
    r.calls = 7;
    for (const auto& c : commands_for(r, bin)) {
      const auto m = std::find(c.argv.begin(), c.argv.end(), "--method");
      ASSERT_NE(m, c.argv.end()) << impl;
      ASSERT_GE(c.argv.end() - m, 4) << impl;
      EXPECT_EQ(*(m + 1), "back-to-back") << impl;
      EXPECT_EQ(*(m + 2), "--calls") << impl;
      EXPECT_EQ(*(m + 3), "7") << impl;
    }
  }
}

// The tags of `svg` nest properly and there is one root element (a small XML check: no
// comments, CDATA or '>' inside attribute values in what svg_plot writes).
bool well_formed(const std::string& svg, std::string& why) {
  std::vector<std::string> open;
  int roots = 0;
  for (std::size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const std::size_t end = svg.find('>', at);
    if (end == std::string::npos) return why = "unterminated tag", false;
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.starts_with('?')) continue;
    if (tag.starts_with('/')) {
      if (open.empty() || open.back() != tag.substr(1)) return why = "stray </" + tag, false;
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (open.empty()) ++roots;
    if (!tag.ends_with('/')) open.push_back(name);
  }
  if (!open.empty()) return why = "unclosed <" + open.back(), false;
  if (roots != 1) return why = std::to_string(roots) + " root elements", false;
  return true;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// A coordinate printed from NaN or infinity ("dominant-baseline" contains "nan" too).
bool has_non_finite_number(const std::string& svg) {
  for (const char* bad : {"nan\"", "nan,", "nan ", "inf\"", "inf,", "inf "}) {
    if (svg.find(bad) != std::string::npos) return true;
  }
  return false;
}

TEST(SvgPlot, WritesAWellFormedDocumentWithOnePolylinePerSeries) {
  Plot plot;
  plot.title = "busbw <np=2> & more";
  plot.x_label = "bytes";
  plot.y_label = "GB/s";
  plot.series = {
      {"kf", {{4, 0.001}, {4096, 0.1}, {1 << 20, 1.2}, {64 << 20, 2.5}}, false},
      {"gloo-ring", {{4, 0.0005}, {64 << 20, 1.9}}, true},
      {"empty", {}, false},
  };
  const std::string svg = svg_plot(plot);
  std::string why;
  EXPECT_TRUE(well_formed(svg, why)) << why << "\n" << svg;
  EXPECT_EQ(count(svg, "<polyline"), 3u);
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_NE(svg.find("busbw &lt;np=2&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("<np=2>"), std::string::npos);
  EXPECT_NE(svg.find(">64M<"), std::string::npos);  // log2 x axis labels
  EXPECT_NE(svg.find(">1K<"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 6u + 3u);  // a marker per point, one per legend entry
  EXPECT_FALSE(has_non_finite_number(svg)) << svg;
}

TEST(SvgPlot, HandlesNoDataAndASinglePoint) {
  std::string why;
  const std::string empty = svg_plot(Plot{});
  EXPECT_TRUE(well_formed(empty, why)) << why;
  Plot one;
  one.series = {{"zero", {{4, 0}}, false}};
  const std::string single = svg_plot(one);
  EXPECT_TRUE(well_formed(single, why)) << why;
  EXPECT_EQ(count(single, "<polyline"), 1u);
  EXPECT_FALSE(has_non_finite_number(single)) << single;
  EXPECT_FALSE(has_non_finite_number(empty)) << empty;
}

TEST(CompareCli, ParsesAndNamesTheOptionOfABadValue) {
  const auto parse = [](std::vector<std::string> args, CompareCommand& c) {
    CLI::App app;
    add_compare_command(app, c);
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
    app.parse(args);
  };
  CompareCommand good;
  parse({"compare", "--impl", "kf,gloo-ring", "--np", "2,3", "--sizes", "4,1K", "--rounds", "2",
         "--iters", "5", "--out", "/tmp/x", "--timeout-s", "9"},
        good);
  const CompareOptions o = compare_options(good);
  EXPECT_EQ(o.impls, (std::vector<std::string>{"kf", "gloo-ring"}));
  EXPECT_EQ(o.nps, (std::vector<int>{2, 3}));
  EXPECT_EQ(o.sizes, (std::vector<std::size_t>{4, 1024}));
  EXPECT_EQ(o.rounds, 2);
  EXPECT_EQ(o.iters, 5);
  EXPECT_EQ(o.out_dir, "/tmp/x");
  EXPECT_EQ(o.timeout_s, 9);
  CompareCommand defaults;
  parse({"compare"}, defaults);
  EXPECT_EQ(compare_options(defaults).sizes,
            (std::vector<std::size_t>{4, 4096, 65536, 1 << 20, 16 << 20, 64 << 20}));
  EXPECT_EQ(compare_options(defaults).nps, (std::vector<int>{2, 4}));

  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--np", "1"}, {"--impl", "nccl"}, {"--sizes", "4,12Q"}, {"--rounds", "0"}}) {
    CompareCommand c;
    try {
      parse({"compare", option, value}, c);
      ADD_FAILURE() << option << " " << value << " was accepted";
    } catch (const CLI::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kf::tools::bench
