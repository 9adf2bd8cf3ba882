// SPDX-License-Identifier: Apache-2.0
// Elastic jobs whose gradients are allreduced on the GPU: 2 -> 3 -> 2 workers, the last change a
// kill -9 at a random step, for 10 seeds, through NCCL (a fresh communicator for the grow, a
// shrunk one after the kill) and once through staging. After each the survivors hold identical
// parameters, every sample was used once and no commit was lost (elastic-worker checks).
// Without a GPU every case skips, saying why; tests/multiproc runs the same scenario through the
// staging backend with host memory standing in for the device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "config.hpp"
#include "device/device_api.hpp"
#include "support/elastic_job.hpp"

namespace kf::test {
namespace {

const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 1000 --device cuda";

void need_gpu() {
  std::string why;
  if (!detail::cuda_device_api(why)) GTEST_SKIP() << "no GPU here: " << why;
  // Every worker shares the test machine's GPU: NCCL between them over loopback sockets.
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
}

TEST(GpuElastic, NcclGrowsAndSurvivesKillNineAtRandomSteps) {
  need_gpu();
  if (IsSkipped()) return;
  if (!KF_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
  setenv("KF_DEVICE_BACKEND", "nccl", 1);
  const int only = std::atoi(env_or_empty("KF_TEST_SEED").c_str());
  for (int seed = only > 0 ? only : 1; seed <= (only > 0 ? only : 10); ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    grow_then_kill("gpu-nccl" + std::to_string(seed), kArgs, static_cast<unsigned>(seed));
    if (HasFailure()) break;
  }
}

TEST(GpuElastic, StagingGrowsAndSurvivesKillNine) {
  need_gpu();
  if (IsSkipped()) return;
  setenv("KF_DEVICE_BACKEND", "staging", 1);
  grow_then_kill("gpu-staging", kArgs, 11);
}

}  // namespace
}  // namespace kf::test
