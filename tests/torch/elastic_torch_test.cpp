// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST example as an elastic job (kf-config-server + kfrun --watch) resized 2 → 3 → 2
// while it trains: after each change every worker of the new cluster holds the same model (a
// joiner starts from the survivors' exact state), and at the end all parameters are identical
// (the example's consensus check). On a GPU (KF_TEST_DEVICE=cuda, tools/gpu-check) the same
// example trains on the device through NCCL, 2 -> 3 workers by a resize and back to 2 by a kill -9.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "support/elastic_job.hpp"

namespace kf::test {
namespace {

// Lines "[host:port] ..." of rank 0's progress: the newest step, 0 before any.
long newest_step(const std::string& out) {
  static const std::regex re(R"(\] epoch \d+ step (\d+) )");
  long s = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    s = std::max(s, std::stol((*it)[1]));
  }
  return s;
}

// The example's data: KF_FASHION_MNIST_DATA, else Debian's dataset-fashion-mnist.
std::string data_dir() {
  const std::string d = env_or_empty("KF_FASHION_MNIST_DATA");
  return d.empty() ? "/usr/share/datasets/fashion-mnist" : d;
}

// 2 workers, resized to 3, then back to 2 by a resize or by a kill -9 of a random worker; the
// models are compared after each change and at the end.
void two_three_two(const std::string& name, const std::string& device_args, bool kill) {
  const std::string exe = env_or_empty("KF_FASHION_MNIST");
  if (exe.empty()) GTEST_SKIP() << "KF_FASHION_MNIST is not set";
  if (!std::filesystem::exists(data_dir())) {
    GTEST_SKIP() << data_dir() << " is missing (dataset-fashion-mnist)";
  }
  ElasticJob job(name);
  job.start_program(2, exe,
                    "--data " + data_dir() +
                        " --limit 3000 --epochs 1000 --batch 32 --log-every 10" + device_args);
  const auto at_least = [&](long steps) {
    return eventually([&] { return newest_step(job.out()) >= steps; }, 120s);
  };
  ASSERT_TRUE(at_least(30)) << job.err();
  ASSERT_EQ(job.member("resize 3").exit_code, 0);
  ASSERT_TRUE(job.wait_size(3)) << job.err();
  ASSERT_TRUE(at_least(newest_step(job.out()) + 30)) << job.err();
  if (kill) {
    const auto c = job.client().get_cluster();
    const pid_t pid = job.worker_pid(c.workers[1].endpoint.str());
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
  } else {
    ASSERT_EQ(job.member("resize 2").exit_code, 0);
  }
  ASSERT_TRUE(job.wait_size(2)) << job.err();
  ASSERT_TRUE(at_least(newest_step(job.out()) + 30)) << job.err();
  job.finish_soon();
  EXPECT_EQ(job.wait(), 0) << job.err() << job.out();
  const std::string out = job.out();
  EXPECT_NE(out.find("parameters identical on all 2 workers: yes"), std::string::npos) << out;
  EXPECT_NE(out.find("final test accuracy: "), std::string::npos) << out;

  // "[worker] membership vV step S workers N params H": per version, one model on every worker.
  std::map<std::string, std::map<std::string, std::string>> by_version;  // version -> worker -> H
  std::map<std::string, int> size_of;
  std::istringstream in(out);
  const std::regex re(
      R"(^\[([^\]]+)\] membership v(\d+) step \d+ workers (\d+) params ([0-9a-f]+))");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) {
      by_version[m[2]][m[1]] = m[4];
      size_of[m[2]] = std::stoi(m[3]);
    }
  }
  int checked = 0;
  for (const auto& [version, models] : by_version) {
    if (size_of[version] == 3) {
      EXPECT_EQ(models.size(), 3u) << "v" << version << ": the joiner and both survivors\n" << out;
    }
    std::set<std::string> distinct;
    for (const auto& [worker, hash] : models) distinct.insert(hash);
    EXPECT_EQ(distinct.size(), 1u) << "v" << version << " workers hold different models\n" << out;
    ++checked;
  }
  EXPECT_GE(checked, 3) << "the join, the growth and the shrink\n" << out;
}

TEST(ElasticTorch, ResizedTwoThreeTwoEveryWorkerHoldsTheSameModel) {
  two_three_two("torch", "", /*kill=*/false);
}

// Model averaging lets the workers' models differ between averages: every change of the
// cluster gives all of them one model again (the per-version check above), a kill -9 too. The
// period is longer than the run, so that no average happens to make them one instead.
TEST(ElasticTorch, ModelAveragingGrowsAndSurvivesKillNine) {
  two_three_two("torch-sma", " --mode sma --period 100000", /*kill=*/true);
}

// Pair averaging: the models differ after every step, and exchanges are in flight at every
// change of the cluster; each change gives every worker one model again, a kill -9 too.
TEST(ElasticTorch, PairAveragingGrowsAndSurvivesKillNine) {
  two_three_two("torch-pair", " --mode pair-avg", /*kill=*/true);
}

// The same with boundaries on change: the workers meet only when something changes, each
// through its own pieces of the epoch; every change still gives every worker one model.
TEST(ElasticTorch, PairAveragingWithBoundariesOnChangeGrowsAndSurvivesKillNine) {
  two_three_two("torch-pair-oc", " --mode pair-avg --boundaries on-change", /*kill=*/true);
}

// Parameter-server training: rank 0 serves, every worker's pushes and the server's parameters
// are in flight at every change (max_staleness 2 lets them lag); each change gives every
// worker one model again and the server starts from it, a kill -9 too.
TEST(ElasticTorch, ParameterServerTrainingGrowsAndSurvivesKillNine) {
  two_three_two("torch-ps", " --mode async-ps --max-staleness 2", /*kill=*/true);
}

// The same with boundaries on change: rank 0 serves at its own steps and nobody meets but at a
// change; each change still gives every worker one model and the server starts from it.
TEST(ElasticTorch, ParameterServerWithBoundariesOnChangeGrowsAndSurvivesKillNine) {
  two_three_two("torch-ps-oc", " --mode async-ps --max-staleness 2 --boundaries on-change",
                /*kill=*/true);
}

// Compressed gradients, with each worker's residual, through a grow and a kill -9.
TEST(ElasticTorch, CompressedGradientsGrowAndSurviveKillNine) {
  two_three_two("torch-topk", " --compression topk:0.05", /*kill=*/true);
}

TEST(ElasticTorch, OnTheGpuGrowsAndSurvivesKillNine) {
  if (env_or_empty("KF_TEST_DEVICE") != "cuda") {
    GTEST_SKIP() << "a GPU run (KF_TEST_DEVICE=cuda with a CUDA LibTorch: tools/gpu-check)";
  }
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  two_three_two("torch-gpu", " --device cuda --one-gpu", /*kill=*/true);
}

}  // namespace
}  // namespace kf::test
