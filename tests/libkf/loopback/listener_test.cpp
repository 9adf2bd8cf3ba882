// SPDX-License-Identifier: Apache-2.0
// A listening socket handed down by the launcher (PeerOptions::listen_fd, KF_LISTEN_FD): a peer
// listens on it when it is a TCP socket bound to its address, and refuses anything else, naming
// what the descriptor is instead.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kf/common/env.hpp"
#include "kf/common/error.hpp"
#include "kf/common/fd.hpp"
#include "kf/peer.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

// A socket of `type` bound to an ephemeral port of 127.0.0.1; its port in `port`.
int bound_socket(int type, std::uint16_t& port) {
  const int fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length), 0);
  port = ntohs(a.sin_port);
  return fd;
}

PeerOptions options_for(std::uint16_t port, int fd) {
  PeerOptions o;
  o.job_token = "test-token";
  test::stretch_heartbeat(o);
  o.listen = Endpoint{"127.0.0.1", port};
  o.listen_fd = fd;
  return o;
}

// What constructing a peer on `fd` throws (empty when it does not).
std::string refusal(std::uint16_t port, int fd) {
  try {
    Peer peer(options_for(port, fd));
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

// A peer that listens on the socket it was handed, for both transports: its endpoint is that
// socket's port, peers reach it, and it owns the socket (closed with it).
TEST(Listener, APeerListensOnTheSocketItIsHanded) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    std::uint16_t port = 0;
    const int fd = bound_socket(SOCK_STREAM, port);
    std::vector<std::unique_ptr<Peer>> peers;
    PeerOptions handed = options_for(port, fd);
    handed.transport = t;
    peers.push_back(std::make_unique<Peer>(handed));
    EXPECT_EQ(peers[0]->endpoint().port, port);
    PeerOptions other = options_for(0, -1);
    other.transport = t;
    peers.push_back(std::make_unique<Peer>(other));
    Cluster c;
    c.version = 1;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      c.workers.push_back(WorkerSpec{peers[i]->endpoint(), static_cast<int>(i)});
    }
    for (auto& p : peers) p->start(c);
    std::vector<std::vector<int>> v(2, std::vector<int>(100, 1));
    test::run_all(2, [&](int r) {
      peers[r]->allreduce("handed", buffer(v[r].data(), 100), buffer(v[r].data(), 100)).wait();
    });
    EXPECT_EQ(v[0][99], 2);
    EXPECT_EQ(v[1][99], 2);
    peers.clear();
    EXPECT_FALSE(is_open(fd)) << "the peer left the socket it was handed open";
  }
}

TEST(Listener, AnythingButABoundTcpSocketIsRefusedAndNamed) {
  std::uint16_t port = 0;
  const int udp = bound_socket(SOCK_DGRAM, port);
  std::string why = refusal(port, udp);
  EXPECT_NE(why.find("KF_LISTEN_FD"), std::string::npos) << why;
  EXPECT_NE(why.find("not a TCP socket"), std::string::npos) << why;
  // A refused descriptor is left alone: the number may be something else of the process's.
  EXPECT_TRUE(is_open(udp));
  ::close(udp);

  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  why = refusal(port, pipe_fds[0]);
  EXPECT_NE(why.find("not a socket"), std::string::npos) << why;
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  // Bound to another port than the peer's address names.
  std::uint16_t other = 0;
  const int elsewhere = bound_socket(SOCK_STREAM, other);
  why = refusal(static_cast<std::uint16_t>(other == 65535 ? other - 1 : other + 1), elsewhere);
  EXPECT_NE(why.find("is bound to port " + std::to_string(other)), std::string::npos) << why;
  ::close(elsewhere);

  // Not bound at all.
  const int unbound = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  why = refusal(port, unbound);
  EXPECT_NE(why.find("is bound to port 0"), std::string::npos) << why;
  ::close(unbound);

  // A number no descriptor has.
  why = refusal(port, 1 << 20);
  EXPECT_NE(why.find("is not an open descriptor"), std::string::npos) << why;
}

// The environment hands a descriptor to the process's first peer only: a second peer made from
// the same environment binds the port itself instead of taking a socket the first one owns.
TEST(Listener, KfListenFdIsReadAndTakenOnce) {
  std::uint16_t port = 0;
  const int fd = bound_socket(SOCK_STREAM, port);
  Env e;
  e.self = Endpoint{"127.0.0.1", port};
  e.job_token = "test-token";
  e.listen_fd = fd;
  const PeerOptions first = Peer::options_from(e);
  EXPECT_EQ(first.listen_fd, fd);
  EXPECT_EQ(Peer::options_from(e).listen_fd, -1);
  EXPECT_EQ(claim_inherited_fd(fd), -1);
  ::close(fd);

  ::setenv("KF_SELF", "127.0.0.1:9001", 1);
  ::setenv("KF_CLUSTER", R"({"version":1,"workers":[{"host":"127.0.0.1","port":9001,"slot":0}]})",
           1);
  ::setenv("KF_JOB_TOKEN", "test-token", 1);
  ::setenv(env::kListenFd, "7", 1);
  EXPECT_EQ(Env::from_environment().listen_fd, 7);
  for (const char* bad : {"2", "-1", "seven", "7x"}) {
    ::setenv(env::kListenFd, bad, 1);
    try {
      Env::from_environment();
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::invalid_argument& err) {
      EXPECT_NE(std::string(err.what()).find("KF_LISTEN_FD"), std::string::npos) << err.what();
    }
  }
  for (const char* name : {"KF_SELF", "KF_CLUSTER", "KF_JOB_TOKEN", env::kListenFd}) {
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace kf
