// SPDX-License-Identifier: Apache-2.0
// Where the mesh meets the mailbox: data frames read from a connection or a ring go to the
// mailbox, and the engine's receives are posted there, refused at once when the mesh knows
// they can never complete.
#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using transport::FrameHeader;
using transport::FrameType;

awaitable<std::error_code> Mesh::receive_data(Incoming& in, int peer, const FrameHeader& h,
                                              const std::string& name, PayloadSource& src,
                                              std::string& why) {
  KF_DCHECK_IO(driver_);
  const MailKeyView key{peer, h.cluster_version, h.tag, name};
  KF_LOG(trace, "transport", "{}: frame '{}' tag {} from {} ({} bytes{})", identity_, name, h.tag,
         peers_[peer].key, h.payload_bytes, src.remote ? ", single copy" : "");
  if (auto req = mailbox_.begin_fill(key)) {
    if (req->bytes != h.payload_bytes) {
      req->in_progress = false;
      why = wrong_size(name, h.payload_bytes, req->bytes);
      co_return make_error_code(errc::protocol_error);
    }
    std::error_code ec;
    if (req->reduce) {
      // Piece by piece, each reduced while in cache (or straight from the sender's shared
      // region, with no copy first).
      for (std::size_t done = 0; done < req->bytes && !ec;) {
        const std::size_t n = std::min(req->bytes - done, Incoming::kReduceChunk);
        const std::byte* piece = nullptr;
        ec = co_await read_piece(in, src, n, piece, why);
        // With frame MACs the chunks are reduced before the tag at the end is checked: a frame
        // that fails it fails the receive, and the collective with it.
        if (!ec) deliver(*req, piece, done, n);
        done += n;
      }
    } else {
      ec = co_await read_payload(in, src, req->dst, req->bytes, why);
    }
    if (!ec) ec = co_await check_tag(in, why);
    mailbox_.end_fill(key, req, ec ? make_error_code(errc::peer_lost) : std::error_code{});
    co_return ec;
  }
  if (!mailbox_.has_room(peer, h.payload_bytes, h.name_bytes, why))
    co_return make_error_code(errc::protocol_error);
  ScratchPool::Block block = mailbox_.early_block(h.payload_bytes);
  std::error_code rec = co_await read_payload(in, src, block.data.get(), h.payload_bytes, why);
  if (!rec) rec = co_await check_tag(in, why);
  if (rec) {
    mailbox_.recycle(std::move(block));
    co_return rec;
  }
  // The receive may have been posted while this payload was being read: then the block was
  // not kept, and goes back to the pool.
  const std::error_code ec =
      store_frame(peer, key, {block.data.get(), h.payload_bytes}, &block, why);
  if (block.data) mailbox_.recycle(std::move(block));
  co_return ec;
}

std::error_code Mesh::store_frame(int peer, const MailKeyView& key,
                                  std::span<const std::byte> payload, ScratchPool::Block* owned,
                                  std::string& why) {
  KF_DCHECK_IO(driver_);
  bool stale = false;
  const std::error_code ec = mailbox_.store(key, payload, owned, io_cluster_.version, stale, why);
  if (stale) {
    KF_LOG(debug, "transport", "{}: dropped '{}' of stale version {} from {}", identity_, key.name,
           key.version, peers_[static_cast<std::size_t>(peer)].key);
  }
  return ec;
}

std::shared_ptr<RecvReq> Mesh::post_recv(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                         const ReduceOnArrival* reduce) {
  KF_DCHECK_IO(driver_);
  KF_LOG(trace, "transport", "{}: post recv '{}' tag {} from {} ({} bytes)", identity_, key.name,
         key.tag, peers_[key.peer].key, bytes);
  // The frame came first (a peer a moment ahead): delivered now, with no request of its own
  // (the shared completed one).
  if (auto done = mailbox_.take_early_into(key, dst, bytes, reduce)) return done;
  // No frame came before it: the receive waits in its slot.
  return mailbox_.post(key, dst, bytes, reduce, receive_refusal(key.peer, key.version));
}

std::error_code Mesh::receive_refusal(int peer, std::uint64_t version) const {
  KF_DCHECK_IO(driver_);
  const auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.lost || ps.departed) return make_error_code(errc::peer_lost);
  if (broken_ && version == io_cluster_.version) return broken_;
  if (ps.max_version > version) return make_error_code(errc::stale_version);
  return {};
}

// An empty mailbox, the usual case, is not even searched.

}  // namespace kf::detail
