// SPDX-License-Identifier: Apache-2.0
// kf::ClusterWatch against the real kf-config-server: it reports a version another client wrote,
// and stop() cuts a long-poll short (with a long-poll of ten minutes, a stop() that waited for it
// would run into this test's timeout).
#include "kf/runtime/cluster_watch.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "kf/runtime/config_client.hpp"
#include "support/config_server_process.hpp"

namespace kf {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class ClusterWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kf-cluster-watch-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "token") << "tok\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(
        dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    server_ = std::make_unique<test::ServerProcess>(
        dir_, std::vector<std::string>{"--watch-timeout-ms", "600000"});
    ASSERT_FALSE(server_->url().empty()) << "kf-config-server did not start";
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  // Waits (bounded) until the watch reported `version`.
  bool wait_for(std::uint64_t version) {
    std::unique_lock lock(mutex_);
    return seen_cv_.wait_for(lock, 20s, [&] { return seen_ >= version; });
  }

  ClusterWatchHandlers handlers() {
    ClusterWatchHandlers h;
    h.on_cluster = [this](const Cluster& c) {
      {
        std::lock_guard lock(mutex_);
        seen_ = c.version;
      }
      seen_cv_.notify_all();
    };
    h.on_error = [](const Error&) { return true; };
    return h;
  }

  static Cluster one_worker() {
    Cluster c;
    c.workers = {WorkerSpec{{"127.0.0.1", 7001}, 0}};
    return c;
  }

  fs::path dir_;
  std::unique_ptr<test::ServerProcess> server_;
  std::mutex mutex_;  // guards seen_
  std::condition_variable seen_cv_;
  std::uint64_t seen_ = 0;
};

TEST_F(ClusterWatchTest, ReportsAVersionAnotherClientWroteAndStopCutsTheLongPollShort) {
  ClusterWatchOptions o;
  o.url = server_->url();
  o.token = "tok";
  o.poll = 10min;
  ClusterWatch watch(o, handlers());
  ConfigClient writer(server_->url(), "tok");
  writer.put_cluster(one_worker());
  ASSERT_TRUE(wait_for(1));
  watch.stop();  // the watch now long-polls after version 1
  watch.stop();  // idempotent
}

TEST_F(ClusterWatchTest, StartRunsFirstAndItsResultIsReported) {
  ClusterWatchOptions o;
  o.url = server_->url();
  o.token = "tok";
  o.poll = 10min;
  o.start = [](ConfigClient& client) { return client.put_cluster(one_worker()); };
  ClusterWatch watch(o, handlers());
  ASSERT_TRUE(wait_for(1));
}

TEST(ConfigClient, ACancelledClientRefusesEveryRequest) {
  ConfigClient client("http://127.0.0.1:9", "tok");
  client.cancel();
  try {
    client.get_cluster();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), errc::cancelled) << e.what();
  }
}

}  // namespace
}  // namespace kf
