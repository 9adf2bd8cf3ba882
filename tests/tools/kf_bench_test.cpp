// SPDX-License-Identifier: Apache-2.0
// kf-bench end to end: kfrun (path in $KFRUN) starts real kf-bench workers (path in $KF_BENCH)
// that measure collectives over TCP on 127.0.0.1; the tests parse rank 0's JSON rows and check
// that every row is complete and correct, and that bad arguments are usage errors (exit 2).
// kf-bench compare starts kfrun itself (found beside kf-bench in the build tree), for kf only, so
// that the test needs neither OpenMPI nor Gloo; --against runs this build beside itself.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Captured {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string env_path(const char* name) {
  const char* path = std::getenv(name);
  return path != nullptr ? path : "";
}

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
  std::fclose(f);
  return text;
}

// Runs argv[0] with its arguments, stdout and stderr captured in temporary files.
Captured run(std::vector<std::string> argv) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(::fileno(out), STDOUT_FILENO);
    ::dup2(::fileno(err), STDERR_FILENO);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(126);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Captured result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = read_all(out);
  result.err = read_all(err);
  return result;
}

// `kfrun -np N kf-bench ARGS...`
Captured run_bench(int np, const std::vector<std::string>& args) {
  std::vector<std::string> argv{env_path("KFRUN"), "-np", std::to_string(np), "--",
                                env_path("KF_BENCH")};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

// Rank 0's JSON rows; kfrun prefixes every output line with "[rank] ".
std::vector<nlohmann::json> rows_of(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    const std::string prefix = "[0] ";
    EXPECT_EQ(line.rfind(prefix, 0), 0u) << "a line not from rank 0: " << line;
    if (line.rfind(prefix, 0) != 0) continue;
    rows.push_back(nlohmann::json::parse(line.substr(prefix.size())));
  }
  return rows;
}

void expect_complete_and_correct(const nlohmann::json& row) {
  for (const char* key : {"op", "algo", "np", "dtype", "bytes", "count", "iters", "median_us",
                          "p90_us", "algbw_gbps", "busbw_gbps", "correct"}) {
    EXPECT_TRUE(row.contains(key)) << key << " missing in " << row.dump();
  }
  EXPECT_EQ(row.value("correct", false), true) << row.dump();
  EXPECT_GT(row.value("median_us", 0.0), 0.0) << row.dump();
  EXPECT_GE(row.value("p90_us", 0.0), row.value("median_us", 0.0)) << row.dump();
}

class KfBench : public ::testing::Test {
 protected:
  void SetUp() override {
    if (env_path("KFRUN").empty() || env_path("KF_BENCH").empty()) {
      GTEST_SKIP() << "KFRUN and KF_BENCH must name the kfrun and kf-bench executables";
    }
  }
};

