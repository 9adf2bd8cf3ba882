// SPDX-License-Identifier: Apache-2.0
// Writing frames to a connection (TCP or the same-host socket): the writer coroutine's frame,
// single-copy payloads left in place for the receiver, and small frames written at once.
#include <cstring>

#include "common/shared_regions.hpp"
#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using transport::FrameHeader;
using transport::FrameType;

awaitable<std::error_code> Mesh::write_frame(Outgoing& out, SendReq& req) {
  KF_DCHECK_IO(driver_);
  const std::byte* data = req.owned.empty() ? req.data : req.owned.data();
  // peers_ may grow while this waits: index it afresh after every co_await.
  auto touch = [&] { peers_[static_cast<std::size_t>(out.peer)].last_tx = coarse_now(); };
  if (req.header[6] != static_cast<std::byte>(FrameType::heartbeat) && req.written == 0) {
    ++out.socket_frames;
  }
  out.writing = true;
  struct Idle {
    Outgoing& o;
    ~Idle() { o.writing = false; }
  } idle{out};
  boost::system::error_code ec;
  std::size_t done = 0;  // payload bytes written
  if (out.single_copy && req.owned.empty() && req.bytes >= opts_.single_copy_bytes &&
      req.header[6] == static_cast<std::byte>(FrameType::data)) {
    // Single copy: the header and the payload's address; the receiver copies the payload out
    // of this process and answers. Until then `data` must stay as it is, which it does: the
    // request completes only after this returns.
    transport::HeaderBytes hb = req.header;
    hb[7] |= static_cast<std::byte>(transport::kFlagRemote);
    // The address, and the shared region it lies in, if any (transport::kFlagShared).
    std::array<std::byte, transport::kRemoteAddressBytes + transport::kSharedRefBytes> addr{};
    auto put = [&](std::size_t at, std::uint64_t v, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) addr[at + i] = static_cast<std::byte>(v >> (8 * i));
    };
    put(0, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data)), 8);
    std::size_t addr_bytes = transport::kRemoteAddressBytes;
    if (const auto region = find_shared_region(data, req.bytes)) {
      hb[7] |= static_cast<std::byte>(transport::kFlagShared);
      put(8, static_cast<std::uint32_t>(region->fd), 4);
      put(16, region->id, 8);
      put(24, region->offset, 8);
      addr_bytes += transport::kSharedRefBytes;
    }
    std::array<asio::const_buffer, 3> bufs{asio::buffer(hb), asio::buffer(req.name),
                                           asio::buffer(addr.data(), addr_bytes)};
    auto [wec, n] = co_await asio::async_write(out.sock, bufs, AllAtOnce{}, kTuple);
    touch();
    if (wec) co_return to_std(wec);
    std::uint8_t reply = 0;
    auto [rec, rn] = co_await asio::async_read(out.sock, asio::buffer(&reply, 1), kTuple);
    if (rec) co_return to_std(rec);
    touch();
    if (reply == static_cast<std::uint8_t>(transport::RemoteReply::copied)) {
      Counters::add(counters_.single_copy_bytes, req.bytes);
      co_return std::error_code{};
    }
    if (reply != static_cast<std::uint8_t>(transport::RemoteReply::send_inline)) {
      KF_LOG(warn, "transport", "{}: {} answered a single-copy frame with {}; closing", identity_,
             peers_[static_cast<std::size_t>(out.peer)].key, static_cast<int>(reply));
      co_return make_error_code(errc::protocol_error);
    }
    // The receiver cannot copy from this process: it waits for the payload through the
    // socket, right after the header it has.
    KF_LOG(info, "transport",
           "{}: {} cannot copy from this process; sending payloads through "
           "the socket",
           identity_, peers_[static_cast<std::size_t>(out.peer)].key);
    out.single_copy = false;
    Counters::add(counters_.single_copy_refused, 1);
  } else {
    done = std::min(req.bytes, kProgressChunk);
    // Frame MACs: the tag over header, name and payload, taken in as the payload is written,
    // goes after it (write_now computed it already for a frame it started).
    if (out.mac && !req.tag_ready) {
      out.mac->begin();
      out.mac->update(req.header.data(), req.header.size());
      out.mac->update(req.name.data(), req.name.size());
      out.mac->update(data, done);
      if (done == req.bytes) {
        const transport::Tag t = out.mac->finish();
        std::memcpy(req.tag.data(), t.data(), t.size());
        req.tag_ready = true;
      }
    }
    const bool tag_now = out.mac && done == req.bytes;
    std::array<asio::const_buffer, 4> bufs{asio::buffer(req.header), asio::buffer(req.name),
                                           asio::buffer(data, done),
                                           tag_now ? asio::buffer(req.tag) : asio::const_buffer()};
    // What write_now put into the socket already (it only takes frames of one chunk).
    for (std::size_t skip = req.written; auto& b : bufs) {
      const std::size_t k = std::min(skip, b.size());
      b += k;
      skip -= k;
    }
    auto [wec, n] = co_await asio::async_write(out.sock, bufs, AllAtOnce{}, kTuple);
    ec = wec;
    touch();
  }
  // The rest of the payload, a chunk at a time, so that a long write shows progress (last_tx).
  const bool tag_after = out.mac && !req.tag_ready;
  while (!ec && done < req.bytes) {
    const std::size_t len = std::min(req.bytes - done, kProgressChunk);
    if (tag_after) out.mac->update(data + done, len);
    auto [wec, n] =
        co_await asio::async_write(out.sock, asio::buffer(data + done, len), AllAtOnce{}, kTuple);
    ec = wec;
    done += len;
    touch();
  }
  if (!ec && tag_after) {
    const transport::Tag t = out.mac->finish();
    std::memcpy(req.tag.data(), t.data(), t.size());
    req.tag_ready = true;
    auto [wec, n] =
        co_await asio::async_write(out.sock, asio::buffer(req.tag), AllAtOnce{}, kTuple);
    ec = wec;
    touch();
  }
  if (!ec && req.header[6] == static_cast<std::byte>(FrameType::data)) {
    Counters::add(out.local ? counters_.socket_bytes : counters_.tcp_bytes, req.bytes);
  }
  co_return to_std(ec);
}

std::size_t Mesh::write_now(Outgoing& out, const transport::HeaderBytes& header,
                            std::string_view name, const std::byte* data, std::size_t bytes,
                            transport::Tag& tag) {
  KF_DCHECK_IO(driver_);
  if (out.mac) {
    out.mac->begin();
    out.mac->update(header.data(), header.size());
    out.mac->update(name.data(), name.size());
    out.mac->update(data, bytes);
    tag = out.mac->finish();
  }
  const std::array<asio::const_buffer, 4> bufs{
      asio::buffer(header), asio::buffer(name.data(), name.size()), asio::buffer(data, bytes),
      out.mac ? asio::buffer(tag) : asio::const_buffer()};
  boost::system::error_code ec;
  // The socket is in non-blocking mode (run_outgoing): would_block means nothing was written.
  const std::size_t n = out.sock.write_some(bufs, ec);
  if (n == 0) return 0;
  // Some bytes are in the socket: the frame is this connection's next, whatever happens now.
  ++out.socket_frames;
  peers_[static_cast<std::size_t>(out.peer)].last_tx = coarse_now();
  if (n == header.size() + name.size() + bytes + (out.mac ? tag.size() : 0)) {
    Counters::add(out.local ? counters_.socket_bytes : counters_.tcp_bytes, bytes);
  }
  return n;
}

}  // namespace kf::detail
