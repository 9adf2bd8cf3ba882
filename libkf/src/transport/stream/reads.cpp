// SPDX-License-Identifier: Apache-2.0
// Reading frames from a connection (TCP or the same-host socket): exact reads through the
// read-ahead buffer, which over TCP is filled by peeking, and payloads that come from the
// socket or, single-copy, out of the sender's memory.
#include <sys/socket.h>

#include <cerrno>

#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/single_copy.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using transport::FrameHeader;
using transport::FrameType;

namespace {

// Drops from the socket the bytes that were peeked into the read-ahead buffer (they are
// there, so this never waits). Called only once the buffer's bytes were all taken: the buffer
// is then free to be named as the destination, which TCP's MSG_TRUNC leaves untouched (and a
// kernel that copied anyway would write the same bytes). Returns an error that ends the
// connection.
std::error_code drop_peeked(Incoming& in) {
  while (in.peeked > 0) {
    const ssize_t n =
        ::recv(in.sock.native_handle(), in.buf.data(), in.peeked, MSG_TRUNC | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return {errno, std::system_category()};
    if (n == 0) return std::make_error_code(std::errc::connection_reset);
    in.peeked -= std::min(in.peeked, static_cast<std::size_t>(n));
  }
  return {};
}

}  // namespace

bool Mesh::take_buffered(Incoming& in, std::byte* dst, std::size_t n) noexcept {
  if (in.end - in.begin < n) return false;
  if (in.mac && in.mac->active()) in.mac->update(in.buf.data() + in.begin, n);
  std::memcpy(dst, in.buf.data() + in.begin, n);
  in.begin += n;
  return true;
}

awaitable<std::error_code> Mesh::read_exact(Incoming& in, std::byte* dst, std::size_t n) {
  KF_DCHECK_IO(driver_);
  // With frame MACs, every byte of a frame counts towards its tag (but the tag's own).
  const bool absorb = in.mac && in.mac->active();
  const std::size_t have = std::min(n, in.end - in.begin);
  if (have > 0) {
    if (absorb) in.mac->update(in.buf.data() + in.begin, have);
    if (dst) std::memcpy(dst, in.buf.data() + in.begin, have);
    in.begin += have;
    n -= have;
    if (dst) dst += have;
  }
  while (n > 0) {
    // The buffer's bytes are all taken by now (a read that leaves some ends the loop): those
    // it peeked leave the socket before anything more is read from it.
    if (auto ec = drop_peeked(in)) co_return ec;
    if (n >= Incoming::kBufBytes / 4 && dst) {
      auto [ec, got] =
          co_await in.sock.async_read_some(asio::buffer(dst, std::min(n, kProgressChunk)), kTuple);
      if (ec) co_return to_std(ec);
      if (absorb) in.mac->update(dst, got);
      dst += got;
      n -= got;
    } else {
      // Not with more workers than cores: there the drop's system call and the step aside
      // before it cost more of the shared cores than the ACK's place on the path does (4
      // workers over TCP, 4 B 33.6-37.2 -> 37.0-43.5 us, 64 KiB 113-115 -> 126-130).
      const bool peek = in.peek && !driver_.yield.load(std::memory_order_relaxed);
      // Peeking after small frames, bytes that are there already are taken at once, without
      // an operation of Asio's: one that completes at once is queued behind the reactor's next
      // poll, an epoll_wait that would come between the frame and the collective it completes.
      // This is the rule after the step aside before each peeking read (serve_incoming), when
      // the peer's next frame arrived meanwhile; that step aside also keeps a connection that
      // always has bytes from holding the context. After a large frame the queued operation
      // is the better order: the handlers that run first include this worker's own sends of the
      // collective. Anything else (no bytes yet, the end, an error; not peeking) goes through
      // Asio.
      std::size_t got = 0;
      const ssize_t now = peek && in.small_frames ? ::recv(in.sock.native_handle(), in.buf.data(),
                                                           in.buf.size(), MSG_DONTWAIT | MSG_PEEK)
                                                  : -1;
      if (now > 0) {
        got = static_cast<std::size_t>(now);
      } else {
        auto [ec, waited] = co_await in.sock.async_receive(
            asio::buffer(in.buf), peek ? asio::socket_base::message_peek : 0, kTuple);
        if (ec) co_return to_std(ec);
        got = waited;
      }
      if (peek) in.peeked = got;
      in.begin = 0;
      in.end = got;
      const std::size_t take = std::min(n, got);
      if (absorb) in.mac->update(in.buf.data(), take);
      if (dst) {
        std::memcpy(dst, in.buf.data(), take);
        dst += take;
      }
      in.begin = take;
      n -= take;
    }
    if (in.peer >= 0) peers_[static_cast<std::size_t>(in.peer)].last_rx = coarse_now();
  }
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::read_payload(Incoming& in, PayloadSource& src, std::byte* dst,
                                              std::size_t n, std::string& why) {
  KF_DCHECK_IO(driver_);
  if (!src.remote) co_return co_await read_exact(in, dst, n);
  if (src.mapped) {
    for (std::size_t done = 0; done < n;) {
      const std::size_t len = std::min(n - done, Incoming::kReduceChunk);
      const std::byte* piece = nullptr;
      co_await read_piece(in, src, len, piece, why);  // in place: never fails
      std::memcpy(dst + done, piece, len);
      done += len;
    }
    co_return std::error_code{};
  }
  // From the sender's memory, in cache-sized pieces. The copy never waits, so before each piece
  // this coroutine steps aside for everything else that is ready: above all the sends this
  // worker's plan has queued meanwhile. Otherwise a peer waiting for this worker's next frame
  // would wait for the whole copy (the steps of a ring would run one worker after the other).
  for (std::size_t done = 0; done < n;) {
    const std::size_t len = std::min(n - done, Incoming::kReduceChunk);
    co_await asio::post(ex(), asio::use_awaitable);
    if (auto ec = copy_from_process(in.pid, src.remote_addr + src.at, dst + done, len)) {
      if (ec == std::errc::bad_address) {
        why = "single-copy frame names memory its sender does not have";
        co_return make_error_code(errc::protocol_error);
      }
      co_return ec;
    }
    src.at += len;
    done += len;
    peers_[static_cast<std::size_t>(in.peer)].last_rx = coarse_now();
  }
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::read_piece(Incoming& in, PayloadSource& src, std::size_t n,
                                            const std::byte*& piece, std::string& why) {
  KF_DCHECK_IO(driver_);
  if (!src.mapped) {
    if (in.chunk.empty()) in.chunk.resize(Incoming::kReduceChunk);
    piece = in.chunk.data();
    co_return co_await read_payload(in, src, in.chunk.data(), n, why);
  }
  // In place, from the sender's shared region; stepping aside first, as for a copied piece.
  co_await asio::post(ex(), asio::use_awaitable);
  piece = src.mapped + src.at;
  src.at += n;
  Counters::add(counters_.shared_read_bytes, n);
  peers_[static_cast<std::size_t>(in.peer)].last_rx = coarse_now();
  co_return std::error_code{};
}

}  // namespace kf::detail
