// SPDX-License-Identifier: Apache-2.0
// Frame tags: the vector GHASH and OpenSSL's AES-GCM give the same GMAC tags, whatever the
// frames' lengths and however their bytes are split between update calls.
#include "transport/frame_mac.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>

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

// GMAC as GCM's specification writes it, one bit at a time, for the frame numbered `seq` (its
// 96-bit nonce: the number in 8 little-endian bytes, then zeros, as FrameMac numbers frames):
// H = AES(K, 0), GHASH over the data zero-padded to blocks and the block of its length in bits,
// the tag that GHASH XOR AES(K, nonce || 1). Only the AES block comes from OpenSSL.
Tag reference_tag(const Key& key, std::uint64_t seq, const std::vector<std::byte>& data) {
  using Block = std::array<unsigned char, 16>;
  const auto aes = [&](const Block& in) {
    Block out{};
    EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
    int n = 0;
    EVP_EncryptInit_ex(ctx, EVP_aes_256_ecb(), nullptr,
                       reinterpret_cast<const unsigned char*>(key.data()), nullptr);
    EVP_CIPHER_CTX_set_padding(ctx, 0);
    EVP_EncryptUpdate(ctx, out.data(), &n, in.data(), 16);
    EVP_CIPHER_CTX_free(ctx);
    return out;
  };
  // X * Y in GF(2^128), bits numbered from the first byte's most significant one.
  const auto multiply = [](const Block& x, const Block& y) {
    Block z{}, v = y;
    for (int i = 0; i < 128; ++i) {
      if ((x[static_cast<std::size_t>(i / 8)] >> (7 - i % 8)) & 1) {
        for (std::size_t k = 0; k < 16; ++k) z[k] ^= v[k];
      }
      const bool low = v[15] & 1;
      for (std::size_t k = 15; k > 0; --k) {
        v[k] = static_cast<unsigned char>((v[k] >> 1) | (v[k - 1] << 7));
      }
      v[0] >>= 1;
      if (low) v[0] ^= 0xe1;
    }
    return z;
  };
  const Block h = aes(Block{});
  Block x{};
  for (std::size_t at = 0; at < data.size(); at += 16) {
    for (std::size_t k = 0; k < 16 && at + k < data.size(); ++k) {
      x[k] ^= static_cast<unsigned char>(data[at + k]);
    }
    x = multiply(x, h);
  }
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  for (std::size_t k = 0; k < 8; ++k) x[k] ^= static_cast<unsigned char>(bits >> (56 - 8 * k));
  x = multiply(x, h);
  Block j0{};
  for (std::size_t k = 0; k < 8; ++k) j0[k] = static_cast<unsigned char>(seq >> (8 * k));
  j0[15] = 1;
  const Block pad = aes(j0);
  Tag tag{};
  for (std::size_t k = 0; k < 16; ++k) tag[k] = static_cast<std::byte>(x[k] ^ pad[k]);
  return tag;
}

// Known answers with data: the tags of frames of many lengths, at several frame numbers, against
// the specification's GMAC above (itself checked against GCM's published test case 13), for
// both ways FrameMac computes them.
TEST(FrameMac, TagsWithDataEqualGcmsSpecification) {
  EXPECT_EQ(hex(reference_tag(Key{}, 0, {})), "530f8afbc74536b9a963b4f1c4cb738b");
  Key key{};
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(255 - i * 5);
  std::mt19937_64 rng(17);
  std::vector<FrameMac::Kind> kinds{FrameMac::Kind::openssl};
  if (FrameMac(key, FrameMac::Kind::vector).vector()) kinds.push_back(FrameMac::Kind::vector);
  for (const auto kind : kinds) {
    FrameMac mac(key, kind);
    std::uint64_t seq = 0;
    for (std::size_t n : {1u,   13u,  15u,  16u,  17u,  31u,  32u,  33u,  63u,   64u,  65u,
                          127u, 128u, 129u, 255u, 256u, 257u, 511u, 512u, 1000u, 4099u}) {
      std::vector<std::byte> frame(n);
      for (auto& b : frame) b = static_cast<std::byte>(rng());
      ASSERT_EQ(hex(tag_of(mac, frame, rng)), hex(reference_tag(key, seq++, frame)))
          << (kind == FrameMac::Kind::vector ? "vector" : "openssl") << ", " << n << " bytes";
    }
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
