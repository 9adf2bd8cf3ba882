// SPDX-License-Identifier: Apache-2.0
// The staging backend, with host memory standing in for a CUDA device (device/standin.cpp):
// every operation and dtype on "device" buffers through page-locked staging and the host
// engine, in chunks small enough that several run at once; ordering after the caller's
// stream, and of the caller's later work after the result (Handle::order_on); mixed host and
// device buffers; a lost peer. The same logic runs on a GPU with CUDA in tools/gpu-check.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/staging.hpp"
#include "device/device_api.hpp"
#include "kf/peer.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

using detail::DeviceApi;

// Stand-in device memory holding `n` elements of T.
template <typename T>
struct DevVec {
  DeviceApi* api;
  T* p;
  std::size_t n;
  DevVec(DeviceApi& a, std::size_t count)
      : api(&a), p(static_cast<T*>(a.alloc_device(count * sizeof(T)))), n(count) {
    std::memset(static_cast<void*>(p), 0, count * sizeof(T));
  }
  ~DevVec() { api->free_device(p); }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  Buffer buf() const { return cuda_buffer(p, n); }
  std::vector<T> host() const { return std::vector<T>(p, p + n); }
};

// Holds a stream's work until open(): whatever the test enqueues behind it runs only then.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open_ = false;
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return open_; });
  }
  void open() {
    std::lock_guard<std::mutex> lk(mu);
    open_ = true;
    cv.notify_all();
  }
};

class Staging : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { detail::set_device_api_for_tests(api_); }
  void TearDown() override { detail::set_device_api_for_tests(nullptr); }
  std::vector<std::unique_ptr<Peer>> cluster(int p, std::size_t chunk_bytes = 4096) {
    PeerOptions o;
    o.job_token = "test-token";
    o.staging_chunk_bytes = chunk_bytes;
    return test::make_local_cluster(p, o);
  }
  std::shared_ptr<DeviceApi> api_ = detail::standin_device_api();
};

float val(int r, std::size_t i) { return static_cast<float>((r + 1) + static_cast<int>(i % 13)); }

TEST_P(Staging, EveryOperationGivesTheHostEnginesResult) {
  const int p = GetParam();
  auto peers = cluster(p);
  DeviceApi& api = *api_;
  test::run_all(p, [&](int r) {
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    // 0 elements, one, and enough for several 4 KiB chunks (f32: 1024 per chunk).
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5000}}) {
      const std::string tag = "#" + std::to_string(n);
      SCOPED_TRACE("rank " + std::to_string(r) + " n=" + std::to_string(n));
      // allreduce, out of place and in place
      DevVec<float> in(api, n), out(api, n);
      for (std::size_t i = 0; i < n; ++i) in.p[i] = val(r, i);
      peer.allreduce("ar" + tag, in.buf(), out.buf()).wait();
      auto got = out.host();
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, i);
        ASSERT_EQ(got[i], want) << "allreduce at " << i;
      }
      if (n > 0) {
        EXPECT_EQ(in.p[n - 1], val(r, n - 1)) << "send untouched";
      }
      CollOptions mx;
      mx.op = ReduceOp::max;
      DevVec<std::int64_t> m(api, n);
      for (std::size_t i = 0; i < n; ++i) m.p[i] = static_cast<std::int64_t>((r * 7 + i) % 11);
      peer.allreduce("max" + tag, m.buf(), m.buf(), mx).wait();
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t want = 0;
        for (int q = 0; q < p; ++q) want = std::max<std::int64_t>(want, (q * 7 + i) % 11);
        ASSERT_EQ(m.p[i], want) << "max at " << i;
      }
      // broadcast from the last rank
      CollOptions root;
      root.root = p - 1;
      DevVec<double> b(api, n);
      for (std::size_t i = 0; i < n; ++i) b.p[i] = r == p - 1 ? 0.5 * static_cast<double>(i) : -1;
      peer.broadcast("bc" + tag, b.buf(), root).wait();
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(b.p[i], 0.5 * static_cast<double>(i));
      // allgather and gather of u8
      DevVec<std::uint8_t> g(api, n), all(api, n * static_cast<std::size_t>(p));
      for (std::size_t i = 0; i < n; ++i) g.p[i] = static_cast<std::uint8_t>(r * 10 + i % 7);
      peer.allgather("ag" + tag, g.buf(), all.buf()).wait();
      for (int q = 0; q < p; ++q) {
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(all.p[static_cast<std::size_t>(q) * n + i], q * 10 + i % 7);
        }
      }
      DevVec<std::uint8_t> at_root(api, n * static_cast<std::size_t>(p));
      peer.gather("ga" + tag, g.buf(), at_root.buf(), root).wait();
      if (r == p - 1) {
        EXPECT_EQ(at_root.host(), all.host());
      }
      // reduce-scatter of i32, out of place
      DevVec<std::int32_t> rs_in(api, n * static_cast<std::size_t>(p)), rs_out(api, n);
      for (std::size_t i = 0; i < rs_in.n; ++i) rs_in.p[i] = static_cast<std::int32_t>(i + r);
      peer.reduce_scatter("rs" + tag, rs_in.buf(), rs_out.buf()).wait();
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t at = static_cast<std::size_t>(r) * n + i;
        ASSERT_EQ(rs_out.p[i], static_cast<std::int32_t>(at) * p + p * (p - 1) / 2);
      }
      // consensus over device bytes: equal, then not
      bool agreed = false;
      DevVec<std::uint8_t> same(api, n + 1);
      peer.consensus("cs" + tag, same.buf(), &agreed).wait();
      EXPECT_TRUE(agreed);
      same.p[0] = static_cast<std::uint8_t>(r);
      peer.consensus("cs2" + tag, same.buf(), &agreed).wait();
      EXPECT_EQ(agreed, p == 1);
    }
    // f16: 1.0 summed over p ranks (0x3C00 is 1.0; 2.0 is 0x4000, 4.0 is 0x4400).
    DevVec<std::uint16_t> h(api, 3000);
    for (std::size_t i = 0; i < h.n; ++i) h.p[i] = 0x3C00;
    peer.allreduce("f16", Buffer{h.p, h.n, DType::f16, Device::cuda},
                   Buffer{h.p, h.n, DType::f16, Device::cuda})
        .wait();
    const std::uint16_t want = p == 1 ? 0x3C00 : p == 2 ? 0x4000 : 0x4400;
    for (std::size_t i = 0; i < h.n; ++i) ASSERT_EQ(h.p[i], want) << i;
    EXPECT_EQ(peer.device_backend(), "staging");
  });
}

