// SPDX-License-Identifier: Apache-2.0
// The mailbox on its own, without sockets: frames meet their receives in either order, early
// frames stay within their limit, the claimer sees frames first, and (debug builds) calling it
// from a thread that does not run the I/O context is caught.
#include "mailbox/mailbox.hpp"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kf::detail {
namespace {

class MailboxTest : public ::testing::Test {
 protected:
  asio::io_context ioc_{1};
  Driver driver_{ioc_};
  Driver::Running running_{driver_};  // this thread plays the context's runner
  Mailbox box_{driver_, ioc_.get_executor(), 2048, 1024};
  std::string why_;

  std::error_code store(const MailKeyView& k, const std::vector<std::byte>& payload,
                        std::uint64_t current = 1) {
    bool stale = false;
    return box_.store(k, payload, nullptr, current, stale, why_);
  }
};

std::vector<std::byte> bytes_of(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

TEST_F(MailboxTest, AFrameFillsTheReceivePostedBeforeIt) {
  std::byte dst[3] = {};
  const MailKeyView key{0, 1, 0, "g"};
  auto req = box_.post(key, dst, 3, nullptr, {});
  EXPECT_FALSE(req->ev.done);
  EXPECT_FALSE(store(key, bytes_of({7, 8, 9})));
  EXPECT_TRUE(req->ev.done);
  EXPECT_FALSE(req->ev.ec);
  EXPECT_EQ(dst[2], std::byte{9});
  EXPECT_EQ(box_.early_bytes(), 0u);
}

TEST_F(MailboxTest, AnEarlyFrameIsDeliveredWhenItsReceiveIsPosted) {
  const MailKeyView key{1, 1, 2, "a-long-name-that-does-not-fit-the-quick-early-frames-list"};
  EXPECT_FALSE(store(key, bytes_of({1, 2})));
  EXPECT_EQ(box_.early_bytes(), 2u);
  std::byte dst[2] = {};
  auto req = box_.take_early_into(key, dst, 2, nullptr);
  ASSERT_NE(req, nullptr);
  EXPECT_TRUE(req->ev.done);
  EXPECT_FALSE(req->ev.ec);
  EXPECT_EQ(dst[0], std::byte{1});
  // Taken: a second receive for the key waits.
  EXPECT_EQ(box_.take_early_into(key, dst, 2, nullptr), nullptr);
}

TEST_F(MailboxTest, AnEarlyFrameOfTheWrongSizeFailsItsReceive) {
  const MailKeyView key{0, 1, 0, "w"};
  EXPECT_FALSE(store(key, bytes_of({1, 2, 3})));
  std::byte dst[2] = {};
  auto req = box_.take_early_into(key, dst, 2, nullptr);
  ASSERT_NE(req, nullptr);
  EXPECT_EQ(req->ev.ec, make_error_code(errc::protocol_error));
}

TEST_F(MailboxTest, EarlyFramesPastTheLimitEndTheConnection) {
  const std::vector<std::byte> big(900);
  EXPECT_FALSE(store(MailKeyView{0, 1, 0, "one"}, big));
  EXPECT_EQ(store(MailKeyView{0, 1, 0, "two"}, big), make_error_code(errc::protocol_error));
  EXPECT_NE(why_.find("limit of 1024 bytes per peer"), std::string::npos) << why_;
}

// Each early frame is charged its name and bookkeeping too: frames with nothing in them still
// reach the limit, after 1024 / (0 + 4 + kEarlyFrameOverhead) of them.
TEST_F(MailboxTest, EmptyEarlyFramesAreChargedTheirBookkeeping) {
  const std::size_t fits = 1024 / early_charge(0, 4);
  for (std::size_t i = 0; i < fits; ++i) {
    const std::string name = "e" + std::to_string(100 + i);
    ASSERT_FALSE(store(MailKeyView{0, 1, 1, name}, {})) << i << ": " << why_;
  }
  EXPECT_EQ(box_.unexpected_bytes(0), fits * early_charge(0, 4));
  EXPECT_EQ(store(MailKeyView{0, 1, 1, "e999"}, {}), make_error_code(errc::protocol_error));
  EXPECT_EQ(box_.early_bytes(), 0u) << "no payload bytes were kept";
}

// One sender cannot take the whole budget: past its own limit it is refused while another
// still gets room, and the limit of all peers together holds as well.
TEST_F(MailboxTest, EachPeerHasItsOwnLimitWithinTheLimitOfAll) {
  const std::vector<std::byte> part(600);
  EXPECT_FALSE(store(MailKeyView{0, 1, 0, "a"}, part));
  EXPECT_EQ(store(MailKeyView{0, 1, 0, "b"}, part), make_error_code(errc::protocol_error));
  EXPECT_FALSE(store(MailKeyView{1, 1, 0, "a"}, part)) << why_;
  EXPECT_FALSE(store(MailKeyView{2, 1, 0, "a"}, part)) << why_;
  EXPECT_EQ(store(MailKeyView{3, 1, 0, "a"}, part), make_error_code(errc::protocol_error));
  EXPECT_NE(why_.find("limit of 2048 bytes ("), std::string::npos) << why_;
  // Taken frames are uncharged, to their sender.
  std::vector<std::byte> dst(600);
  EXPECT_NE(box_.take_early_into(MailKeyView{1, 1, 0, "a"}, dst.data(), dst.size(), nullptr),
            nullptr);
  EXPECT_EQ(box_.unexpected_bytes(1), 0u);
  EXPECT_FALSE(store(MailKeyView{3, 1, 0, "a"}, part)) << why_;
}

// A new cluster version drops the early frames of older ones, and their charge with them, even
// where a receive of the older version is still posted.
TEST_F(MailboxTest, DroppingOlderVersionsReleasesTheirCharge) {
  EXPECT_FALSE(store(MailKeyView{0, 1, 0, "quick"}, bytes_of({1})));
  std::byte dst[1];
  auto posted = box_.post(MailKeyView{0, 1, 0, "p"}, dst, 1, nullptr, {});
  EXPECT_FALSE(store(MailKeyView{0, 1, 0, "p#2"}, std::vector<std::byte>(300)));
  EXPECT_FALSE(store(MailKeyView{0, 1, 7, "tagged"}, std::vector<std::byte>(300)));
  box_.drop_older(2);
  EXPECT_EQ(box_.unexpected_bytes(0), 0u);
  EXPECT_FALSE(store(MailKeyView{0, 2, 0, "big"}, std::vector<std::byte>(900))) << why_;
}

TEST_F(MailboxTest, AStaleFrameThatNobodyWaitsForIsDropped) {
  bool stale = false;
  const auto payload = bytes_of({1});
  EXPECT_FALSE(box_.store(MailKeyView{0, 3, 0, "old"}, payload, nullptr, 4, stale, why_));
  EXPECT_TRUE(stale);
  EXPECT_EQ(box_.early_bytes(), 0u);
}

TEST_F(MailboxTest, ARefusedReceiveFailsAtOnce) {
  std::byte dst[1];
  auto req =
      box_.post(MailKeyView{0, 1, 0, "r"}, dst, 1, nullptr, make_error_code(errc::peer_lost));
  EXPECT_TRUE(req->ev.done);
  EXPECT_EQ(req->ev.ec, make_error_code(errc::peer_lost));
}

TEST_F(MailboxTest, FailPostedFailsOnlyTheMatchingReceives) {
  std::byte d1[1], d2[1];
  auto from0 = box_.post(MailKeyView{0, 1, 0, "x"}, d1, 1, nullptr, {});
  auto from1 = box_.post(MailKeyView{1, 1, 0, "x"}, d2, 1, nullptr, {});
  box_.fail_posted(KeyMatch{0}, make_error_code(errc::peer_lost));
  EXPECT_EQ(from0->ev.ec, make_error_code(errc::peer_lost));
  EXPECT_FALSE(from1->ev.done);
}

struct Claims {
  int taken = 0;
  int failed_for_peer = -2;
};

TEST_F(MailboxTest, TheClaimerSeesFramesAndFailuresFirstWhileClaiming) {
  Claims claims;
  box_.set_claimer(
      [](void* self, const MailKeyView&, std::span<const std::byte>, std::error_code&,
         std::string&) {
        ++static_cast<Claims*>(self)->taken;
        return true;
      },
      [](void* self, const KeyMatch& match, std::error_code) {
        static_cast<Claims*>(self)->failed_for_peer = match.peer;
      },
      &claims);
  const MailKeyView key{0, 1, 0, "c"};
  EXPECT_FALSE(store(key, bytes_of({1})));
  box_.fail_posted(KeyMatch{3}, make_error_code(errc::peer_lost));
  EXPECT_EQ(claims.taken, 0) << "not asked while not claiming";
  EXPECT_EQ(claims.failed_for_peer, -2);
  box_.set_claiming(true);
  EXPECT_FALSE(store(key, bytes_of({1})));
  box_.fail_posted(KeyMatch{3}, make_error_code(errc::peer_lost));
  EXPECT_EQ(claims.taken, 1);
  EXPECT_EQ(claims.failed_for_peer, 3);
}

TEST(KeyMatch, CoversAPeerAndTheVersionsBelowALimit) {
  const MailKeyView k{2, 5, 0, "k"};
  EXPECT_TRUE(KeyMatch{}(k));
  EXPECT_TRUE(KeyMatch{2}(k));
  EXPECT_FALSE(KeyMatch{1}(k));
  EXPECT_TRUE((KeyMatch{2, 6})(k));
  EXPECT_FALSE((KeyMatch{2, 5})(k));
  EXPECT_TRUE((KeyMatch{-1, 6})(k));
}

TEST(MailboxConfinement, ACallOffTheContextsRunnerIsCaughtInDebugBuilds) {
#ifdef NDEBUG
  GTEST_SKIP() << "KF_DCHECK_IO compiles to nothing in release builds (NDEBUG)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  asio::io_context ioc{1};
  Driver driver{ioc};
  Mailbox box{driver, ioc.get_executor(), 1024, 1024};
  EXPECT_DEATH(box.take_early(MailKeyView{0, 1, 0, "x"}), "off the I/O context's runner");
  Driver::Running running{driver};
  EXPECT_FALSE(box.take_early(MailKeyView{0, 1, 0, "x"}).has_value());
#endif
}

}  // namespace
}  // namespace kf::detail
