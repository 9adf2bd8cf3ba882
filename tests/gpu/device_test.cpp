// SPDX-License-Identifier: Apache-2.0
// Device buffers in separate worker processes started by kfrun (device-worker): every
// operation x dtype with 1, 2 and 4 workers, verified by each worker, bitwise identical across
// them. On a GPU: through NCCL and through staging. Everywhere: through staging with host memory
// standing in for the device, which checks the worker and the staging path in CI. Several
// workers share the one GPU of a test machine (NCCL_HOSTID per worker, NCCL on loopback).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>

#include "config.hpp"
#include "device/device_api.hpp"
#include "support/process.hpp"

namespace kf {
namespace {

using Param = std::tuple<std::string, int>;  // backend (nccl, staging, standin), workers

class DeviceCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceCollectives, EveryOperationAndDtypeIsExactOnEveryWorker) {
  const auto [backend, np] = GetParam();
  if (backend != "standin") {
    std::string why;
    if (!detail::cuda_device_api(why)) GTEST_SKIP() << "no GPU here: " << why;
    if (backend == "nccl" && !KF_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
  }
  const char* kfrun = std::getenv("KFRUN");
  const char* worker = std::getenv("KF_DEVICE_WORKER");
  ASSERT_NE(kfrun, nullptr);
  ASSERT_NE(worker, nullptr);
  std::vector<std::string> argv = {kfrun, "-np", std::to_string(np), "--timeout-ms", "60000",
                                   "--",  worker};
  if (backend == "standin") argv.push_back("--standin");
  auto child =
      test::spawn(argv, {"KF_HEARTBEAT_MS=20000",
                         "KF_DEVICE_BACKEND=" + std::string(backend == "nccl" ? "nccl" : "staging"),
                         "NCCL_SOCKET_IFNAME=lo"});
  ASSERT_GT(child.pid, 0);
  auto status = test::wait_exit(child, std::chrono::steady_clock::now() + std::chrono::minutes(4));
  ASSERT_TRUE(status.has_value()) << "kfrun did not finish: " << child.pending;
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 0) << child.pending;
  const std::string used = backend == "nccl" ? "nccl+staging" : "staging";
  for (int r = 0; r < np; ++r) {
    const std::string line =
        "rank " + std::to_string(r) + " of " + std::to_string(np) + ": device ok backend=";
    EXPECT_NE(child.pending.find(line), std::string::npos) << child.pending;
  }
  // NCCL runs what it can; consensus always goes through staging.
  EXPECT_NE(child.pending.find("backend=" + used), std::string::npos) << child.pending;
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceCollectives,
                         ::testing::Combine(::testing::Values("standin", "staging", "nccl"),
                                            ::testing::Values(1, 2, 4)),
                         [](const ::testing::TestParamInfo<Param>& param) {
                           return std::get<0>(param.param) + "_p" +
                                  std::to_string(std::get<1>(param.param));
                         });

}  // namespace
}  // namespace kf
