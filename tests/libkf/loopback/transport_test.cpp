// SPDX-License-Identifier: Apache-2.0
// Which transport connects two workers: the same-host Unix-domain socket (the default for
// workers on one host), TCP (KF_TRANSPORT=tcp), or both at once in one job, and the fallback to
// TCP when a worker's same-host socket name is answered by someone else.
#include "kf/peer.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "kf/common/env.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

// Peers on 127.0.0.1, the i-th with transports[i], started on one cluster.
std::vector<std::unique_ptr<Peer>> make_cluster(const std::vector<Transport>& transports) {
  std::vector<std::unique_ptr<Peer>> peers;
  Cluster c;
  c.version = 1;
  for (std::size_t i = 0; i < transports.size(); ++i) {
    PeerOptions o;
    o.job_token = "test-token";
    o.transport = transports[i];
    peers.push_back(std::make_unique<Peer>(o));
    c.workers.push_back(WorkerSpec{peers.back()->endpoint(), static_cast<int>(i)});
  }
  for (auto& p : peers) p->start(c);
  return peers;
}

// A small and a pipelined large allreduce with `algo` on every peer; checks the sums.
void expect_allreduce_works(std::vector<std::unique_ptr<Peer>>& peers, Algorithm algo) {
  const int p = static_cast<int>(peers.size());
  const std::size_t n = (std::size_t{9} << 20) / 4 + 3;
  std::vector<std::vector<float>> big(p, std::vector<float>(n));
  std::vector<int> small(p);
  test::run_all(p, [&](int r) {
    CollOptions o;
    o.algorithm = algo;
    small[r] = r + 1;
    peers[r]->allreduce("small", buffer(&small[r], 1), buffer(&small[r], 1), o).wait();
    for (std::size_t i = 0; i < n; ++i) big[r][i] = static_cast<float>(r + 1 + (i % 7));
    peers[r]->allreduce("big", buffer(big[r].data(), n), buffer(big[r].data(), n), o).wait();
  });
  const int ranks = p * (p + 1) / 2;
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(small[r], ranks) << "rank " << r;
    for (std::size_t i : {std::size_t{0}, std::size_t{5}, n / 2, n - 1}) {
      ASSERT_EQ(big[r][i], static_cast<float>(ranks + p * static_cast<int>(i % 7)))
          << "rank " << r << " element " << i;
    }
  }
}

// Whether /proc/net/unix lists a listener named after `ep` ("@kf/HOST:PORT").
bool has_same_host_listener(const Endpoint& ep) {
  std::ifstream in("/proc/net/unix");
  const std::string want = "@kf/" + ep.str();
  for (std::string line; std::getline(in, line);) {
    if (line.size() >= want.size() && line.compare(line.size() - want.size(), want.size(), want) == 0) {
      return true;
    }
  }
  return false;
}

class TransportMix : public ::testing::TestWithParam<Algorithm> {};

TEST_P(TransportMix, SameHostTcpAndMixedJobsGiveTheSameResults) {
  using T = Transport;
  for (const auto& mix : {std::vector<T>{T::automatic, T::automatic, T::automatic},
                          std::vector<T>{T::tcp, T::tcp, T::tcp},
                          std::vector<T>{T::automatic, T::tcp, T::automatic}}) {
    auto peers = make_cluster(mix);
    expect_allreduce_works(peers, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportMix,
                         ::testing::Values(Algorithm::star, Algorithm::ring, Algorithm::rhd),
                         [](const auto& tpi) { return std::string(to_string(tpi.param)); });

TEST(Transport, OnlyTheDefaultListensOnASameHostSocket) {
  auto peers = make_cluster({Transport::automatic, Transport::tcp});
  EXPECT_TRUE(has_same_host_listener(peers[0]->endpoint()));
  EXPECT_FALSE(has_same_host_listener(peers[1]->endpoint()));
}

TEST(Transport, ParsesItsNamesAndNothingElse) {
  EXPECT_EQ(parse_transport("auto"), Transport::automatic);
  EXPECT_EQ(parse_transport("tcp"), Transport::tcp);
  EXPECT_FALSE(parse_transport("unix").has_value());
  EXPECT_FALSE(parse_transport("").has_value());
}

TEST(Transport, KfTransportSetsTheOptionAndABadValueIsNamed) {
  Env e;
  e.self = Endpoint{"127.0.0.1", 0};
  e.job_token = "t";
  EXPECT_EQ(Peer::options_from(e).transport, Transport::automatic);
  e.transport = "tcp";
  EXPECT_EQ(Peer::options_from(e).transport, Transport::tcp);
  e.transport = "shm";
  try {
    Peer::options_from(e);
    FAIL() << "KF_TRANSPORT=shm was accepted";
  } catch (const std::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("KF_TRANSPORT='shm'"), std::string::npos) << ex.what();
  }
}

// Worker 1 listens on TCP only, and another socket takes its same-host name: worker 0 dials that
// name first, fails the handshake with whoever answers, and reaches worker 1 over TCP.
TEST(Transport, ASquattedSameHostNameFallsBackToTcp) {
  auto peers = make_cluster({Transport::automatic, Transport::tcp});
  const std::string name = std::string(1, '\0') + "kf/" + peers[1]->endpoint().str();
  const int squatter = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(squatter, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
  ASSERT_EQ(listen(squatter, 4), 0);
  std::atomic<int> accepted{0};
  // Answers each connection by closing it, until the test shuts the listener down.
  std::thread answer([&] {
    for (;;) {
      const int c = accept(squatter, nullptr, nullptr);
      if (c < 0) return;
      ++accepted;
      close(c);
    }
  });
  expect_allreduce_works(peers, Algorithm::ring);
  EXPECT_GE(accepted.load(), 1) << "worker 0 never tried the same-host socket";
  shutdown(squatter, SHUT_RDWR);
  answer.join();
  close(squatter);
}

}  // namespace
}  // namespace kf
