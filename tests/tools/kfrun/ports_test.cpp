// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/ports.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <set>
#include <stdexcept>

#include <gtest/gtest.h>

namespace kf::tools {
namespace {

// A TCP socket bound to `port` of 127.0.0.1 (0: an ephemeral one), holding that port while it
// lives. `bound()` is false when the port was in use.
class HeldPort {
 public:
  explicit HeldPort(std::uint16_t port = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    socklen_t length = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    EXPECT_EQ(::listen(fd_, 1), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &length), 0);
    port_ = ntohs(a.sin_port);
  }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  ~HeldPort() { ::close(fd_); }
  bool bound() const { return port_ != 0; }
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

TEST(PortRange, ParsesBounds) {
  EXPECT_EQ(PortRange::parse("10000-10010"), (PortRange{10000, 10010}));
  EXPECT_EQ(PortRange::parse("1-65535").count_ports(), 65535u);
  EXPECT_EQ(PortRange::parse("7-7").count_ports(), 1u);
}

TEST(PortRange, RejectsMalformedText) {
  for (const char* bad :
       {"", "10", "a-b", "1-", "-5", "0-10", "10-70000", "20-10", "1-2-3", " 1-2"}) {
    EXPECT_THROW(PortRange::parse(bad), std::invalid_argument) << "'" << bad << "'";
  }
}

TEST(PickFreePorts, GivesDistinctPortsInRange) {
  const PortRange range{40000, 40999};
  const auto ports = pick_free_ports("127.0.0.1", range, 8);
  ASSERT_EQ(ports.size(), 8u);
  EXPECT_EQ(std::set<std::uint16_t>(ports.begin(), ports.end()).size(), 8u);
  for (auto p : ports) {
    EXPECT_GE(p, range.first);
    EXPECT_LE(p, range.last);
  }
}

TEST(PickFreePorts, SkipsPortInUse) {
  HeldPort held;
  ASSERT_TRUE(held.bound());
  const PortRange range{held.port(), held.port()};
  try {
    pick_free_ports("127.0.0.1", range, 1);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(range.str()), std::string::npos) << e.what();
  }
}

// Whether a socket with `option` (0: none) set can bind `port` of 127.0.0.1.
bool binds_with(int option, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (option != 0) {
    EXPECT_EQ(::setsockopt(fd, SOL_SOCKET, option, &on, sizeof on), 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return bound;
}

// The socket kfrun hands a worker holds its port against every other bind, also one that asks
// to share it (SO_REUSEADDR, SO_REUSEPORT): nobody can take the port between the worker's start
// and its listen. One already in use gives no socket.
TEST(BindWorkerPort, HoldsThePortAgainstEveryOtherBind) {
  const auto port = pick_free_ports("127.0.0.1", PortRange{20000, 30000}, 1).at(0);
  {
    const UniqueFd held = bind_worker_port("127.0.0.1", port);
    ASSERT_TRUE(held.is_open());
    EXPECT_GT(held.get(), 2);
    EXPECT_FALSE(port_is_free("127.0.0.1", port));
    for (const int option : {0, SO_REUSEADDR, SO_REUSEPORT}) {
      EXPECT_FALSE(binds_with(option, port)) << "option " << option;
    }
    EXPECT_FALSE(bind_worker_port("127.0.0.1", port).is_open());
  }
  EXPECT_TRUE(binds_with(0, port));  // closed: free again
  EXPECT_THROW(bind_worker_port("192.0.2.1", port), std::invalid_argument);
}

TEST(PickFreePorts, RejectsHostThatIsNotLocal) {
  // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
  EXPECT_THROW(pick_free_ports("192.0.2.1", PortRange{40000, 40010}, 1), std::invalid_argument);
}

TEST(PortsForHost, TestsThePortsOfThisMachineOnly) {
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_FALSE(is_local_host("192.0.2.1"));
  EXPECT_THROW(is_local_host("no-such-host.invalid"), std::invalid_argument);

  // Four ports in a row below the kernel's ephemeral range, the first held here and the others
  // free when found. Other tests' connections take ephemeral ports, so the neighbours of an
  // ephemeral port may all be in use by the time the pick looks at them.
  std::optional<HeldPort> held;
  for (std::uint16_t first = 15000; first < 20000 && !held; first += 4) {
    held.emplace(first);
    const auto free = [&](int i) {
      return port_is_free("127.0.0.1", static_cast<std::uint16_t>(first + i));
    };
    if (!held->bound() || !free(1) || !free(2) || !free(3)) held.reset();
  }
  ASSERT_TRUE(held) << "no four free ports in a row in 15000-19999";
  EXPECT_FALSE(port_is_free("127.0.0.1", held->port()));
  // Here: test-bound, and never one that is taken or in use.
  const PortRange range{held->port(), static_cast<std::uint16_t>(held->port() + 3)};
  const std::vector<std::uint16_t> taken{static_cast<std::uint16_t>(held->port() + 1)};
  const PortPick here = pick_ports_for("127.0.0.1", range, 2, taken);
  EXPECT_TRUE(here.checked);
  EXPECT_EQ(std::set<std::uint16_t>(here.ports.begin(), here.ports.end()),
            (std::set<std::uint16_t>{static_cast<std::uint16_t>(held->port() + 2),
                                     static_cast<std::uint16_t>(held->port() + 3)}));
  EXPECT_THROW(pick_ports_for("127.0.0.1", range, 3, taken), std::invalid_argument);

  // Another machine: drawn from the range unchecked, distinct, never a taken one.
  const PortRange wide{40000, 40007};
  const std::vector<std::uint16_t> used{40001, 40003};
  const PortPick there = pick_ports_for("192.0.2.1", wide, 6, used);
  EXPECT_FALSE(there.checked);
  const std::set<std::uint16_t> got(there.ports.begin(), there.ports.end());
  EXPECT_EQ(got, (std::set<std::uint16_t>{40000, 40002, 40004, 40005, 40006, 40007}));
  EXPECT_THROW(pick_ports_for("192.0.2.1", wide, 7, used), std::invalid_argument);
}

}  // namespace
}  // namespace kf::tools
