// SPDX-License-Identifier: Apache-2.0
// A collective with bad arguments completes at once with invalid_argument and a message that
// names the collective and what was wrong; device buffers where no device can be used fail with
// device_error. Nothing is sent: the other worker never joins these collectives.
#include "kf/peer.hpp"

#include <string>

#include <gtest/gtest.h>

#include "device/device_api.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

// The handle's error and message, which must be complete without any other worker taking part.
void expect_refused(const Handle& h, const std::string& what) {
  ASSERT_TRUE(h.ready()) << "a refused collective completes at once";
  EXPECT_EQ(h.wait_status(), make_error_code(errc::invalid_argument)) << h.message();
  EXPECT_NE(h.message().find(what), std::string::npos) << h.message();
}

class Arguments : public ::testing::Test {
 protected:
  std::vector<std::unique_ptr<Peer>> peers_ = test::make_local_cluster(2);
  Peer& peer() { return *peers_[0]; }
  float a_[4] = {1, 2, 3, 4};
  float b_[8] = {};
};

TEST_F(Arguments, DeviceBuffersWithoutADeviceNameWhy) {
  std::string why;
  if (detail::cuda_device_api(why)) GTEST_SKIP() << "a CUDA device is here (tests/gpu use it)";
  Buffer send = buffer(a_, 4);
  Buffer recv = buffer(b_, 4);
  send.device = Device::cuda;
  recv.device = Device::cuda;
  auto refused = [&](const Handle& h, const std::string& what) {
    ASSERT_TRUE(h.ready()) << "a refused collective completes at once";
    EXPECT_EQ(h.wait_status(), make_error_code(errc::device_error)) << h.message();
    EXPECT_NE(h.message().find(what), std::string::npos) << h.message();
    EXPECT_NE(h.message().find(why), std::string::npos) << h.message();
  };
  refused(peer().allreduce("dev", send, recv),
          "allreduce 'dev': device buffers cannot be used here: ");
  // One device buffer is enough to leave the host engine.
  refused(peer().allreduce("mixed", buffer(a_, 4), recv), "allreduce 'mixed'");
  Buffer bcast = buffer(a_, 4);
  bcast.device = Device::cuda;
  refused(peer().broadcast("dev-bcast", bcast), "broadcast 'dev-bcast'");
  EXPECT_EQ(peer().device_backend(), "unavailable: " + why);
}

TEST_F(Arguments, RootOutsideTheClusterIsRefused) {
  CollOptions o;
  o.root = 2;
  expect_refused(peer().broadcast("root", buffer(a_, 4), o),
                 "root 2 is not a rank of this 2-worker");
  o.root = -1;
  expect_refused(peer().gather("root", buffer(a_, 4), buffer(b_, 8), o), "root -1");
}

TEST_F(Arguments, NamesMustBeOneToTheLimitOfBytes) {
  expect_refused(peer().allreduce("", buffer(a_, 4), buffer(b_, 4)), "needs a name of 1-");
  const std::string too_long(100000, 'n');
  expect_refused(peer().allreduce(too_long, buffer(a_, 4), buffer(b_, 4)), "needs a name of 1-");
}

TEST_F(Arguments, ShapesMustMatchTheOperation) {
  expect_refused(peer().allreduce("shape", buffer(a_, 4), buffer(b_, 3)), "differ in shape");
  // allgather: recv holds size * send.count elements.
  expect_refused(peer().allgather("gather", buffer(a_, 4), buffer(b_, 4)),
                 "recv needs size*send.count = 8 elements");
  // reduce-scatter: send holds size * recv.count elements.
  expect_refused(peer().reduce_scatter("rs", buffer(a_, 4), buffer(b_, 4)),
                 "send needs size*recv.count = 8 elements");
  int ints[8] = {};
  expect_refused(peer().allgather("dtype", buffer(a_, 4), buffer(ints, 8)), "differ in dtype");
}

TEST_F(Arguments, NullBuffersAreRefused) {
  Buffer null_send{nullptr, 4, DType::f32, Device::cpu};
  expect_refused(peer().allreduce("null", null_send, buffer(b_, 4)), "null buffer");
}

TEST(ArgumentsBeforeStart, APeerWithoutClusterRefusesCollectives) {
  PeerOptions o;
  o.job_token = "test-token";
  o.listen = Endpoint{"127.0.0.1", 0};
  Peer p(o);
  float x = 1;
  expect_refused(p.allreduce("early", buffer(&x, 1), buffer(&x, 1)), "no cluster yet");
}

}  // namespace
}  // namespace kf
