// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/state.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "device/device_api.hpp"
#include "kf/peer.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid())))
      .string();
}

TEST(State, RestoreReturnsToTheLastCommit) {
  std::vector<float> w(10, 1.f);
  State s;
  s.add("w", buffer(w.data(), w.size()));
  EXPECT_THROW(s.restore(), std::logic_error);
  s.counter("step") = 5;
  s.commit();
  w[3] = 9.f;
  s.counter("step") = 6;
  s.restore();
  EXPECT_EQ(w[3], 1.f);
  EXPECT_EQ(s.counter("step"), 5);
  EXPECT_EQ(s.commits(), 1u);
  EXPECT_THROW(s.add("w", buffer(w.data(), w.size())), std::invalid_argument);
}

TEST(State, CounterReferencesSeeRestoredValues) {
  State s;
  std::int64_t& epoch = s.counter("epoch");
  std::int64_t& step = s.counter("step");
  std::int64_t& zeta = s.counter("zeta");
  epoch = 1;
  step = 10;
  zeta = 7;
  s.commit();
  epoch = 2;
  step = 11;
  zeta = 8;
  std::int64_t& late = s.counter("late");  // created after the commit: restored to 0
  late = 5;
  s.restore();
  EXPECT_EQ(epoch, 1);
  EXPECT_EQ(step, 10);
  EXPECT_EQ(zeta, 7);
  EXPECT_EQ(late, 0);
  EXPECT_EQ(&s.counter("step"), &step);
}

TEST(State, SaveAndLoadRoundTripAndRejectMismatches) {
  const std::string path = temp_path("kf-state");
  std::vector<double> a(7);
  std::vector<std::int32_t> b(3, 4);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5 * static_cast<double>(i);
  State s;
  s.add("a", buffer(a.data(), a.size()));
  s.add("b", buffer(b.data(), b.size()));
  s.counter("epoch") = 2;
  EXPECT_THROW(s.save(path), std::logic_error);
  s.commit();
  s.save(path);

  std::vector<double> a2(7, -1);
  std::vector<std::int32_t> b2(3, -1);
  State t;
  t.add("a", buffer(a2.data(), a2.size()));
  t.add("b", buffer(b2.data(), b2.size()));
  t.load(path);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
  EXPECT_EQ(t.counter("epoch"), 2);
  EXPECT_TRUE(t.has_commit());

  std::vector<double> small(6);
  State u;
  u.add("a", buffer(small.data(), small.size()));
  u.add("b", buffer(b2.data(), b2.size()));
  try {
    u.load(path);
    FAIL() << "a size mismatch must be rejected";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("buffer 'a' is f64 x 7"), std::string::npos) << e.what();
  }
  // A truncated file.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  EXPECT_THROW(t.load(path), std::runtime_error);
  std::ofstream(path) << "not a state file";
  EXPECT_THROW(t.load(path), std::runtime_error);
  std::filesystem::remove(path);
  EXPECT_THROW(t.load(path), std::runtime_error);
}

