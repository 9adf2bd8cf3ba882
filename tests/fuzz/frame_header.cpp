// SPDX-License-Identifier: Apache-2.0
// Frame headers (transport/frame.hpp): a header decode() accepts re-encodes to the same 32
// bytes, and respects its type's limits (name, payload, flags); a refused one says why.
#include <algorithm>
#include <cstring>

#include "check.hpp"
#include "transport/frame.hpp"

using namespace kf::transport;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
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
