// SPDX-License-Identifier: Apache-2.0
// The handshake binds a connection to the worker the dialer meant: a dial that something on the
// way redirects to another worker of the job (which proves the same token) is refused by both
// ends, so that worker never takes what was meant for the other.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kf/peer.hpp"
#include "support/log_capture.hpp"
#include "support/raw_client.hpp"
#include "transport/auth.hpp"

namespace kf {
namespace {

using test::LogCapture;
using test::read_frame;
using test::send_frame;

// A TCP relay on 127.0.0.1 that forwards every connection it accepts to `to_port`, both ways,
// until either side closes: what an on-path attacker does to redirect a dial.
class Redirect {
 public:
  explicit Redirect(std::uint16_t to_port) : to_port_(to_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listener_, 8) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot listen";
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~Redirect() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listener_);
  }
  std::uint16_t port() const { return port_; }
  int relayed() const { return relayed_; }

 private:
  void run() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int in = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (in < 0) continue;
      const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(to_port_);
      inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
      if (::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(in);
        ::close(out);
        continue;
      }
      ++relayed_;
      pump(in, out);
      ::close(in);
      ::close(out);
    }
  }
  // Copies bytes both ways until one side closes (or the relay stops).
  void pump(int a, int b) {
    char buf[4096];
    while (!stop_) {
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        if (n <= 0) return;
        if (::write(p[1 - i].fd, buf, static_cast<std::size_t>(n)) != n) return;
      }
    }
  }

  std::uint16_t to_port_;
  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> relayed_{0};
  std::thread thread_;
};

TEST(Handshake, ADialRedirectedToAnotherWorkerOfTheJobIsRefusedByBothEnds) {
  LogCapture log;
  PeerOptions o;
  o.job_token = "test-token";
  o.transport = Transport::tcp;
  o.connect_timeout = std::chrono::milliseconds(1500);
  Peer dialer(o), other(o);
  Redirect redirect(other.endpoint().port);
  // The dialer means a worker at the relay's address; `other` answers there.
  const Endpoint meant{"127.0.0.1", redirect.port()};
  Handle h = dialer.invite(meant, "meant for " + meant.str());
  EXPECT_TRUE(static_cast<bool>(h.wait_status())) << "the redirected invitation was delivered";
  EXPECT_GE(redirect.relayed(), 1) << "the dial did not go through the relay";
  // `other` never takes what was meant for another worker.
  EXPECT_FALSE(other.wait_invitation(std::chrono::milliseconds(0)));
  const std::string text = log.text();
  EXPECT_NE(text.find("was meant for another worker"), std::string::npos) << text;
  // A direct dial of `other` works.
  Handle direct = dialer.invite(other.endpoint(), "direct");
  EXPECT_FALSE(static_cast<bool>(direct.wait_status())) << direct.message();
  const auto got = other.wait_invitation(std::chrono::seconds(10));
  ASSERT_TRUE(got);
  EXPECT_EQ(got->payload, "direct");
}

// Invitations wait until taken, within a bound: a sender cannot fill a worker's memory with
// ones it never takes. Past the bound the newest are dropped, with a warning.
TEST(Handshake, InvitationsNotTakenAreBounded) {
  LogCapture log;
  PeerOptions o;
  o.job_token = "test-token";
  Peer sender(o);
  o.max_invitations = 3;
  Peer receiver(o);
  std::vector<Handle> sent;
  for (int i = 0; i < 6; ++i)
    sent.push_back(sender.invite(receiver.endpoint(), "n" + std::to_string(i)));
  for (auto& h : sent) EXPECT_FALSE(static_cast<bool>(h.wait_status())) << h.message();
  // Until the receiver has read all six (in order, on one connection): three taken, three
  // dropped. Taking any before would make room for the later ones.
  const auto drops = [&] {
    const std::string text = log.text();
    int n = 0;
    for (auto at = text.find("dropped an invitation"); at != std::string::npos;
         at = text.find("dropped an invitation", at + 1)) {
      ++n;
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (drops() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(drops(), 3) << log.text();
  EXPECT_NE(log.text().find("3 invitations of 6 bytes are waiting to be taken (the limit)"),
            std::string::npos)
      << log.text();
  std::vector<std::string> taken;
  while (auto inv = receiver.wait_invitation(std::chrono::milliseconds(0))) {
    taken.push_back(inv->payload);
  }
  EXPECT_EQ(taken, (std::vector<std::string>{"n0", "n1", "n2"}));
  // Room again once taken.
  EXPECT_FALSE(static_cast<bool>(sender.invite(receiver.endpoint(), "later").wait_status()));
  const auto later = receiver.wait_invitation(std::chrono::seconds(10));
  ASSERT_TRUE(later);
  EXPECT_EQ(later->payload, "later");
}

// The dialer's own check: an acceptor that proves the token but answers as another worker (one
// that does not check whom the hello meant) is refused by the dialer.
TEST(Handshake, ADialerRefusesAWelcomeFromAnotherWorkerThanTheOneDialled) {
  LogCapture log;
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), len), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const Endpoint meant{"127.0.0.1", ntohs(a.sin_port)};
  std::atomic<bool> welcomed{false};
  std::thread acceptor([&] {
    const int s = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) return;
    const transport::Nonce nonce = transport::random_nonce();
    std::vector<std::byte> challenge(nonce.begin(), nonce.end());
    transport::FrameHeader h;
    std::vector<std::byte> payload;
    if (send_frame(s, transport::FrameType::challenge, challenge) && read_frame(s, h, payload)) {
      const auto hello = transport::decode_hello(payload);
      if (hello) {
        const Key key = derive_key("test-token", KeyUse::peers);
        const std::string someone_else = "127.0.0.1:1";
        transport::Welcome w{
            someone_else, transport::welcome_mac(key, true, true, "kf", someone_else, hello->nonce),
            true};
        welcomed = send_frame(s, transport::FrameType::welcome, transport::encode(w));
        while (read_frame(s, h, payload)) {
        }
      }
    }
    ::close(s);
  });
  PeerOptions o;
  o.job_token = "test-token";
  o.transport = Transport::tcp;
  o.connect_timeout = std::chrono::milliseconds(1500);
  {
    Peer dialer(o);
    Handle h = dialer.invite(meant, "meant for " + meant.str());
    EXPECT_TRUE(static_cast<bool>(h.wait_status())) << "the invitation went to another worker";
  }
  ::shutdown(listener, SHUT_RDWR);
  acceptor.join();
  ::close(listener);
  EXPECT_TRUE(welcomed) << "the test's acceptor did not get as far as its welcome";
  const std::string text = log.text();
  EXPECT_NE(text.find("is 127.0.0.1:1, not the one dialled"), std::string::npos) << text;
}

}  // namespace
}  // namespace kf
