// SPDX-License-Identifier: Apache-2.0
// kill -9 of one worker in the middle of a stream of allreduces: every other worker's
// collective fails with a peer failure (peer_lost) within 2x the timeout, and none hangs.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "support/process.hpp"

namespace kf {
namespace {

using Clock = std::chrono::steady_clock;

// Ports the kernel hands out for port 0 on loopback; the sockets are closed right away so the
// workers can bind them (the kernel does not hand the same port out again immediately).
std::vector<int> free_ports(int n) {
  std::vector<int> ports, socks;
  for (int i = 0; i < n; ++i) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    ports.push_back(ntohs(a.sin_port));
    socks.push_back(s);
  }
  for (int s : socks) close(s);
  return ports;
}

// Starts np test-workers in `mode` on one cluster (extra KF_* settings in `env`) and waits
// until each has printed "ready". Fails the test (and returns what it has) otherwise.
std::vector<test::Child> start_ready(int np, const std::string& mode,
                                     const std::vector<std::string>& env) {
  std::vector<test::Child> kids;
  const char* worker = std::getenv("KF_TEST_WORKER");
  if (worker == nullptr) {
    ADD_FAILURE() << "KF_TEST_WORKER must name the test-worker binary";
    return kids;
  }
  const auto ports = free_ports(np);
  Cluster c;
  c.version = 1;
  for (int i = 0; i < np; ++i) {
    c.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", static_cast<std::uint16_t>(ports[i])}, i});
  }
  for (int i = 0; i < np; ++i) {
    std::vector<std::string> e = env;
    e.push_back("KF_SELF=127.0.0.1:" + std::to_string(ports[i]));
    e.push_back("KF_CLUSTER=" + c.to_json().dump());
    e.push_back("KF_JOB_TOKEN=loss-test");
    kids.push_back(test::spawn({worker, mode}, e));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (auto& k : kids) {
    auto line = test::read_line(k, deadline);
    if (!line || *line != "ready") ADD_FAILURE() << "a worker did not become ready";
  }
  return kids;
}

class PeerLoss : public ::testing::TestWithParam<int> {};

TEST_P(PeerLoss, KilledWorkerMakesEveryOtherWorkerFailWithinTheTimeout) {
  const int np = 4, victim = GetParam();
  const int timeout_ms = 3000;
  auto kids = start_ready(np, "stream",
                          {"KF_TIMEOUT_MS=" + std::to_string(timeout_ms), "KF_ALGORITHM=ring"});
  ASSERT_FALSE(HasFailure());
  kill(kids[victim].pid, SIGKILL);
  const auto killed_at = Clock::now();
  test::wait_exit(kids[victim], killed_at + std::chrono::seconds(5));
  for (int i = 0; i < np; ++i) {
    if (i == victim) continue;
    auto status = test::wait_exit(kids[i], killed_at + std::chrono::milliseconds(2 * timeout_ms));
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at);
    ASSERT_TRUE(status.has_value())
        << "worker " << i << " still running " << 2 * timeout_ms << " ms after the kill";
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 3) << "worker " << i << " output: " << kids[i].pending;
    EXPECT_NE(kids[i].pending.find("failure code=peer_lost"), std::string::npos)
        << "worker " << i << " output: " << kids[i].pending;
    RecordProperty("worker" + std::to_string(i) + "_exit_ms", static_cast<int>(took.count()));
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, PeerLoss, ::testing::Values(0, 2));

// A stopped process keeps its connections open: only the heartbeat watchdog can tell. With a
// collective timeout of 30 s, the others must still fail within about the heartbeat timeout
// (750 ms by default, checked every 187 ms).
TEST(PeerLoss, StoppedWorkerIsDetectedByHeartbeats) {
  const int np = 3, victim = 1;
  auto kids = start_ready(np, "stream", {"KF_TIMEOUT_MS=30000"});
  ASSERT_FALSE(HasFailure());
  kill(kids[victim].pid, SIGSTOP);
  const auto stopped_at = Clock::now();
  for (int i = 0; i < np; ++i) {
    if (i == victim) continue;
    auto status = test::wait_exit(kids[i], stopped_at + std::chrono::seconds(3));
    const auto took =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at);
    ASSERT_TRUE(status.has_value()) << "worker " << i << " did not notice the stopped peer";
    EXPECT_EQ(WEXITSTATUS(*status), 3) << kids[i].pending;
    std::cout << "worker " << i << " failed " << took.count()
              << " ms after SIGSTOP: " << kids[i].pending;
  }
  kill(kids[victim].pid, SIGKILL);
  test::wait_exit(kids[victim], Clock::now() + std::chrono::seconds(5));
}

// A pause of the whole host (a loaded machine, a VM the hypervisor stopped) silences every
// worker at once, and the one that runs again first must not take the others' silence during
// the pause for a loss. Worker 1 stops first, worker 0 a moment later (it has read whatever 1
// sent by then); after a pause longer than the heartbeat timeout 0 resumes, and 1 only
// 700 ms later, within the timeout counted from 0's resumption but long after 1's last frame.
// Both must go on streaming allreduces.
TEST(PeerLoss, AHostWidePauseLosesNobody) {
  const int np = 2, heartbeat_ms = 2000;
  auto kids = start_ready(
      np, "stream", {"KF_TIMEOUT_MS=30000", "KF_HEARTBEAT_MS=" + std::to_string(heartbeat_ms)});
  ASSERT_FALSE(HasFailure());
  kill(kids[1].pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(kids[0].pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(heartbeat_ms + 500));
  kill(kids[0].pid, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  kill(kids[1].pid, SIGCONT);
  // A loss shows within one watchdog tick (heartbeat / 4) after 0 resumed: the workers exit.
  const auto watch_until = Clock::now() + std::chrono::milliseconds(heartbeat_ms);
  std::vector<bool> reaped(np);
  for (int i = 0; i < np; ++i) {
    auto status = test::wait_exit(kids[i], watch_until, /*kill_late=*/false);
    EXPECT_FALSE(status.has_value()) << "worker " << i << " stopped: " << kids[i].pending;
    reaped[i] = status.has_value();  // then its pid is no longer its own
  }
  for (int i = 0; i < np; ++i) {
    if (!reaped[i]) test::wait_exit(kids[i], Clock::now());  // kills it
  }
}

// The survivors of a kill -9 move to the next cluster version without restarting and go on.
class PeerLossRecovery : public ::testing::TestWithParam<int> {};

TEST_P(PeerLossRecovery, SurvivorsFormTheNextVersionAndContinue) {
  const int np = 4, victim = GetParam();
  auto kids = start_ready(np, "recover", {"KF_TIMEOUT_MS=3000"});
  ASSERT_FALSE(HasFailure());
  kill(kids[victim].pid, SIGKILL);
  const auto killed_at = Clock::now();
  test::wait_exit(kids[victim], killed_at + std::chrono::seconds(5));
  for (int i = 0; i < np; ++i) {
    if (i == victim) continue;
    auto status = test::wait_exit(kids[i], killed_at + std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value()) << "worker " << i << " did not finish: " << kids[i].pending;
    ASSERT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 0) << "worker " << i << ": " << kids[i].pending;
    EXPECT_NE(kids[i].pending.find("recovered size=3 v2"), std::string::npos) << kids[i].pending;
    const auto took =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - killed_at);
    std::cout << "worker " << i << ": " << kids[i].pending << "  (exit " << took.count() / 1000.0
              << " ms after the kill)\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Victims, PeerLossRecovery, ::testing::Values(0, 1, 3));

}  // namespace
}  // namespace kf
