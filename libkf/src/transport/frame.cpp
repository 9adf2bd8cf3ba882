// SPDX-License-Identifier: Apache-2.0
#include "transport/frame.hpp"

#include <bit>
#include <cstdio>
#include <cstring>

namespace kf::transport {

namespace {

// Little-endian fields. On a little-endian host each is one load or store (a header is encoded
// and decoded for every frame, and the byte loops cost more than the rest of a small frame's
// bookkeeping there).
template <typename T>
void put(HeaderBytes& b, std::size_t at, T v) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(b.data() + at, &v, sizeof(T));
  } else {
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      b[at + i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xffu);
    }
  }
}

template <typename T>
T get(const HeaderBytes& b, std::size_t at) noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    return v;
  } else {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
    }
    return static_cast<T>(v);
  }
}

}  // namespace

HeaderBytes encode(const FrameHeader& h) noexcept {
  HeaderBytes b{};
  put<std::uint32_t>(b, 0, kMagic);
  put<std::uint16_t>(b, 4, kProtocolVersion);
  put<std::uint8_t>(b, 6, static_cast<std::uint8_t>(h.type));
  put<std::uint8_t>(b, 7, h.flags);
  put<std::uint64_t>(b, 8, h.cluster_version);
  put<std::uint32_t>(b, 16, h.tag);
  put<std::uint32_t>(b, 20, h.name_bytes);
  put<std::uint64_t>(b, 24, h.payload_bytes);
  return b;
}

bool decode(const HeaderBytes& b, std::uint64_t max_payload, FrameHeader& out, std::string& why) {
  char text[128];
  const auto magic = get<std::uint32_t>(b, 0);
  if (magic != kMagic) {
    std::snprintf(text, sizeof text, "bad magic 0x%08x", magic);
    why = text;
    return false;
  }
  const auto version = get<std::uint16_t>(b, 4);
  if (version != kProtocolVersion) {
    why = "unsupported protocol version " + std::to_string(version) + " (this peer speaks " +
          std::to_string(kProtocolVersion) + ")";
    return false;
  }
  const auto type = get<std::uint8_t>(b, 6);
  if (type < static_cast<std::uint8_t>(FrameType::challenge) ||
      type > static_cast<std::uint8_t>(FrameType::ring_offer)) {
    why = "unknown frame type " + std::to_string(type);
    return false;
  }
  out.type = static_cast<FrameType>(type);
  out.flags = get<std::uint8_t>(b, 7);
  out.cluster_version = get<std::uint64_t>(b, 8);
  out.tag = get<std::uint32_t>(b, 16);
  out.name_bytes = get<std::uint32_t>(b, 20);
  out.payload_bytes = get<std::uint64_t>(b, 24);
  if (out.name_bytes > kMaxNameBytes) {
    why = "name of " + std::to_string(out.name_bytes) + " bytes exceeds the limit of " +
          std::to_string(kMaxNameBytes);
    return false;
  }
  const std::uint64_t limit = out.type == FrameType::data     ? max_payload
                              : out.type == FrameType::invite ? kMaxInvitePayload
                                                              : kMaxControlPayload;
  if (out.payload_bytes > limit) {
    why = "payload of " + std::to_string(out.payload_bytes) + " bytes exceeds the limit of " +
          std::to_string(limit);
    return false;
  }
  if ((out.flags & ~(kFlagRemote | kFlagShared)) != 0) {
    std::snprintf(text, sizeof text, "unknown flags 0x%02x", out.flags);
    why = text;
    return false;
  }
  if ((out.flags & kFlagShared) != 0 && (out.flags & kFlagRemote) == 0) {
    why = "shared-region flag without the single-copy flag";
    return false;
  }
  if (out.flags != 0 && out.type != FrameType::data) {
    why = "control frame carries flags";
    return false;
  }
  if (out.type != FrameType::data && out.name_bytes != 0) {
    why = "control frame carries a name";
    return false;
  }
  return true;
}

}  // namespace kf::transport
