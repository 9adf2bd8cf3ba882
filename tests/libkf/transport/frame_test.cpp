// SPDX-License-Identifier: Apache-2.0
#include "transport/frame.hpp"

#include <gtest/gtest.h>

#include "transport/auth.hpp"

namespace kf::transport {
namespace {

TEST(Frame, HeaderRoundTripsEveryField) {
  FrameHeader h;
  h.type = FrameType::data;
  h.flags = kFlagRemote;
  h.cluster_version = 0x0102030405060708ull;
  h.tag = 77;
  h.name_bytes = 12;
  h.payload_bytes = 1u << 20;
  const auto b = encode(h);
  EXPECT_EQ(static_cast<unsigned>(b[0]), 'K');
  EXPECT_EQ(static_cast<unsigned>(b[8]), 0x08u);  // little-endian
  FrameHeader out;
  std::string why;
  ASSERT_TRUE(decode(b, 64u << 20, out, why)) << why;
  EXPECT_EQ(out.type, h.type);
  EXPECT_EQ(out.flags, h.flags);
  EXPECT_EQ(out.cluster_version, h.cluster_version);
  EXPECT_EQ(out.tag, h.tag);
  EXPECT_EQ(out.name_bytes, h.name_bytes);
  EXPECT_EQ(out.payload_bytes, h.payload_bytes);
}

TEST(Frame, RejectsBadMagicVersionTypeAndLengthsWithAReason) {
  FrameHeader h;
  h.payload_bytes = 10;
  FrameHeader out;
  std::string why;
  auto b = encode(h);
  b[0] = std::byte{'X'};
  EXPECT_FALSE(decode(b, 1024, out, why));
  EXPECT_NE(why.find("bad magic"), std::string::npos);

  b = encode(h);
  b[4] = std::byte{9};
  EXPECT_FALSE(decode(b, 1024, out, why));
  EXPECT_NE(why.find("protocol version 9"), std::string::npos);

  b = encode(h);
  b[6] = std::byte{200};
  EXPECT_FALSE(decode(b, 1024, out, why));
  EXPECT_NE(why.find("unknown frame type 200"), std::string::npos);

  h.payload_bytes = 1025;
  EXPECT_FALSE(decode(encode(h), 1024, out, why));
  EXPECT_NE(why.find("exceeds the limit of 1024"), std::string::npos);

  h.payload_bytes = 0;
  h.name_bytes = kMaxNameBytes + 1;
  EXPECT_FALSE(decode(encode(h), 1024, out, why));
  EXPECT_NE(why.find("name of"), std::string::npos);

  FrameHeader c;
  c.type = FrameType::hello;
  c.payload_bytes = kMaxControlPayload + 1;
  EXPECT_FALSE(decode(encode(c), 1u << 30, out, why)) << "control frames have a small limit";
  c.payload_bytes = 4;
  c.name_bytes = 3;
  EXPECT_FALSE(decode(encode(c), 1u << 30, out, why));

  FrameHeader inv;
  inv.type = FrameType::invite;
  inv.payload_bytes = kMaxInvitePayload;
  EXPECT_TRUE(decode(encode(inv), 1024, out, why)) << "an invitation may exceed the data limit";
  EXPECT_EQ(out.type, FrameType::invite);
  inv.payload_bytes = kMaxInvitePayload + 1;
  EXPECT_FALSE(decode(encode(inv), 1u << 30, out, why));
  EXPECT_NE(why.find("exceeds the limit"), std::string::npos);
}

TEST(Frame, RejectsUnknownFlagsAndFlagsOnControlFrames) {
  FrameHeader out;
  std::string why;
  FrameHeader d;
  d.flags = 0x04;
  EXPECT_FALSE(decode(encode(d), 1024, out, why));
  EXPECT_NE(why.find("unknown flags 0x04"), std::string::npos) << why;
  d.flags = kFlagShared;
  EXPECT_FALSE(decode(encode(d), 1024, out, why));
  EXPECT_NE(why.find("shared-region flag without the single-copy flag"), std::string::npos) << why;
  d.flags = kFlagRemote | kFlagShared;
  EXPECT_TRUE(decode(encode(d), 1024, out, why)) << why;
  EXPECT_EQ(out.flags, kFlagRemote | kFlagShared);
  d.flags = kFlagRemote | 0x80;
  EXPECT_FALSE(decode(encode(d), 1024, out, why));
  EXPECT_NE(why.find("unknown flags 0x81"), std::string::npos) << why;
  FrameHeader c;
  c.type = FrameType::heartbeat;
  c.flags = kFlagRemote;
  EXPECT_FALSE(decode(encode(c), 1024, out, why));
  EXPECT_NE(why.find("control frame carries flags"), std::string::npos) << why;
}

TEST(Auth, MacDependsOnEveryInputAndVerifies) {
  const Nonce n = random_nonce();
  const Key k = derive_key("secret", KeyUse::peers);
  const Mac m = handshake_mac(k, "hello", "job", "127.0.0.1:1", n);
  EXPECT_TRUE(mac_equal(m, handshake_mac(k, "hello", "job", "127.0.0.1:1", n)));
  EXPECT_FALSE(mac_equal(
      m, handshake_mac(derive_key("Secret", KeyUse::peers), "hello", "job", "127.0.0.1:1", n)));
  EXPECT_FALSE(mac_equal(m, handshake_mac(k, "welcome", "job", "127.0.0.1:1", n)));
  EXPECT_FALSE(mac_equal(m, handshake_mac(k, "hello", "jo", "b127.0.0.1:1", n)));
  EXPECT_FALSE(mac_equal(m, handshake_mac(k, "hello", "job", "127.0.0.1:1", random_nonce())));
}

// HKDF-SHA256 (RFC 5869): one token gives unrelated keys per use, and different tokens give
// different keys; the control key is what HMAC over the same inputs computes by hand.
TEST(Auth, KeysDerivedFromTheTokenDifferByUse) {
  const Key peers = derive_key("token", KeyUse::peers);
  const Key control = derive_key("token", KeyUse::control);
  EXPECT_NE(peers, control);
  EXPECT_EQ(peers, derive_key("token", KeyUse::peers));
  EXPECT_NE(peers, derive_key("token2", KeyUse::peers));
  // RFC 5869 by hand: PRK = HMAC(salt, token); OKM = HMAC(PRK, info | 0x01).
  Key salt{};
  const std::string s = "kf job token";
  // HMAC with a key shorter than the block is the key zero-padded: a 32-byte Key holding the
  // salt stands for it.
  std::copy(s.begin(), s.end(), salt.begin());
  const std::string prk_hex = hmac_sha256_hex(salt, "token");
  Key prk{};
  for (std::size_t i = 0; i < prk.size(); ++i) {
    prk[i] = static_cast<unsigned char>(std::stoi(prk_hex.substr(2 * i, 2), nullptr, 16));
  }
  const std::string okm = hmac_sha256_hex(prk, std::string("kf peers v1") + '\x01');
  std::string got;
  for (unsigned char b : peers) {
    static constexpr char kDigits[] = "0123456789abcdef";
    got.push_back(kDigits[b >> 4]);
    got.push_back(kDigits[b & 0xf]);
  }
  EXPECT_EQ(got, okm);
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(equal_in_constant_time("abc", "abc"));
  EXPECT_FALSE(equal_in_constant_time("abc", "abd"));
  EXPECT_FALSE(equal_in_constant_time("abc", "abcd"));
}

TEST(Auth, HelloAndWelcomeRoundTripAndRejectTruncation) {
  Hello h{"job-1", "10.0.0.1:5000", random_nonce(), {}};
  h.mac = handshake_mac(derive_key("t", KeyUse::peers), "hello", h.job_id, h.identity, h.nonce);
  auto bytes = encode(h);
  auto back = decode_hello(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->job_id, h.job_id);
  EXPECT_EQ(back->identity, h.identity);
  EXPECT_TRUE(mac_equal(back->mac, h.mac));
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<std::byte> part(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_FALSE(decode_hello(part).has_value()) << "truncated at " << cut;
  }
  bytes.push_back(std::byte{0});
  EXPECT_FALSE(decode_hello(bytes).has_value()) << "trailing bytes";
  Welcome w{"a:1", h.mac};
  auto wb = encode(w);
  ASSERT_TRUE(decode_welcome(wb).has_value());
  wb.pop_back();
  EXPECT_FALSE(decode_welcome(wb).has_value());
}

}  // namespace
}  // namespace kf::transport
