// SPDX-License-Identifier: Apache-2.0
// The accepting side of the mesh: the listeners, the handshake that proves the job token, and
// the reader of each incoming connection, which hands every frame to its handler.
#include <algorithm>
#include <optional>
#include <type_traits>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/auth.hpp"
#include "transport/single_copy.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using namespace boost::asio::experimental::awaitable_operators;
using transport::FrameHeader;
using transport::FrameType;

template <typename Acceptor>
awaitable<void> Mesh::accept_loop(Acceptor& acceptor) {
  constexpr bool kTcp = std::is_same_v<Acceptor, tcp::acceptor>;
  std::chrono::milliseconds pause{0};
  while (!stopping_) {
    auto [ec, sock] = co_await acceptor.async_accept(kTuple);
    if (ec) {
      if (stopping_ || ec == asio::error::operation_aborted) co_return;
      // Out of descriptors (or memory): the connection stays queued, and accepting again at
      // once would fail again at once, round and round. Pause, longer each time in a row.
      Counters::add(counters_.accept_failures, 1);
      pause = std::clamp(pause * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
      log_rejected(fmt::format("{}: accepting a connection failed: {}; trying again in {} ms",
                               identity_, ec.message(), pause.count()));
      asio::steady_timer t(ex(), pause);
      co_await t.async_wait(kTuple);
      continue;
    }
    pause = std::chrono::milliseconds(0);
    set_socket_options(sock, opts_.socket_buffer_bytes);
    boost::system::error_code rec;
    const auto remote = sock.remote_endpoint(rec);
    std::string from = describe(remote);
    const auto [pid, same_user] = peer_process(sock);
    // What the connection counts under while in its handshake: its address, or (same-host
    // socket) another user; processes of this worker's own user are trusted already.
    std::string source;
    if constexpr (kTcp) {
      source = rec ? std::string("an unknown address") : remote.address().to_string();
    } else if (!same_user) {
      // Frames on same-host connections carry no MACs: only processes of this worker's own user
      // may use them. Another user's process (a relay of a member's TCP connection, say) is
      // closed before it sees a challenge; such workers talk over TCP, with MACs.
      log_rejected(
          fmt::format("{}: refused a same-host connection from another user's process "
                      "(pid {}): same-host connections are for this user's workers",
                      identity_, pid));
      boost::system::error_code ignored;
      sock.close(ignored);
      continue;
    }
    if (auto refused = handshake_room(source)) {
      Counters::add(counters_.handshakes_refused, 1);
      log_rejected(fmt::format("{}: refused connection from {}: {}", identity_, from, *refused));
      boost::system::error_code ignored;
      sock.close(ignored);
      continue;
    }
    ++pending_handshakes_;
    if (!source.empty()) ++pending_by_source_[source];
    auto in = std::make_shared<Incoming>(Stream(std::move(sock)));
    in->pid = pid;
    in->single_copy = same_user;
    in->peek = kTcp;
    in->tcp = kTcp;
    in->source = std::move(source);
    asio::co_spawn(ex(), serve_incoming(in, std::move(from)), asio::detached);
  }
}

std::optional<std::string> Mesh::handshake_room(const std::string& source) const {
  if (pending_handshakes_ >= opts_.max_pending_handshakes) {
    return fmt::format("{} connections are in their handshake already (the limit)",
                       pending_handshakes_);
  }
  if (source.empty()) return std::nullopt;
  const auto it = pending_by_source_.find(source);
  if (it != pending_by_source_.end() && it->second >= opts_.max_pending_handshakes_per_source) {
    return fmt::format("{} of its connections are in their handshake already (the limit)",
                       it->second);
  }
  return std::nullopt;
}

void Mesh::end_handshake(Incoming& in) {
  --pending_handshakes_;
  if (in.source.empty()) return;
  const auto it = pending_by_source_.find(in.source);
  if (it != pending_by_source_.end() && --it->second == 0) pending_by_source_.erase(it);
  in.source.clear();
}

void Mesh::log_rejected(const std::string& line) {
  std::uint64_t left_out = 0;
  if (!reject_log_.allow(left_out)) {
    KF_LOG(debug, "transport", "{}", line);
  } else if (left_out > 0) {
    KF_LOG(warn, "transport", "{} ({} more such lines were left out)", line, left_out);
  } else {
    KF_LOG(warn, "transport", "{}", line);
  }
}

template awaitable<void> Mesh::accept_loop(tcp::acceptor&);
template awaitable<void> Mesh::accept_loop(local_stream::acceptor&);

awaitable<std::error_code> Mesh::accept_handshake(Incoming& in, std::string& why) {
  const transport::Nonce nonce = transport::random_nonce();
  std::vector<std::byte> ch(nonce.begin(), nonce.end());
  if (auto ec = co_await write_control(in.sock, FrameType::challenge, ch)) co_return ec;
  std::vector<std::byte> payload;
  if (auto ec = co_await read_control(*this, in, FrameType::hello, payload, why)) co_return ec;
  auto hello = transport::decode_hello(payload);
  if (!hello) {
    why = "malformed hello";
    co_return make_error_code(errc::protocol_error);
  }
  if (hello->job_id != opts_.job_id) {
    why = "hello for job '" + printable(hello->job_id) + "', this is job '" + opts_.job_id + "'";
    co_return make_error_code(errc::auth_failed);
  }
  if (hello->frame_auth != opts_.frame_auth) {
    why = "hello from '" + printable(hello->identity) + "' has frame MACs " +
          (hello->frame_auth ? "on" : "off") + " and this worker " +
          (opts_.frame_auth ? "on" : "off") + " (KF_FRAME_AUTH must be the same on every worker)";
    co_return make_error_code(errc::auth_failed);
  }
  const auto want = transport::hello_mac(peer_key_, hello->frame_auth, in.tcp, hello->job_id,
                                         hello->identity, identity_, nonce);
  if (!transport::mac_equal(want, hello->mac)) {
    why = "hello from '" + printable(hello->identity) +
          "' does not prove the job token, or was meant for another worker or another kind of "
          "connection";
    co_return make_error_code(errc::auth_failed);
  }
  Endpoint ep;
  try {
    ep = Endpoint::parse(hello->identity);
  } catch (const std::exception& e) {
    why = printable(e.what());
    co_return make_error_code(errc::protocol_error);
  }
  transport::Welcome w{identity_,
                       transport::welcome_mac(peer_key_, opts_.frame_auth, in.tcp, opts_.job_id,
                                              identity_, hello->nonce),
                       opts_.frame_auth};
  if (auto ec = co_await write_control(in.sock, FrameType::welcome, transport::encode(w))) {
    co_return ec;
  }
  in.peer = peer_index(ep);
  if (opts_.frame_auth && in.tcp) {
    in.mac = std::make_unique<transport::FrameMac>(
        transport::connection_key(peer_key_, nonce, hello->nonce, hello->identity, identity_),
        opts_.frame_auth_openssl ? transport::FrameMac::Kind::openssl
                                 : transport::FrameMac::Kind::best);
  }
  co_return std::error_code{};
}

awaitable<bool> Mesh::admit(Incoming& in, const std::string& from) {
  std::string why;
  // The handshake, raced against its deadline so a silent client cannot hold a socket.
  const auto limit = std::min(opts_.connect_timeout, opts_.handshake_timeout);
  asio::steady_timer deadline(ex(), limit);
  auto outcome = co_await (accept_handshake(in, why) || deadline.async_wait(kTuple));
  end_handshake(in);
  std::error_code hec =
      outcome.index() == 0 ? std::get<0>(outcome) : make_error_code(errc::timeout);
  if (outcome.index() == 1) {
    why = fmt::format("handshake not completed in time ({} ms)", limit.count());
  }
  if (!hec) {
    // Authenticated: now the connection gets its full read-ahead buffer (what is in the small
    // one stays where it is).
    in.buf.resize(Incoming::kBufBytes);
    co_return true;
  }
  if (why.empty() && hec == std::errc::connection_reset) {
    // Closed before it said anything: a dialer that found the same-host socket after all
    // (Mesh::connect), or a port probe. Nothing was rejected.
    KF_LOG(debug, "transport", "{}: connection from {} closed before its hello", identity_, from);
  } else {
    log_rejected(fmt::format("{}: rejected connection from {}: {} ({})", identity_, from,
                             why.empty() ? hec.message() : why, hec.message()));
  }
  boost::system::error_code ignored;
  in.sock.close(ignored);
  co_return false;
}

// The reader of one incoming connection: after the handshake, frame after frame, each handed to
// the handler of its type. A frame that fails validation ends the connection (and the peer
// counts as lost); a goodbye ends it quietly.
awaitable<void> Mesh::serve_incoming(std::shared_ptr<Incoming> in, std::string from) {
  KF_DCHECK_IO(driver_);
  if (!co_await admit(*in, from)) co_return;
  const int peer = in->peer;
  peers_[static_cast<std::size_t>(peer)].in.push_back(in);
  peers_[static_cast<std::size_t>(peer)].last_rx = coarse_now();
  peers_[static_cast<std::size_t>(peer)].died = false;
  KF_LOG(debug, "transport", "{}: accepted {}", identity_, peers_[peer].key);

  std::string why;
  std::string name;
  bool said_bye = false;
  std::error_code ec;
  for (;;) {
    if (in->peeked > 0 && in->begin == in->end) {
      // Everything peeked was delivered: step aside before the drop (and its ACK), so that
      // whoever runs the context sees what those frames completed first.
      co_await asio::post(ex(), asio::use_awaitable);
    }
    transport::HeaderBytes hb;
    if (in->mac) in->mac->begin();
    // A header already in the read-ahead buffer (the second and later frames of a read) is
    // taken without the coroutine call.
    if (!take_buffered(*in, hb.data(), hb.size()) &&
        (ec = co_await read_exact(*in, hb.data(), hb.size()))) {
      break;
    }
    FrameHeader h;
    if (!transport::decode(hb, opts_.max_frame_bytes, h, why)) {
      ec = make_error_code(errc::protocol_error);
      break;
    }
    if (io_cluster_.version > 0 && h.cluster_version > io_cluster_.version &&
        h.cluster_version - io_cluster_.version > transport::kMaxVersionLead) {
      // No member runs that far ahead: taken in, it would make every receive from this peer
      // look stale (note_version) until the end of the job.
      why = fmt::format("frame of cluster version {}, more than {} ahead of this worker's {}",
                        h.cluster_version, transport::kMaxVersionLead, io_cluster_.version);
      ec = make_error_code(errc::protocol_error);
      break;
    }
    // Ring records written before this frame come first.
    if (in->ring) drain_ring(*in);
    if (!in->closed_why.empty()) {
      why = in->closed_why;
      ec = make_error_code(errc::protocol_error);
      break;
    }
    switch (h.type) {
      case FrameType::data:
        in->small_frames = (h.flags & transport::kFlagRemote) == 0 &&
                           in->end - in->begin >= h.name_bytes + h.payload_bytes +
                                                      (in->mac ? transport::kTagBytes : 0);
        if (in->small_frames) {
          ec = on_data_read_ahead(*in, h, why);
        } else {
          ec = co_await on_data(*in, h, name, why);
        }
        break;
      case FrameType::heartbeat:
        ec = co_await skip_payload(*in, h);
        if (!ec) ec = co_await check_tag(*in, why);
        break;
      case FrameType::notice_lost: ec = co_await on_notice_lost(*in, h); break;
      case FrameType::invite: ec = co_await on_invite(*in, h); break;
      case FrameType::bye:
        if ((ec = co_await check_tag(*in, why))) break;
        said_bye = true;
        mark_departed(peer);
        break;
      case FrameType::ring_offer: ec = co_await on_ring_offer(in, h, why); break;
      default:
        why = "unexpected frame type " + std::to_string(static_cast<int>(h.type));
        ec = make_error_code(errc::protocol_error);
        break;
    }
    // Every handler checks the tag before it acts; one it did not reach is checked here (not a
    // coroutine call when there is nothing left to check: no MACs, or checked already).
    if (!ec && !said_bye && in->mac && in->mac->active()) ec = co_await check_tag(*in, why);
    if (ec || said_bye) break;
    // The peer's version is taken from a frame only once its tag is checked: a forged header
    // would otherwise make every receive from this peer look stale for as many versions as it
    // claimed (the connection is closed on a bad tag, and the version never noted).
    note_version(peer, h.cluster_version);
    // Not counted: heartbeats, and a ring's offer (the ring's count starts after it).
    if (h.type != FrameType::heartbeat && h.type != FrameType::ring_offer) ++in->socket_frames;
  }
  close_incoming(in, said_bye, ec, why);
}

void Mesh::close_incoming(const std::shared_ptr<Incoming>& in, bool said_bye, std::error_code ec,
                          std::string why) {
  KF_DCHECK_IO(driver_);
  const int peer = in->peer;
  if (!in->closed_why.empty()) {
    why = in->closed_why;
    ec = make_error_code(errc::protocol_error);
  }
  std::erase(ring_readers_, in);
  driver_.reads_rings = !ring_readers_.empty();
  // Said before the socket closes, so that whoever sees it closed finds the reason logged.
  if (!said_bye && !stopping_ && ec == make_error_code(errc::protocol_error)) {
    KF_LOG(warn, "transport", "{}: closed connection from {}: {}", identity_, peers_[peer].key,
           why);
  }
  boost::system::error_code ignored;
  in->sock.close(ignored);
  auto& ins = peers_[static_cast<std::size_t>(peer)].in;
  std::erase(ins, in);
  if (said_bye || stopping_) return;
  mark_lost(
      peer, make_error_code(errc::peer_lost),
      "connection from " + peers_[peer].key + " broke: " + (why.empty() ? ec.message() : why));
  // Our connection to it is most likely dead too, with nothing to read on it to tell: closed
  // now, so that nothing more is written into it (the first write to a closed peer succeeds).
  peers_[static_cast<std::size_t>(peer)].died = true;
  close_outgoing(peer);
}

awaitable<std::error_code> Mesh::check_tag(Incoming& in, std::string& why) {
  if (!in.mac || !in.mac->active()) co_return std::error_code{};
  const transport::Tag want = in.mac->finish();  // and read_exact stops taking bytes in
  transport::Tag got;
  if (auto ec = co_await read_exact(in, got.data(), got.size())) co_return ec;
  if (!transport::tag_equal(want, got)) {
    why = "frame " + std::to_string(in.mac->frames()) +
          " failed its MAC (altered, injected or replayed on the way)";
    co_return make_error_code(errc::protocol_error);
  }
  co_return std::error_code{};
}

// The whole frame is in the read-ahead buffer already (a small frame usually arrives in one
// piece): delivered from there, without the four coroutine calls of the general path (1.9k of
// the 14.6k instructions a 4-byte allreduce cost over TCP, callgrind).
std::error_code Mesh::on_data_read_ahead(Incoming& in, const FrameHeader& h, std::string& why) {
  KF_DCHECK_IO(driver_);
  const std::byte* at = in.buf.data() + in.begin;
  const MailKeyView key{in.peer, h.cluster_version, h.tag,
                        std::string_view(reinterpret_cast<const char*>(at), h.name_bytes)};
  in.begin += h.name_bytes + h.payload_bytes;
  if (in.mac) {
    // The header went through read_exact; name and payload are taken from the buffer here.
    in.mac->update(at, h.name_bytes + h.payload_bytes);
    const transport::Tag want = in.mac->finish();
    transport::Tag got;
    std::memcpy(got.data(), in.buf.data() + in.begin, got.size());
    in.begin += got.size();
    if (!transport::tag_equal(want, got)) {
      why = "frame " + std::to_string(in.mac->frames()) +
            " failed its MAC (altered, injected or replayed on the way)";
      return make_error_code(errc::protocol_error);
    }
  }
  KF_LOG(trace, "transport", "{}: frame '{}' tag {} from {} ({} bytes, read ahead)", identity_,
         key.name, h.tag, peers_[in.peer].key, h.payload_bytes);
  return store_frame(in.peer, key, {at + h.name_bytes, h.payload_bytes}, nullptr, why);
}

// A data frame read piece by piece: its name, then (single-copy) the sender's address, then
// its payload, into its receive or kept as an early frame (receive_data). A single-copy frame
// is answered: copied, or "send it inline" when this side cannot copy from the sender.
awaitable<std::error_code> Mesh::on_data(Incoming& in, const FrameHeader& h, std::string& name,
                                         std::string& why) {
  name.resize(h.name_bytes);
  if (auto ec = co_await read_exact(in, reinterpret_cast<std::byte*>(name.data()), name.size())) {
    co_return ec;
  }
  PayloadSource src;
  if ((h.flags & transport::kFlagRemote) != 0) {
    if (auto ec = co_await take_remote_address(in, h, src, why)) co_return ec;
    if (!src.remote) {
      if (auto ec = co_await write_reply(in.sock, transport::RemoteReply::send_inline)) {
        co_return ec;
      }
    }
  }
  if (auto ec = co_await receive_data(in, in.peer, h, name, src, why)) co_return ec;
  if (src.remote) co_return co_await write_reply(in.sock, transport::RemoteReply::copied);
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::take_remote_address(Incoming& in, const FrameHeader& h,
                                                     PayloadSource& src, std::string& why) {
  if (in.pid <= 0) {
    why = "single-copy frame over a connection from another host";
    co_return make_error_code(errc::protocol_error);
  }
  const bool shared = (h.flags & transport::kFlagShared) != 0;
  std::array<std::byte, transport::kRemoteAddressBytes + transport::kSharedRefBytes> a;
  const std::size_t a_bytes =
      transport::kRemoteAddressBytes + (shared ? transport::kSharedRefBytes : 0);
  if (auto ec = co_await read_exact(in, a.data(), a_bytes)) co_return ec;
  auto get = [&](std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(a[at + i]) << (8 * i);
    return v;
  };
  src.remote_addr = get(0, 8);
  src.remote = in.single_copy;
  if (!src.remote || h.payload_bytes == 0) co_return std::error_code{};
  if (shared && get(12, 4) != 0) {
    why = "single-copy frame's shared-region reference has non-zero reserved bytes";
    co_return make_error_code(errc::protocol_error);
  }
  if (shared && in.map_shared) {
    if (!in.maps) in.maps = std::make_unique<transport::SharedMappings>(in.pid);
    const std::error_code mec = in.maps->view(static_cast<int>(get(8, 4)), get(16, 8), get(24, 8),
                                              h.payload_bytes, src.mapped, why);
    if (!mec) co_return std::error_code{};
    if (mec == make_error_code(errc::protocol_error) || mec == std::errc::no_such_process) {
      co_return mec;
    }
    // Not allowed here, or no room to map it: copied out as any single-copy frame, from now on.
    KF_LOG(info, "transport",
           "{}: cannot map {}'s shared memory ({}); its payloads are copied out instead", identity_,
           peers_[in.peer].key, mec.message());
    in.map_shared = false;
  }
  // One byte first: a refusal (another user, Yama's ptrace rules) is then known before
  // anything is delivered, and the sender writes the payload into the socket instead.
  std::byte probe;
  const std::error_code pec = copy_from_process(in.pid, src.remote_addr, &probe, 1);
  if (pec && copy_refused(pec)) {
    KF_LOG(info, "transport",
           "{}: cannot copy from {}'s memory ({}); its payloads come "
           "through the socket",
           identity_, peers_[in.peer].key, pec.message());
    in.single_copy = false;
    src.remote = false;
  } else if (pec == std::errc::bad_address) {
    why = "single-copy frame names memory its sender does not have";
    co_return make_error_code(errc::protocol_error);
  } else if (pec) {
    co_return pec;
  }
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::skip_payload(Incoming& in, const FrameHeader& h) {
  std::vector<std::byte> payload(h.payload_bytes);
  co_return co_await read_exact(in, payload.data(), payload.size());
}

awaitable<std::error_code> Mesh::on_notice_lost(Incoming& in, const FrameHeader& h) {
  std::string who(h.payload_bytes, '\0');
  if (auto ec = co_await read_exact(in, reinterpret_cast<std::byte*>(who.data()), who.size())) {
    co_return ec;
  }
  std::string why;
  if (auto ec = co_await check_tag(in, why)) {
    in.closed_why = why;
    co_return ec;
  }
  if (h.cluster_version != io_cluster_.version) co_return std::error_code{};
  auto pit = peer_by_key_.find(who);
  if (pit != peer_by_key_.end() && who != identity_) {
    mark_lost(pit->second, make_error_code(errc::peer_lost),
              "reported lost by " + peers_[in.peer].key);
  }
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::on_invite(Incoming& in, const FrameHeader& h) {
  std::string payload(h.payload_bytes, '\0');
  if (auto ec =
          co_await read_exact(in, reinterpret_cast<std::byte*>(payload.data()), payload.size())) {
    co_return ec;
  }
  std::string why;
  if (auto ec = co_await check_tag(in, why)) {
    in.closed_why = why;
    co_return ec;
  }
  KF_LOG(debug, "transport", "{}: invitation from {} (v{}, {} bytes)", identity_,
         peers_[in.peer].key, h.cluster_version, payload.size());
  {
    std::lock_guard<std::mutex> lk(invite_mu_);
    // Invitations wait until the program takes them: bounded, so that a sender cannot fill this
    // worker's memory with ones it never takes. Past the bound the newest are dropped (a hot
    // spare's copy then arrives torn and is dropped whole; the next one comes).
    if (invitations_.size() >= opts_.max_invitations ||
        invitation_bytes_ + payload.size() > opts_.max_invitation_bytes) {
      log_rejected(fmt::format(
          "{}: dropped an invitation from {} ({} bytes): {} invitations of {} "
          "bytes are waiting to be taken (the limit)",
          identity_, peers_[in.peer].key, payload.size(), invitations_.size(), invitation_bytes_));
      co_return std::error_code{};
    }
    invitation_bytes_ += payload.size();
    invitations_.push_back(Invitation{peers_[in.peer].ep, h.cluster_version, std::move(payload)});
  }
  invite_cv_.notify_all();
  co_return std::error_code{};
}

awaitable<std::error_code> Mesh::on_ring_offer(const std::shared_ptr<Incoming>& in,
                                               const FrameHeader& h, std::string& why) {
  std::vector<std::byte> name(h.payload_bytes);
  if (auto ec = co_await read_exact(*in, name.data(), name.size())) co_return ec;
  co_return co_await accept_ring(in, name, why);
}

}  // namespace kf::detail
