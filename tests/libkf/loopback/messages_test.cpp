// SPDX-License-Identifier: Apache-2.0
// Point-to-point messages (Peer::send, Peer::try_receive, Peer::receive): taken whole or not at
// all, split into frames and put together again over every transport, in order per name,
// refused with a reason for bad arguments or a size that does not match, bound to their cluster
// version; a blocking receive completes whether its message came before or after it, and fails
// when the sender goes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kf/common/error.hpp"
#include "kf/peer.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

using std::chrono::steady_clock;

std::vector<std::unique_ptr<Peer>> two_workers(Transport t, std::size_t max_frame_bytes) {
  PeerOptions o;
  o.job_token = "messages-test";
  o.transport = t;
  o.max_frame_bytes = max_frame_bytes;
  return test::make_local_cluster(2, o);
}

// Polls try_receive until the message is there, for at most 20 s (a receiver that never sees
// it fails the test rather than hanging it).
bool receive_within(Peer& p, int from, const std::string& name, Buffer buf) {
  const auto give_up = steady_clock::now() + std::chrono::seconds(20);
  while (steady_clock::now() < give_up) {
    if (p.try_receive(from, name, buf)) return true;
    std::this_thread::yield();
  }
  return false;
}

TEST(Messages, ALargeMessageArrivesWholeOverEveryTransport) {
  struct Case {
    Transport transport;
    std::size_t max_frame_bytes, floats;
  };
  // 1000-byte frames: a 10,001-float message takes 41 of them, the last one short. A 4 MiB
  // frame between workers of one host goes single-copy, here into the receiver's early buffer.
  // One frame of just over 9 MiB over TCP is written and read in three pieces, with its MAC
  // taken over all of them and checked after the last.
  for (const Case c :
       {Case{Transport::tcp, 1000, 10001}, Case{Transport::unix_socket, 1000, 10001},
        Case{Transport::automatic, 1000, 10001},
        Case{Transport::automatic, std::size_t{64} << 20, std::size_t{1} << 20},
        Case{Transport::tcp, std::size_t{64} << 20, (std::size_t{9} << 20) / 4 + 3}}) {
    auto peers = two_workers(c.transport, c.max_frame_bytes);
    std::vector<float> out(c.floats), in(c.floats, -1.0f);
    std::iota(out.begin(), out.end(), 0.5f);
    std::vector<float> not_sent(3);
    EXPECT_FALSE(peers[1]->try_receive(0, "m", buffer(in.data(), in.size())));
    Handle h = peers[0]->send(1, "m", buffer(out.data(), out.size()));
    h.wait();
    ASSERT_TRUE(receive_within(*peers[1], 0, "m", buffer(in.data(), in.size())));
    EXPECT_EQ(in, out);
    // Taken once: the same name again finds nothing, and so does the other direction.
    EXPECT_FALSE(peers[1]->try_receive(0, "m", buffer(in.data(), in.size())));
    EXPECT_FALSE(peers[0]->try_receive(1, "m", buffer(not_sent.data(), not_sent.size())));
  }
}

TEST(Messages, OneNameFromOneSenderArrivesInOrderAndEmptyMessagesWork) {
  auto peers = two_workers(Transport::automatic, PeerOptions{}.max_frame_bytes);
  std::vector<Handle> sent;
  std::vector<std::int64_t> values(20);
  for (int i = 0; i < 20; ++i) {
    values[static_cast<std::size_t>(i)] = i * 7;
    sent.push_back(peers[1]->send(0, "seq", buffer(&values[static_cast<std::size_t>(i)], 1)));
  }
  sent.push_back(peers[1]->send(0, "empty", buffer(static_cast<std::int64_t*>(nullptr), 0)));
  for (auto& h : sent) h.wait();
  for (int i = 0; i < 20; ++i) {
    std::int64_t got = -1;
    ASSERT_TRUE(receive_within(*peers[0], 1, "seq", buffer(&got, 1)));
    EXPECT_EQ(got, i * 7);
  }
  EXPECT_TRUE(
      receive_within(*peers[0], 1, "empty", buffer(static_cast<std::int64_t*>(nullptr), 0)));
}

// Peer::watch_arrivals: a counter of one name's messages that a loop reads without a hand-off to
// the I/O thread; once it has moved, try_receive finds the message.
TEST(Messages, ArrivalsOfTheWatchedNameAreCountedAndOthersAreNot) {
  auto peers = two_workers(Transport::automatic, PeerOptions{}.max_frame_bytes);
  peers[0]->watch_arrivals("ask");
  EXPECT_EQ(peers[0]->watched_arrivals(), 0u);
  EXPECT_FALSE(peers[0]->version_broken());
  std::int64_t v[2] = {7, 8};
  std::vector<Handle> sent;
  sent.push_back(peers[1]->send(0, "other", buffer(&v[0], 1)));
  sent.push_back(peers[1]->send(0, "ask", buffer(&v[0], 1)));
  sent.push_back(peers[1]->send(0, "ask", buffer(&v[1], 1)));
  for (auto& h : sent) h.wait();
  const auto give_up = steady_clock::now() + std::chrono::seconds(20);
  while (peers[0]->watched_arrivals() < 2 && steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_EQ(peers[0]->watched_arrivals(), 2u);
  std::int64_t got = 0;
  ASSERT_TRUE(peers[0]->try_receive(1, "ask", buffer(&got, 1))) << "counted, so it is there";
  EXPECT_EQ(got, 7);
  ASSERT_TRUE(peers[0]->try_receive(1, "ask", buffer(&got, 1)));
  EXPECT_EQ(got, 8);
  ASSERT_TRUE(receive_within(*peers[0], 1, "other", buffer(&got, 1)));
  EXPECT_EQ(peers[0]->watched_arrivals(), 2u) << "another name is not counted";
}

TEST(Messages, AMessageOfAnotherSizeIsRefusedAndDropped) {
  auto peers = two_workers(Transport::automatic, 64);
  std::vector<std::uint8_t> out(100, 7), in(90, 0);
  peers[0]->send(1, "sized", buffer(out.data(), out.size())).wait();
  // Ask for 90 bytes: two 64-byte frames are expected, the second of 26 bytes; it has 36.
  const auto give_up = steady_clock::now() + std::chrono::seconds(20);
  std::string why;
  while (why.empty() && steady_clock::now() < give_up) {
    try {
      if (peers[1]->try_receive(0, "sized", buffer(in.data(), in.size()))) break;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::protocol_error));
      why = e.what();
    }
    std::this_thread::yield();
  }
  EXPECT_NE(why.find("try_receive 'sized' from rank 0: frame 1 of the message is not the 26 "
                     "bytes"),
            std::string::npos)
      << why;
  EXPECT_FALSE(peers[1]->try_receive(0, "sized", buffer(out.data(), out.size())))
      << "the refused message was dropped";
  // The connection still works.
  peers[0]->send(1, "sized", buffer(out.data(), out.size())).wait();
  EXPECT_TRUE(receive_within(*peers[1], 0, "sized", buffer(out.data(), out.size())));
}

