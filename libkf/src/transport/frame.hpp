// SPDX-License-Identifier: Apache-2.0
// The wire frame (docs/protocol.md): a fixed 32-byte little-endian header, then the name, then
// the payload. decode() checks every field against the limits before anything is allocated.
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kf::transport {

inline constexpr std::uint32_t kMagic = 0x3146464bu;  // "KFF1" in little-endian byte order
// 2: shared-memory ring records on cache lines, published by stamps (docs/protocol.md).
// 3: the handshake keyed by the peers' key derived from the token, not by the token itself.
// 4: single-copy frames may name a shared region of the sender (kFlagShared).
inline constexpr std::uint16_t kProtocolVersion = 4;
inline constexpr std::size_t kHeaderBytes = 32;
inline constexpr std::uint32_t kMaxNameBytes = 1024;
inline constexpr std::uint64_t kMaxControlPayload = 4096;
/// An invitation carries a cluster document, which grows with the number of workers.
inline constexpr std::uint64_t kMaxInvitePayload = std::uint64_t{1} << 20;
/// How far a frame's cluster version may run ahead of the receiver's (once it has one): further
/// is no member's, and the connection is closed.
inline constexpr std::uint64_t kMaxVersionLead = std::uint64_t{1} << 16;

enum class FrameType : std::uint8_t {
  challenge = 1,    ///< acceptor -> dialer: nonce
  hello = 2,        ///< dialer -> acceptor: job id, identity, nonce, HMAC
  welcome = 3,      ///< acceptor -> dialer: identity, HMAC over the dialer's nonce
  data = 4,         ///< a collective's message: name + tag identify it
  notice_lost = 5,  ///< "this peer is gone": payload is its endpoint
  bye = 6,          ///< the sender is leaving cleanly; no more frames follow
  heartbeat = 7,
  invite = 8,  ///< "join the job": payload is the session's invitation (JSON), sent to joiners
  /// dialer -> acceptor, first after the handshake on a same-host connection: the name of a
  /// shared-memory ring (ShmRing) for small data frames; answered with one RemoteReply byte
  /// (copied: the acceptor reads the ring from now on; send_inline: it declined).
  ring_offer = 9,
};

/// Header flag of a data frame sent over a same-host connection: the payload stays in the
/// sender's memory. What follows the name is the payload's 8-byte address in the sender instead
/// of the payload; the receiver copies it from there (process_vm_readv) and answers with one
/// RemoteReply byte on the same connection. The sender's buffer stays untouched until then.
inline constexpr std::uint8_t kFlagRemote = 0x01;
inline constexpr std::size_t kRemoteAddressBytes = 8;

/// Header flag of a single-copy frame (only with kFlagRemote) whose payload lies in one of the
/// sender's kf::SharedMemory regions: after the address come kSharedRefBytes naming it, the
/// memory file's descriptor number in the sender (u32), zero (u32), the region's id (u64) and
/// the payload's offset in the file (u64). The receiver may map the file (pidfd_getfd) and read
/// the payload from the mapping, or copy it from the address as for any single-copy frame; it
/// answers the same way.
inline constexpr std::uint8_t kFlagShared = 0x02;
inline constexpr std::size_t kSharedRefBytes = 24;

enum class RemoteReply : std::uint8_t {
  copied = 1,       ///< the receiver has the payload; the sender may reuse its buffer
  send_inline = 2,  ///< the kernel refused the copy: the sender now writes the payload inline
};

struct FrameHeader {
  FrameType type = FrameType::data;
  std::uint8_t flags = 0;
  std::uint64_t cluster_version = 0;
  std::uint32_t tag = 0;
  std::uint32_t name_bytes = 0;
  std::uint64_t payload_bytes = 0;
};

using HeaderBytes = std::array<std::byte, kHeaderBytes>;

HeaderBytes encode(const FrameHeader& h) noexcept;

/// Parses and validates a header. On failure returns false and sets `why` to the reason
/// ("bad magic 0x...", "payload of N bytes exceeds the limit of M", ...).
bool decode(const HeaderBytes& b, std::uint64_t max_payload, FrameHeader& out, std::string& why);

}  // namespace kf::transport
