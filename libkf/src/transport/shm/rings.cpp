// SPDX-License-Identifier: Apache-2.0
// The shared-memory rings between workers on one host: the dialer offers a ring during the
// handshake, the acceptor maps it, and from then on small data frames go through the ring
// while the socket keeps the connection's order (each record carries the socket frame count
// it follows). Whoever runs the context polls the rings (Driver::poll_rings).
#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using transport::FrameHeader;
using transport::FrameType;

awaitable<std::error_code> Mesh::offer_ring(Outgoing& out, Incoming& reader, std::string& why) {
  KF_DCHECK_IO(driver_);
  std::error_code cec;
  auto ring = transport::ShmRing::create(cec);
  if (!ring) {
    KF_LOG(info, "transport",
           "{}: no shared-memory ring ({}); small frames to {} go through the "
           "socket",
           identity_, cec.message(), peers_[static_cast<std::size_t>(out.peer)].key);
    co_return std::error_code{};
  }
  const std::string& name = ring->name();
  const auto* p = reinterpret_cast<const std::byte*>(name.data());
  if (auto ec = co_await write_control(reader.sock, FrameType::ring_offer,
                                       std::vector<std::byte>(p, p + name.size()))) {
    co_return ec;
  }
  std::byte reply{};
  if (auto ec = co_await read_exact(reader, &reply, 1)) co_return ec;
  ring->unlink();  // mapped by the acceptor by now, or declined: the name has served
  if (reply == static_cast<std::byte>(transport::RemoteReply::copied)) {
    out.ring = std::move(ring);
    out.socket_frames = 0;
  } else if (reply != static_cast<std::byte>(transport::RemoteReply::send_inline)) {
    why = "answered the shared-memory ring offer with " + std::to_string(static_cast<int>(reply));
    co_return make_error_code(errc::protocol_error);
  }
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::accept_ring(const std::shared_ptr<Incoming>& in,
                                             const std::vector<std::byte>& payload,
                                             std::string& why) {
  KF_DCHECK_IO(driver_);
  if (in->pid <= 0) {
    why = "shared-memory ring offered over a connection from another host";
    co_return make_error_code(errc::protocol_error);
  }
  if (in->ring) {
    why = "a second shared-memory ring offered on one connection";
    co_return make_error_code(errc::protocol_error);
  }
  const std::string name(reinterpret_cast<const char*>(payload.data()), payload.size());
  std::unique_ptr<transport::ShmRing> ring;
  std::string declined = "rings are off here";
  if (opts_.transport == Transport::automatic && opts_.shm_frame_bytes > 0) {
    ring = transport::ShmRing::open(name, declined);
  }
  if (!ring) {
    KF_LOG(info, "transport", "{}: declined the shared-memory ring of {}: {}", identity_,
           peers_[static_cast<std::size_t>(in->peer)].key, declined);
    co_return co_await write_reply(in->sock, transport::RemoteReply::send_inline);
  }
  in->ring = std::move(ring);
  in->socket_frames = 0;
  ring_readers_.push_back(in);
  driver_.reads_rings = true;
  co_return co_await write_reply(in->sock, transport::RemoteReply::copied);
}

std::size_t Mesh::drain_ring(Incoming& in) {
  KF_DCHECK_IO(driver_);
  if (!in.ring || !in.closed_why.empty()) return 0;
  std::size_t taken = 0;
  transport::ShmRing::Record rec;
  std::string why;
  for (;;) {
    const auto got = in.ring->peek(rec, opts_.max_frame_bytes, why);
    if (got == transport::ShmRing::Peek::empty) break;
    if (got == transport::ShmRing::Peek::record) {
      // Written after a socket frame this side has not finished reading: that frame first.
      if (rec.socket_before > in.socket_frames) break;
      if (rec.socket_before < in.socket_frames) {
        why = "shared-memory ring record out of order with the socket";
      } else {
        note_version(in.peer, rec.header.cluster_version);
        const MailKeyView key{in.peer, rec.header.cluster_version, rec.header.tag, rec.name};
        if (!store_frame(in.peer, key, rec.payload, nullptr, why)) {
          in.ring->pop();
          ++taken;
          continue;
        }
      }
    }
    // A broken record: the connection ends, as for a malformed frame on the socket.
    in.closed_why = why.empty() ? "bad shared-memory ring record" : why;
    boost::system::error_code ignored;
    in.sock.close(ignored);
    break;
  }
  if (taken > 0) peers_[static_cast<std::size_t>(in.peer)].last_rx = coarse_now();
  return taken;
}

std::size_t Mesh::poll_rings() {
  KF_DCHECK_IO(driver_);
  std::size_t n = 0;
  for (std::size_t i = 0; i < ring_readers_.size(); ++i) n += drain_ring(*ring_readers_[i]);
  return n;
}

// Before it sleeps, the thread running the context tells every writer so (writers then use the
// socket, which wakes it), and looks once more: a record published before a writer could see
// the flag is taken now instead of waiting for the next socket event. Where a writer publishes
// without a fence, a system-wide barrier between the two makes sure of it (ShmRing::
// sleep_barrier); should the kernel refuse it, the thread does not sleep (it polls on).
bool Mesh::rings_asleep(bool asleep) {
  KF_DCHECK_IO(driver_);
  if (ring_readers_.empty()) return true;
  bool light = false;
  for (auto& in : ring_readers_) {
    in->ring->set_reader_sleeping(asleep);
    light = light || in->ring->light_publish();
  }
  if (!asleep) return true;
  bool may_sleep = !light || transport::ShmRing::sleep_barrier();
  if (!may_sleep && !barrier_refused_) {
    barrier_refused_ = true;
    KF_LOG(warn, "transport",
           "{}: the kernel refused membarrier; polling the rings instead of sleeping", identity_);
  }
  if (may_sleep && poll_rings() == 0) return true;
  for (auto& in : ring_readers_) in->ring->set_reader_sleeping(false);
  return false;
}

}  // namespace kf::detail