// A hot spare's copy: the last commit as bytes, taken into a state of the same layout; a copy
// of another layout, or a torn one, is refused and leaves the state as it was.
TEST(State, SnapshotCarriesTheLastCommitToAnotherState) {
  std::vector<float> w{1.f, 2.f, 3.f};
  State s;
  s.add("w", buffer(w.data(), w.size()));
  s.counter("step") = 4;
  EXPECT_THROW((void)s.snapshot(), std::logic_error);
  s.commit();
  w[0] = 100.f;  // after the commit: not in the snapshot
  const std::string bytes = s.snapshot();

  std::vector<float> w2(3, -1.f);
  State t;
  t.add("w", buffer(w2.data(), w2.size()));
  std::int64_t& step = t.counter("step");
  t.restore_snapshot(bytes);
  EXPECT_EQ(w2, (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_EQ(step, 4);
  EXPECT_TRUE(t.has_commit());

  std::vector<float> other(4, -1.f);
  State u;
  u.add("w", buffer(other.data(), other.size()));
  try {
    u.restore_snapshot(bytes);
    FAIL() << "a snapshot of another layout must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("snapshot: buffer 'w' is f32 x 3"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(u.has_commit());
  EXPECT_EQ(other, std::vector<float>(4, -1.f));
  w2.assign(3, -1.f);
  EXPECT_THROW(t.restore_snapshot(std::string_view(bytes).substr(0, bytes.size() - 1)),
               std::runtime_error);
  EXPECT_EQ(w2, std::vector<float>(3, -1.f));
}

// A header whose fields have the wrong JSON types is refused like any other bad file: a
// runtime_error naming the file and what is wrong, never the JSON library's own type error.
TEST(State, LoadRefusesMistypedHeaderFields) {
  const std::string path = temp_path("kf-state-types");
  std::vector<std::int32_t> n(3, 7);
  State s;
  s.add("n", buffer(n.data(), n.size()));
  s.counter("step") = 42;
  const std::string payload(3 * sizeof(std::int32_t), '\0');
  const struct {
    const char* header;
    const char* why;
  } cases[] = {
      {R"({"buffers": [{"name": 5555555555555555555, "dtype": "i32", "count": 3}],
           "counters": {}})",
       "has no buffer 'n'"},
      {R"({"buffers": [{"name": "n", "dtype": 7, "count": 3}], "counters": {}})",
       "buffer 'n' is ? x 3"},
      {R"({"buffers": [{"name": "n", "dtype": "i32", "count": "3"}], "counters": {}})",
       "buffer 'n' is i32 x ?"},
      {R"({"buffers": [{"name": "n", "dtype": "i32", "count": -3}], "counters": {}})",
       "buffer 'n' is i32 x ?"},
      {R"({"buffers": [{"name": "n", "dtype": "i32", "count": 3}],
           "counters": {"step": 9223372036854775808}})",
       "counter 'step' is not a 64-bit signed integer"},
  };
  for (const auto& c : cases) {
    std::string header = c.header;
    std::erase(header, '\n');
    std::ofstream(path, std::ios::binary) << "KFSTATE1\n" << header << '\n' << payload;
    try {
      s.load(path);
      ADD_FAILURE() << "accepted " << c.header;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.why), std::string::npos) << e.what();
    }
    EXPECT_EQ(n, std::vector<std::int32_t>(3, 7));
    EXPECT_EQ(s.counter("step"), 42);
  }
  // The same file with every field of its type loads.
  std::ofstream(path, std::ios::binary)
      << "KFSTATE1\n"
      << R"({"buffers": [{"name": "n", "dtype": "i32", "count": 3}], "counters": {"step": 5}})"
      << '\n'
      << payload;
  s.load(path);
  EXPECT_EQ(n, std::vector<std::int32_t>(3, 0));
  EXPECT_EQ(s.counter("step"), 5);
  std::filesystem::remove(path);
}

TEST(State, SyncGivesEveryWorkerTheRootsStateAndCommitsIt) {
  const int p = 3, root = 1;
  auto peers = test::make_local_cluster(p);
  std::vector<std::vector<float>> w(p, std::vector<float>(1000));
  std::vector<std::int64_t> steps(p);
  test::run_all(p, [&](int r) {
    for (auto& x : w[r]) x = static_cast<float>(r);
    State s;
    s.add("model", buffer(w[r].data(), w[r].size()));
    s.counter("step") = 100 + r;
    s.sync(*peers[r], root);
    steps[r] = s.counter("step");
    EXPECT_TRUE(s.has_commit());
  });
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(w[r], w[root]) << "rank " << r;
    EXPECT_EQ(steps[r], 100 + root);
  }
}

TEST(State, SyncRefusesDifferentLayouts) {
  auto peers = test::make_local_cluster(2);
  std::vector<std::string> errors(2);
  test::run_all(2, [&](int r) {
    std::vector<float> w(r == 0 ? 10 : 11);
    State s;
    s.add("model", buffer(w.data(), w.size()));
    try {
      s.sync(*peers[r], 0);
    } catch (const std::runtime_error& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_NE(e.find("different state"), std::string::npos) << e;
}

// Device buffers (host memory standing in for a device): commit copies them out, restore and
// load copy back, sync broadcasts them as device collectives.
TEST(StateOnDevice, CommitRestoreSaveLoadAndSyncCopyDeviceBuffers) {
  auto api = detail::standin_device_api();
  detail::set_device_api_for_tests(api);
  const int p = 2;
  auto peers = test::make_local_cluster(p);
  const std::string path = temp_path("kf-state-device");
  test::run_all(p, [&](int r) {
    constexpr std::size_t n = 5000;
    auto* dev = static_cast<float*>(api->alloc_device(n * sizeof(float)));
    for (std::size_t i = 0; i < n; ++i) dev[i] = static_cast<float>(r * 10000 + i);
    State s;
    s.add("model", cuda_buffer(dev, n));
    s.sync(*peers[r], 1);  // rank 1's values everywhere, committed
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(dev[i], static_cast<float>(10000 + i)) << i;
    dev[7] = -1;
    s.restore();
    EXPECT_EQ(dev[7], 10007.0f);
    if (r == 0) {
      s.save(path);
      dev[8] = -1;
      s.load(path);
      EXPECT_EQ(dev[8], 10008.0f);
    }
    api->free_device(dev);
  });
  std::filesystem::remove(path);
  peers.clear();
  detail::set_device_api_for_tests(nullptr);
}

}  // namespace
}  // namespace kf