TEST(Messages, BadArgumentsAreRefusedWithAReason) {
  auto peers = two_workers(Transport::automatic, PeerOptions{}.max_frame_bytes);
  float x = 1;
  const auto refusal = [](Handle h) {
    EXPECT_EQ(h.wait_status(), make_error_code(errc::invalid_argument)) << h.message();
    return h.message();
  };
  EXPECT_EQ(refusal(peers[0]->send(0, "x", buffer(&x, 1))),
            "send 'x': a worker cannot send to itself");
  EXPECT_EQ(refusal(peers[0]->send(2, "x", buffer(&x, 1))),
            "send 'x': to 2 is not a rank of this 2-worker cluster");
  EXPECT_EQ(refusal(peers[0]->send(1, "", buffer(&x, 1))),
            "send '': a message needs a name of 1-1024 bytes");
  try {
    peers[1]->try_receive(-1, "x", buffer(&x, 1));
    ADD_FAILURE() << "received from rank -1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::invalid_argument));
    EXPECT_NE(std::string(e.what()).find(
                  "try_receive 'x': from -1 is not a rank of this 2-worker cluster"),
              std::string::npos)
        << e.what();
  }
}

TEST(Messages, AMessageBelongsToTheVersionItWasSentIn) {
  auto peers = two_workers(Transport::automatic, PeerOptions{}.max_frame_bytes);
  Cluster next = peers[0]->cluster();
  next.version += 1;
  float old_value = 1, new_value = 2, got = 0;
  peers[0]->send(1, "v", buffer(&old_value, 1)).wait();
  for (auto& p : peers) p->update(next);
  peers[0]->send(1, "v", buffer(&new_value, 1)).wait();
  // Both went over one connection in order: once the second is here, the first was handled.
  ASSERT_TRUE(receive_within(*peers[1], 0, "v", buffer(&got, 1)));
  EXPECT_EQ(got, 2.0f) << "the message of the old version was taken";
  EXPECT_FALSE(peers[1]->try_receive(0, "v", buffer(&got, 1)));
}

TEST(Messages, AReceiveCompletesWhenTheMessageComesBeforeOrAfterIt) {
  for (const Transport t : {Transport::tcp, Transport::unix_socket}) {
    auto peers = two_workers(t, 1000);
    std::vector<float> first(10001), second(10001), in(10001, -1.0f);
    std::iota(first.begin(), first.end(), 0.25f);
    std::iota(second.begin(), second.end(), -7.0f);
    // Posted first: the frames land in `in` as they come.
    Handle r = peers[1]->receive(0, "blocking", buffer(in.data(), in.size()));
    EXPECT_FALSE(r.ready());
    peers[0]->send(1, "blocking", buffer(first.data(), first.size())).wait();
    r.wait();
    EXPECT_EQ(in, first);
    // Sent first: the receive takes the early frames.
    peers[0]->send(1, "blocking", buffer(second.data(), second.size())).wait();
    peers[1]->receive(0, "blocking", buffer(in.data(), in.size())).wait();
    EXPECT_EQ(in, second);
    EXPECT_FALSE(peers[1]->try_receive(0, "blocking", buffer(in.data(), in.size())));
    // An empty message.
    peers[1]->send(0, "none", buffer(static_cast<std::int64_t*>(nullptr), 0));
    peers[0]->receive(1, "none", buffer(static_cast<std::int64_t*>(nullptr), 0)).wait();
  }
}

TEST(Messages, AReceiveFailsWhenItsSenderGoesAndRefusesBadArguments) {
  auto peers = two_workers(Transport::automatic, PeerOptions{}.max_frame_bytes);
  float x = 0;
  Handle bad = peers[1]->receive(1, "x", buffer(&x, 1));
  EXPECT_EQ(bad.wait_status(), make_error_code(errc::invalid_argument));
  EXPECT_EQ(bad.message(), "receive 'x': a worker cannot receive from itself");
  // The sender talks once (so there is a connection to close), then leaves.
  peers[0]->send(1, "hello", buffer(&x, 1)).wait();
  peers[1]->receive(0, "hello", buffer(&x, 1)).wait();
  Handle r = peers[1]->receive(0, "never", buffer(&x, 1));
  peers[0].reset();
  EXPECT_EQ(r.wait_status(), make_error_code(errc::peer_lost)) << r.message();
  EXPECT_NE(r.message().find("receive 'never' from "), std::string::npos) << r.message();
}

}  // namespace
}  // namespace kf
