// SPDX-License-Identifier: Apache-2.0
// Every operation x algorithm x size in separate processes started by kfrun, for worker counts
// 1, 2, 3, 4, 5 and 8: kfrun exits 0 only when every worker verified every result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/process.hpp"

namespace kf {
namespace {

class KfrunSweep : public ::testing::TestWithParam<int> {};

TEST_P(KfrunSweep, EveryWorkerVerifiesEveryCollective) {
  const char* kfrun = std::getenv("KFRUN");
  const char* worker = std::getenv("KF_TEST_WORKER");
  ASSERT_NE(kfrun, nullptr);
  ASSERT_NE(worker, nullptr);
  const int np = GetParam();
  // This checks results, not failure detection (multiproc_peer_loss does that). Eight workers
  // with 32 MiB reduce-scatters oversubscribe two cores fourfold, and a worker that waits for a
  // core longer than the default heartbeat timeout (750 ms) would be declared lost.
  auto child = test::spawn(
      {kfrun, "-np", std::to_string(np), "--timeout-ms", "30000", "--", worker, "sweep"},
      {"KF_HEARTBEAT_MS=10000"});
  ASSERT_GT(child.pid, 0);
  auto status = test::wait_exit(child, std::chrono::steady_clock::now() + std::chrono::minutes(4));
  ASSERT_TRUE(status.has_value()) << "kfrun did not finish: " << child.pending;
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0) << child.pending;
  for (int r = 0; r < np; ++r) {
    EXPECT_NE(child.pending.find("rank " + std::to_string(r) + " of " + std::to_string(np) +
                                 ": sweep ok"),
              std::string::npos)
        << child.pending;
  }
}

INSTANTIATE_TEST_SUITE_P(WorkerCounts, KfrunSweep, ::testing::Values(1, 2, 3, 4, 5, 8));

}  // namespace
}  // namespace kf