TEST_F(KfBench, AllreduceOverEveryAlgorithmIsCorrect) {
  const Captured r = run_bench(
      2, {"allreduce", "--algo", "all", "--sizes", "4,1K,65537", "--iters", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto rows = rows_of(r.out);
  ASSERT_EQ(rows.size(), 21u) << r.out;
  std::set<std::string> algos;
  std::set<std::size_t> bytes;
  for (const auto& row : rows) {
    expect_complete_and_correct(row);
    EXPECT_EQ(row.value("op", ""), "allreduce");
    EXPECT_EQ(row.value("np", 0), 2);
    EXPECT_EQ(row.value("dtype", ""), "f32");
    EXPECT_EQ(row.value("iters", 0), 3);
    // 2(n-1)/n = 1 for two workers
    EXPECT_DOUBLE_EQ(row.value("busbw_gbps", -1.0), row.value("algbw_gbps", -2.0));
    const std::string algo = row.value("algo", "");
    algos.insert(algo.rfind("auto(", 0) == 0 ? "auto" : algo);
    bytes.insert(row.value("bytes", std::size_t{0}));
  }
  EXPECT_EQ(algos, (std::set<std::string>{"star", "ring", "tree", "clique", "rhd", "hierarchical",
                                          "auto"}));
  EXPECT_EQ(bytes, (std::set<std::size_t>{4, 1024, 65536}));  // 65537 rounds down to floats
}

// The back-to-back method on 2 and 3 workers: every sample's result checked after its calls;
// the rows say how they were timed.
TEST_F(KfBench, AllreduceBackToBackIsCorrect) {
  for (const int np : {2, 3}) {
    const Captured r = run_bench(np, {"allreduce", "--method", "back-to-back", "--calls", "4",
                                      "--sizes", "4,4K,1M", "--iters", "3", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto rows = rows_of(r.out);
    ASSERT_EQ(rows.size(), 3u) << r.out;
    for (const auto& row : rows) {
      expect_complete_and_correct(row);
      EXPECT_EQ(row.value("method", ""), "back-to-back") << row.dump();
      EXPECT_EQ(row.value("calls", 0), 4) << row.dump();
      EXPECT_EQ(row.value("np", 0), np) << row.dump();
    }
  }
  const Captured table =
      run_bench(2, {"allreduce", "--method", "back-to-back", "--sizes", "4", "--iters", "2"});
  ASSERT_EQ(table.exit_code, 0) << table.out << table.err;
  EXPECT_NE(table.out.find("method=back-to-back calls=10"), std::string::npos) << table.out;
  const Captured other = run_bench(2, {"allreduce", "--method", "back-to-back", "--dtype", "f64",
                                       "--sizes", "4", "--iters", "2"});
  EXPECT_EQ(other.exit_code, 2) << other.out << other.err;
  EXPECT_NE(other.err.find("f32 sum"), std::string::npos) << other.err;
}

// Buffers in kf::SharedMemory (--memory shared): results as correct as with heap buffers, both
// methods and a collective of each shape; rank 0 reads its peers' payloads too large for the
// rings (8 MiB allreduces) in place (its transport line), and nothing in place from heap buffers.
TEST_F(KfBench, SharedMemoryBuffersAreReadInPlaceAndCorrect) {
  auto in_place = [](const std::string& out) {
    const std::string key = "read in place from peers' shared memory: ";
    const auto at = out.find(key);
    return at == std::string::npos ? std::string("?") : out.substr(at + key.size(), 2);
  };
  for (const int np : {2, 3}) {
    const Captured b2b = run_bench(np, {"allreduce", "--method", "back-to-back", "--calls", "3",
                                        "--sizes", "4,8M", "--iters", "2", "--memory", "shared"});
    ASSERT_EQ(b2b.exit_code, 0) << b2b.out << b2b.err;
    EXPECT_EQ(b2b.out.find("false"), std::string::npos) << b2b.out;
    EXPECT_NE(in_place(b2b.out), "0 ") << b2b.out;
    EXPECT_NE(in_place(b2b.out), "?") << b2b.out;
    for (const std::string op : {"allreduce", "broadcast", "allgather"}) {
      const Captured r = run_bench(np, {op, "--algo", "all", "--sizes", "1K,2M", "--iters", "2",
                                        "--memory", "shared", "--json"});
      ASSERT_EQ(r.exit_code, 0) << op << ": " << r.out << r.err;
      for (const auto& row : rows_of(r.out)) expect_complete_and_correct(row);
    }
  }
  const Captured heap =
      run_bench(2, {"allreduce", "--method", "back-to-back", "--sizes", "8M", "--iters", "2"});
  ASSERT_EQ(heap.exit_code, 0) << heap.out << heap.err;
  EXPECT_EQ(in_place(heap.out), "0 ") << heap.out;
}

TEST_F(KfBench, ReduceScatterAndGatherAreCorrectOnThreeWorkers) {
  const Captured rs = run_bench(3, {"reduce-scatter", "--algo", "all", "--dtype", "bf16", "--op",
                                    "avg", "--sizes", "2,4099", "--iters", "2", "--json"});
  ASSERT_EQ(rs.exit_code, 0) << rs.out << rs.err;
  auto rows = rows_of(rs.out);
  ASSERT_EQ(rows.size(), 14u) << rs.out;
  for (const auto& row : rows) expect_complete_and_correct(row);

  const Captured g = run_bench(3, {"gather", "--algo", "ring,star", "--dtype", "u8", "--root", "2",
                                   "--sizes", "1,1000", "--iters", "2", "--json"});
  ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
  rows = rows_of(g.out);
  ASSERT_EQ(rows.size(), 4u) << g.out;
  for (const auto& row : rows) {
    expect_complete_and_correct(row);
    EXPECT_EQ(row.value("root", -1), 2);
  }
}

// --device: the device path of the measurement loop (copies in and out around each timed
// collective), here with host memory standing in for a GPU; tools/gpu-check runs it on one.
TEST_F(KfBench, DeviceBuffersThroughTheStandInAreCorrect) {
  for (const char* op : {"allreduce", "gather", "reduce-scatter"}) {
    SCOPED_TRACE(op);
    const Captured r = run_bench(3, {op, "--device", "standin", "--dtype", "f16", "--sizes",
                                     "2,4099,5M", "--iters", "2", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto rows = rows_of(r.out);
    ASSERT_EQ(rows.size(), 3u) << r.out;
    for (const auto& row : rows) expect_complete_and_correct(row);
  }
}

TEST_F(KfBench, TableHasAHeaderAndOneRowPerSize) {
  const Captured r =
      run_bench(2, {"broadcast", "--algo", "tree", "--sizes", "1K,2K", "--iters", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[0] # kf-bench broadcast: np=2 dtype=f32 root=0"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("busbw"), std::string::npos) << r.out;
  // Two workers on one host talk over the same-host socket, however their starts interleave.
  EXPECT_NE(r.out.find("[0] # rank 0 sent: tcp 0 B, same-host socket "), std::string::npos)
      << r.out;
  std::size_t rows = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" tree ") != std::string::npos && line.find(" true") != std::string::npos) {
      ++rows;
    }
  }
  EXPECT_EQ(rows, 2u) << r.out;
}

TEST_F(KfBench, BadArgumentsAreUsageErrors) {
  const Captured direct = run({env_path("KF_BENCH"), "allreduce", "--sizes", "12Q"});
  EXPECT_EQ(direct.exit_code, 2) << direct.out << direct.err;
  EXPECT_NE(direct.err.find("12Q"), std::string::npos) << direct.err;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"allreduce", "--dtype", "f8"},
        std::vector<std::string>{"allreduce", "--algo", "fastest"},
        std::vector<std::string>{"allgather", "--op", "sum"},
        std::vector<std::string>{"scatter"}}) {
    std::vector<std::string> argv{env_path("KF_BENCH")};
    argv.insert(argv.end(), args.begin(), args.end());
    const Captured c = run(argv);
    EXPECT_EQ(c.exit_code, 2) << args[args.size() - 1] << ": " << c.err;
  }
  const Captured launched = run_bench(2, {"allreduce", "--sizes", "12Q"});
  EXPECT_EQ(launched.exit_code, 2) << launched.out << launched.err;
  const Captured bad_root = run_bench(2, {"broadcast", "--root", "2", "--sizes", "4"});
  EXPECT_EQ(bad_root.exit_code, 2) << bad_root.out << bad_root.err;
  EXPECT_NE(bad_root.err.find("--root 2"), std::string::npos) << bad_root.err;
}

TEST_F(KfBench, CompareRunsKfOverBothTransportsAndWritesRowsAndPlot) {
  std::string dir = (std::filesystem::temp_directory_path() / "kf_bench_compare.XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Captured r = run(
      {env_path("KF_BENCH"), "compare", "--impl",  "kf,kf-tcp", "--np",     "2", "--sizes", "4,64K",
       "--rounds",           "1",       "--iters", "5",         "--warmup", "1", "--out",   dir,
       "--timeout-s",        "60",      "--calls", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("kf-tcp / best tcp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(dir + "/compare-np2.svg"), std::string::npos) << r.out;
  // Both methods, each with its tables and plot.
  EXPECT_NE(r.out.find("## method barrier"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("## method back-to-back"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(dir + "/compare-back-to-back-np2.svg"), std::string::npos) << r.out;

  std::ifstream jsonl(dir + "/compare.jsonl");
  std::set<std::string> seen;
  for (std::string line; std::getline(jsonl, line);) {
    const auto row = nlohmann::json::parse(line);
    expect_complete_and_correct(row);
    const std::string impl = row.value("impl", "");
    EXPECT_EQ(row.value("class", ""), impl == "kf" ? "local" : "tcp") << line;
    EXPECT_EQ(row.value("round", 0), 1) << line;
    EXPECT_EQ(row.value("np", 0), 2) << line;
    seen.insert(row.value("method", "") + " " + impl + "/" + std::to_string(row.value("bytes", 0)));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"barrier kf/4", "barrier kf/65536", "barrier kf-tcp/4",
                                         "barrier kf-tcp/65536", "back-to-back kf/4",
                                         "back-to-back kf/65536", "back-to-back kf-tcp/4",
                                         "back-to-back kf-tcp/65536"}));

  std::ifstream svg_file(dir + "/compare-np2.svg");
  const std::string svg{std::istreambuf_iterator<char>(svg_file), {}};
  EXPECT_NE(svg.find("<svg "), std::string::npos);
  std::size_t polylines = 0;
  for (auto at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++polylines;
  }
  EXPECT_EQ(polylines, 2u) << svg;
  std::filesystem::remove_all(dir);
}

// --against this very build: both sides are real kfrun + kf-bench jobs in the same rounds, and
// the A/B table appears; what it says about speed is not checked.
TEST_F(KfBench, CompareAgainstABuildRunsBothSidesInTheSameRounds) {
  const std::filesystem::path self = env_path("KF_BENCH");
  const std::string build = self.parent_path().parent_path().parent_path().string();
  std::string dir = (std::filesystem::temp_directory_path() / "kf_bench_against.XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Captured r = run(
      {env_path("KF_BENCH"), "compare", "--impl",    "kf-tcp", "--np",     "2",      "--sizes", "4",
       "--rounds",           "2",       "--iters",   "5",      "--warmup", "1",      "--out",   dir,
       "--timeout-s",        "60",      "--against", build,    "--method", "barrier"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("kf-tcp kf-tcp@old"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("this build (new) against " + build + " (old)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("spread new"), std::string::npos) << r.out;
  // Round 1 runs this build first, round 2 the other.
  const auto at = [&r](const std::string& what) { return r.err.find(what); };
  EXPECT_LT(at("round 1/2 kf-tcp "), at("round 1/2 kf-tcp@old")) << r.err;
  EXPECT_LT(at("round 2/2 kf-tcp@old"), at("round 2/2 kf-tcp ")) << r.err;

  std::ifstream jsonl(dir + "/compare.jsonl");
  std::set<std::string> seen;
  for (std::string line; std::getline(jsonl, line);) {
    const auto row = nlohmann::json::parse(line);
    expect_complete_and_correct(row);
    EXPECT_EQ(row.value("class", ""), "tcp") << line;
    seen.insert(row.value("impl", "") + "/" + std::to_string(row.value("round", 0)));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"kf-tcp/1", "kf-tcp/2", "kf-tcp@old/1", "kf-tcp@old/2"}));
  std::filesystem::remove_all(dir);
}

TEST_F(KfBench, CompareAgainstADirectoryWithoutABuildIsAUsageError) {
  std::string dir = (std::filesystem::temp_directory_path() / "kf_bench_no_build.XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const Captured c = run({env_path("KF_BENCH"), "compare", "--against", dir});
  std::filesystem::remove_all(dir);
  EXPECT_EQ(c.exit_code, 2) << c.out << c.err;
  EXPECT_NE(c.err.find("--against"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("kfrun not found"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("kf-bench not found"), std::string::npos) << c.err;
  EXPECT_EQ(c.out, "");  // nothing ran
}

TEST_F(KfBench, CompareNamesTheOptionOfABadValue) {
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"--np", "1"}, {"--impl", "nccl"}, {"--timeout-s", "0"}}) {
    const Captured c = run({env_path("KF_BENCH"), "compare", option, value});
    EXPECT_EQ(c.exit_code, 2) << option << ": " << c.out << c.err;
    EXPECT_NE(c.err.find(option), std::string::npos) << c.err;
  }
}

}  // namespace
