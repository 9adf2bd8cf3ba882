// SPDX-License-Identifier: Apache-2.0
// What the mesh's connections share: socket options, the coroutine completion token, the
// sizes in which large payloads move, and the control frames of the handshakes. Works on both
// kinds of connection, TCP and the same-host Unix-domain socket (common/asio.hpp's Stream).
// Thread-safety: I/O context only.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "common/asio.hpp"
#include "kf/common/error.hpp"
#include "kf/common/fd.hpp"
#include "mesh/link.hpp"
#include "transport/frame.hpp"

namespace kf::detail {

inline constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
// Large payloads are written (and read straight into place) this much at a time, so that a
// long transfer shows progress (PeerState::last_tx, last_rx) to the collective's deadline. It
// was 1 MiB; 4 MiB measured 20-30% faster for 4-16 MiB allreduces of 2 workers over TCP
// (kf-bench, in turn: 4 MiB 3.7-4.1 -> 2.6-3.4 ms, 16 MiB 15.8-16.1 -> 10.9-14.0 ms) and no
// slower with 4 workers or over the same-host socket. Even at 100 MB/s a chunk takes 40 ms.
// With frame MACs each chunk goes through the tag just before it is written (sender) or just
// after it is read (receiver). Chunks of 256 KiB, which stay in a core's L2 between the two
// passes, made a 64 MiB allreduce of 2 workers over TCP slower, not faster: 48.7 against
// 38.3 ms (kf-bench, median of 5 runs in turn), the system calls and wake-ups costing more
// than the cache misses they saved. Nor does hashing after the write help: a first write of
// 256 KiB (whole segments) before its hash, so that the receiver starts at once, then the rest,
// each hashed after it went, and the tag in a write of its own, made a 1 MiB allreduce of 2
// workers slower (520 against 366 us; 64 MiB 53.0 against 49.6 ms; kf-bench compare
// --against, back to back, 3 rounds).
inline constexpr std::size_t kProgressChunk = std::size_t{4} << 20;
// Asio's async_write hands the socket at most 64 KiB per system call (transfer_all's default).
// Over loopback TCP, whose segments carry up to 65483 bytes, every such write went out as one
// full segment and a 53-byte one: twice the segments, and a system call per 64 KiB. This
// condition gives the kernel all that is left, which it cuts into full segments itself.
struct AllAtOnce {
  std::size_t operator()(const boost::system::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::numeric_limits<std::size_t>::max();
  }
};

// Data frames up to this size are written by post_send itself when the connection's writer is
// idle (Mesh::write_now); larger ones always go through the writer coroutine.
inline constexpr std::size_t kWriteNowBytes = 64 * 1024;

inline std::error_code to_std(const boost::system::error_code& ec) {
  if (ec == asio::error::eof) return std::make_error_code(std::errc::connection_reset);
  return ec;
}

template <typename Socket>
inline void set_buffer_sizes(Socket& s, std::size_t bytes) {
  const int n = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
  boost::system::error_code ignored;
  s.set_option(asio::socket_base::send_buffer_size(n), ignored);
  s.set_option(asio::socket_base::receive_buffer_size(n), ignored);
}

// buffer_bytes: PeerOptions::socket_buffer_bytes.
inline void set_socket_options(tcp::socket& s, std::size_t buffer_bytes) {
  set_close_on_exec(s.native_handle());
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  if (buffer_bytes > 0) set_buffer_sizes(s, buffer_bytes);
}

// Unix-domain sockets have small default buffers (about 200 KiB): with larger ones a big frame
// moves in fewer, larger copies and the writer blocks less often on the reader.
inline void set_socket_options(local_stream::socket& s, std::size_t buffer_bytes) {
  set_close_on_exec(s.native_handle());
  set_buffer_sizes(s, buffer_bytes > 0 ? buffer_bytes : std::size_t{4} << 20);
}

inline std::string describe(const tcp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}
inline std::string describe(const local_stream::endpoint&) { return "a same-host socket"; }

/// Writes the one-byte answer to a single-copy frame (transport::RemoteReply).
inline awaitable<std::error_code> write_reply(Stream& s, transport::RemoteReply r) {
  const auto b = static_cast<std::uint8_t>(r);
  auto [ec, n] = co_await asio::async_write(s, asio::buffer(&b, 1), kTuple);
  co_return to_std(ec);
}

/// Reads one control frame of type `want` (a handshake's) into `payload`, through `self`'s
/// read_exact.
template <typename Self>
inline awaitable<std::error_code> read_control(Self& self, Incoming& in, transport::FrameType want,
                                               std::vector<std::byte>& payload, std::string& why) {
  transport::HeaderBytes hb;
  if (auto ec = co_await self.read_exact(in, hb.data(), hb.size())) co_return ec;
  transport::FrameHeader h;
  if (!transport::decode(hb, self.max_frame_bytes(), h, why)) {
    co_return make_error_code(errc::protocol_error);
  }
  if (h.type != want) {
    why = "expected frame type " + std::to_string(static_cast<int>(want)) + ", got " +
          std::to_string(static_cast<int>(h.type));
    co_return make_error_code(errc::protocol_error);
  }
  payload.resize(h.payload_bytes);
  co_return co_await self.read_exact(in, payload.data(), payload.size());
}

/// Writes one control frame.
inline awaitable<std::error_code> write_control(Stream& s, transport::FrameType t,
                                                const std::vector<std::byte>& payload) {
  transport::FrameHeader h;
  h.type = t;
  h.payload_bytes = payload.size();
  const auto hb = transport::encode(h);
  std::array<asio::const_buffer, 2> bufs{asio::buffer(hb), asio::buffer(payload)};
  auto [ec, n] = co_await asio::async_write(s, bufs, kTuple);
  co_return to_std(ec);
}

}  // namespace kf::detail
