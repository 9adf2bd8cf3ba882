// SPDX-License-Identifier: Apache-2.0
// Frame headers (transport/frame.hpp): a header decode() accepts re-encodes to the same 32
// bytes, and respects its type's limits (name, payload, flags); a refused one says why. And the
// frame's tag (transport/frame_mac.hpp): the input taken as a frame, in pieces of the lengths its
// bytes say, gets the same tag from the vector GHASH (where the processor has it) as from
// OpenSSL's AES-GCM, at the frame number its first byte says.
#include <algorithm>
#include <cstring>

#include "check.hpp"
#include "transport/frame.hpp"
#include "transport/frame_mac.hpp"

using namespace kf::transport;

namespace {

Tag tag_in_pieces(FrameMac& mac, const std::uint8_t* data, std::size_t size) {
  mac.begin();
  std::size_t at = 0;
  while (at < size) {
    const std::size_t n = std::min<std::size_t>(size - at, 1 + data[at] % 97);
    mac.update(data + at, n);
    at += n;
  }
  return mac.finish();
}

void same_tags(const std::uint8_t* data, std::size_t size) {
  static FrameMac vector(kf::Key{}, FrameMac::Kind::vector);
  static FrameMac openssl(kf::Key{}, FrameMac::Kind::openssl);
  if (!vector.vector()) return;  // nothing to compare with here
  // Both at the same frame number: a few frames on from the last input's.
  const int skip = size > 0 ? data[0] % 4 : 0;
  for (int i = 0; i < skip; ++i) {
    vector.begin();
    (void)vector.finish();
    openssl.begin();
    (void)openssl.finish();
  }
  const Tag a = tag_in_pieces(vector, data, size);
  const Tag b = tag_in_pieces(openssl, data, size);
  KF_FUZZ_CHECK(tag_equal(a, b), "the vector GHASH and OpenSSL disagree on a frame of " +
                                     std::to_string(size) + " bytes, number " +
                                     std::to_string(openssl.frames() - 1));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  same_tags(data, size);
  HeaderBytes b{};
  std::memcpy(b.data(), data, std::min(size, b.size()));
  // The data limit a worker uses (PeerOptions::max_frame_bytes), or a small one.
  const std::uint64_t max_payload = size > b.size() && (data[b.size()] & 1) ? 4096 : 64u << 20;
  FrameHeader h;
  std::string why;
  if (!decode(b, max_payload, h, why)) {
    KF_FUZZ_CHECK(!why.empty(), "a refused header must say why");
    return 0;
  }
  KF_FUZZ_CHECK(encode(h) == b, "an accepted header must re-encode to its bytes");
  KF_FUZZ_CHECK(h.name_bytes <= kMaxNameBytes, std::to_string(h.name_bytes));
  const std::uint64_t limit = h.type == FrameType::data     ? max_payload
                              : h.type == FrameType::invite ? kMaxInvitePayload
                                                            : kMaxControlPayload;
  KF_FUZZ_CHECK(h.payload_bytes <= limit, std::to_string(h.payload_bytes));
  if (h.type != FrameType::data) {
    KF_FUZZ_CHECK(h.flags == 0 && h.name_bytes == 0, "a control frame has no flags or name");
  }
  return 0;
}