TEST_P(Staging, CollectivesStartAfterTheCallersStreamAndOrderItsLaterWork) {
  const int p = GetParam();
  auto peers = cluster(p);
  DeviceApi& api = *api_;
  test::run_all(p, [&](int r) {
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    void* stream = api.create_stream();
    constexpr std::size_t n = 3000;
    DevVec<float> grad(api, n);
    std::vector<float> seen(n, -1);
    for (int step = 0; step < 3; ++step) {
      // The "kernel" that writes the gradient is held on the caller's stream until after the
      // collective was submitted: the collective must wait for it.
      Gate gate;
      api.call_after(stream, [&] { gate.wait(); });
      api.call_after(stream, [&, step] {
        for (std::size_t i = 0; i < n; ++i) grad.p[i] = static_cast<float>(r + step + i % 5);
      });
      CollOptions o;
      o.stream = stream;
      Handle h = peer.allreduce("grad", grad.buf(), grad.buf(), o);
      gate.open();
      // Later work on the stream reads the result without the host waiting for it.
      h.order_on(stream);
      api.call_after(stream, [&] { std::copy(grad.p, grad.p + n, seen.begin()); });
      api.synchronize(stream);
      h.wait();
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += static_cast<float>(q + step + i % 5);
        ASSERT_EQ(seen[i], want) << "step " << step << " at " << i;
      }
    }
    api.destroy_stream(stream);
  });
}

TEST_P(Staging, HostAndDeviceBuffersMix) {
  const int p = GetParam();
  auto peers = cluster(p);
  DeviceApi& api = *api_;
  test::run_all(p, [&](int r) {
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    constexpr std::size_t n = 2500;
    std::vector<float> host_in(n, static_cast<float>(r + 1)), host_out(n);
    DevVec<float> dev(api, n);
    peer.allreduce("h2d", buffer(host_in.data(), n), dev.buf()).wait();
    peer.allreduce("d2h", dev.buf(), buffer(host_out.data(), n)).wait();
    const float once = static_cast<float>(p * (p + 1) / 2);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(dev.p[i], once);
      ASSERT_EQ(host_out[i], once * static_cast<float>(p));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Workers, Staging, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return "p" + std::to_string(param.param);
                         });

TEST(StagingFailure, ALostPeerFailsTheStagedCollective) {
  auto api = detail::standin_device_api();
  detail::set_device_api_for_tests(api);
  PeerOptions o;
  o.job_token = "test-token";
  o.timeout = std::chrono::milliseconds(500);
  o.staging_chunk_bytes = 4096;
  auto peers = test::make_local_cluster(2, o);
  constexpr std::size_t n = 5000;
  DevVec<float> v(*api, n);
  // Both ranks once, so that the connection exists; then rank 1 goes away.
  test::run_all(2, [&](int r) {
    DevVec<float> w(*api, n);
    peers[static_cast<std::size_t>(r)]->allreduce("warm", w.buf(), w.buf()).wait();
  });
  peers[1].reset();
  const Handle h = peers[0]->allreduce("alone", v.buf(), v.buf());
  const std::error_code ec = h.wait_status();
  EXPECT_EQ(ec, make_error_condition(errcond::peer_failure)) << ec.message() << ": " << h.message();
  EXPECT_NE(h.message().find("allreduce 'alone"), std::string::npos) << h.message();
  // The failed collective's order_on returns (its stream work is not held forever).
  void* s = api->create_stream();
  h.order_on(s);
  api->synchronize(s);
  api->destroy_stream(s);
  peers.clear();
  detail::set_device_api_for_tests(nullptr);
}

TEST(PinnedPool, BlocksAreReusedAndTheRestGivenBack) {
  auto api = detail::standin_device_api();
  detail::PinnedPool pool(*api, 1 << 20);
  {
    auto a = pool.take(100 << 10);  // rounded up to 128 KiB
    EXPECT_EQ(pool.held_bytes(), std::size_t{128} << 10);
  }
  for (int i = 0; i < 10; ++i) auto b = pool.take(100 << 10);
  EXPECT_EQ(pool.held_bytes(), std::size_t{128} << 10) << "the free block was taken again";
  {
    auto a = pool.take(100 << 10);
    auto b = pool.take(100 << 10);  // a second block while the first is in use
    EXPECT_EQ(pool.held_bytes(), std::size_t{256} << 10);
  }
  // Beyond what is kept (1 MiB), free blocks are given back when a new one is needed.
  { auto big = pool.take(2 << 20); }
  { auto bigger = pool.take(4 << 20); }
  EXPECT_EQ(pool.held_bytes(), (std::size_t{4} << 20) + (std::size_t{256} << 10))
      << "the 2 MiB block went back; the small ones fit in what is kept";
}

}  // namespace
}  // namespace kf
