// SPDX-License-Identifier: Apache-2.0
// Frame tags: the vector GHASH and OpenSSL's AES-GCM give the same GMAC tags, whatever the
// frames' lengths and however their bytes are split between update calls.
#include "transport/frame_mac.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

namespace kf::transport {
namespace {

std::string hex(const Tag& t) {
  std::string s;
  char b[3];
  for (auto x : t) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(x));
    s += b;
  }
  return s;
}

Tag tag_of(FrameMac& mac, const std::vector<std::byte>& frame, std::mt19937_64& rng) {
  mac.begin();
  mac.update(nullptr, 0);  // an empty name or payload: no bytes, no buffer
  // In pieces of random lengths (some empty), as the socket hands them over.
  std::size_t at = 0;
  while (at < frame.size()) {
    std::size_t n = rng() % 4 == 0 ? rng() % 40 : rng() % (frame.size() - at + 1);
    n = std::min(n, frame.size() - at);
    mac.update(frame.data() + at, n);
    at += n;
  }
  return mac.finish();
}

TEST(FrameMac, EmptyFirstFrameUnderTheZeroKeyIsGcmsKnownTag) {
  // AES-256-GCM, zero key, zero 96-bit nonce, nothing authenticated: GCM's published test
  // case 13.
  for (auto kind : {FrameMac::Kind::best, FrameMac::Kind::openssl}) {
    FrameMac mac(Key{}, kind);
    mac.begin();
    EXPECT_EQ(hex(mac.finish()), "530f8afbc74536b9a963b4f1c4cb738b");
  }
}

TEST(FrameMac, VectorTagsEqualOpensslTagsAtEveryLength) {
  Key key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(i * 7 + 3);
  FrameMac fast(key, FrameMac::Kind::best);
  FrameMac slow(key, FrameMac::Kind::openssl);
  if (!fast.vector()) GTEST_SKIP() << "this processor lacks AVX-512 with VPCLMULQDQ";
  std::mt19937_64 rng(11);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (std::size_t n : {4095u, 4096u, 4097u, 65536u + 5, (1u << 20) + 7}) lengths.push_back(n);
  for (std::size_t n : lengths) {
    std::vector<std::byte> frame(n);
    for (auto& b : frame) b = static_cast<std::byte>(rng());
    const Tag a = tag_of(fast, frame, rng);
    const Tag b = tag_of(slow, frame, rng);
    ASSERT_EQ(hex(a), hex(b)) << "frame of " << n << " bytes, number " << fast.frames();
  }
  EXPECT_EQ(fast.frames(), slow.frames());
}

// The start-up check: Kind::best uses the vector GHASH exactly where it was checked against
// OpenSSL's tags and agreed.
TEST(FrameMac, TheBestKindUsesTheVectorGhashOnlyOnceItWasChecked) {
  FrameMac best(Key{}, FrameMac::Kind::best);
  EXPECT_EQ(best.vector(), FrameMac::vector_checked());
  FrameMac unchecked(Key{}, FrameMac::Kind::vector);
  if (!unchecked.vector()) {
    EXPECT_FALSE(FrameMac::vector_checked()) << "checked without the vector GHASH";
    GTEST_SKIP() << "this processor lacks AVX-512 with VPCLMULQDQ";
  }
  EXPECT_TRUE(FrameMac::vector_checked()) << "the vector GHASH disagrees with OpenSSL";
}

TEST(FrameMac, AnyChangedBitChangesTheTag) {
  FrameMac a(Key{}), b(Key{});
  std::vector<std::byte> frame(777, std::byte{0x5a});
  std::mt19937_64 rng(3);
  const Tag genuine = tag_of(a, frame, rng);
  for (std::size_t bit : {0u, 9u, 777u * 8 - 1}) {
    FrameMac fresh(Key{});
    auto altered = frame;
    altered[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    EXPECT_NE(hex(tag_of(fresh, altered, rng)), hex(genuine)) << "bit " << bit;
  }
  // The same bytes as the next frame on the connection get another tag (the nonce moved on).
  EXPECT_NE(hex(tag_of(b, frame, rng)), hex(tag_of(b, frame, rng)));
}

// A frame tagged but never written (the socket took nothing, then the send was cancelled) gives
// its number back: the next frame gets the tag the receiver, which never saw the first, expects.
// Without it, the receiver refuses that frame's tag and counts a healthy sender as lost.
TEST(FrameMac, AFrameNeverWrittenGivesItsNumberBack) {
  FrameMac sender(Key{}), receiver(Key{}), without(Key{});
  std::vector<std::byte> dropped(100, std::byte{1}), next(60, std::byte{2});
  std::mt19937_64 rng(5);
  (void)tag_of(sender, dropped, rng);
  sender.rewind();
  EXPECT_EQ(sender.frames(), 0u);
  const Tag sent = tag_of(sender, next, rng);
  EXPECT_EQ(hex(sent), hex(tag_of(receiver, next, rng)));
  (void)tag_of(without, dropped, rng);
  EXPECT_NE(hex(tag_of(without, next, rng)), hex(sent)) << "a number lost: the tags part ways";
}

}  // namespace
}  // namespace kf::transport
