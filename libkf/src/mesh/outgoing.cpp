// SPDX-License-Identifier: Apache-2.0
// The dialling side of the mesh: connecting (the same-host socket first, then TCP), the
// handshake, the writer of each outgoing connection, and posting frames to it.
#include <sys/socket.h>
#include <unistd.h>

#include <tuple>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/auth.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using namespace boost::asio::experimental::awaitable_operators;
using transport::FrameHeader;
using transport::FrameType;

bool Mesh::same_host(const Endpoint& ep) const {
  return opts_.transport != Transport::tcp && local_acceptor_.is_open() && on_this_host(ep);
}

bool Mesh::on_this_host(const Endpoint& ep) const {
  if (ep.host == self_.host) return true;
  boost::system::error_code e1, e2;
  const auto a = asio::ip::make_address(ep.host, e1);
  const auto b = asio::ip::make_address(self_.host, e2);
  return !e1 && !e2 && a.is_loopback() && b.is_loopback();
}

awaitable<boost::system::error_code> Mesh::connect(Outgoing& out, const Endpoint& ep) {
  out.local = false;
  out.single_copy = false;
  out.ring.reset();
  out.mac.reset();
  const bool try_local = same_host(ep) && !peers_[static_cast<std::size_t>(out.peer)].no_local;
  // The peer's same-host socket, into `out` when it answers.
  auto connect_local = [&]() -> awaitable<boost::system::error_code> {
    local_stream::socket s(ex());
    auto [ec] = co_await s.async_connect(local_stream::endpoint(local_socket_name(ep)), kTuple);
    if (!ec) {
      // Only a listener of this user is trusted with the name: a process of another user that
      // took it first (the abstract namespace has no permissions) gets nothing, not even a
      // handshake to relay.
      ucred cred{};
      socklen_t len = sizeof cred;
      const bool known = ::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
      if (!known || cred.uid != ::geteuid()) {
        KF_LOG(warn, "transport",
               "{}: the same-host socket of {} is held by {} (pid {}), not by this user; "
               "using TCP",
               identity_, ep.str(), known ? "uid " + std::to_string(cred.uid) : "an unknown user",
               known ? cred.pid : 0);
        peers_[static_cast<std::size_t>(out.peer)].no_local = true;
        co_return boost::asio::error::access_denied;
      }
    }
    if (!ec) {
      set_socket_options(s, opts_.socket_buffer_bytes);
      out.sock = Stream(std::move(s));
      out.local = true;
      out.single_copy = opts_.transport == Transport::automatic;
    }
    co_return ec;
  };
  if (try_local) {
    const auto ec = co_await connect_local();
    if (!ec) co_return ec;
    // Not listening on a same-host socket (yet, or at all: KF_TRANSPORT=tcp there): TCP.
    KF_LOG(debug, "transport", "{}: no same-host socket for {} ({}), trying TCP", identity_,
           ep.str(), ec.message());
  }
  tcp::socket s(ex());
  boost::system::error_code ec;
  // An address (what the cluster document holds) is connected to as it is: asio looks a name up
  // on a thread of its own, a hop each dial would otherwise wait for.
  boost::system::error_code not_an_address;
  const auto address = asio::ip::make_address(ep.host, not_an_address);
  if (!not_an_address) {
    std::tie(ec) = co_await s.async_connect(tcp::endpoint(address, ep.port), kTuple);
  } else {
    tcp::resolver resolver(ex());
    auto [rec, results] = co_await resolver.async_resolve(ep.host, std::to_string(ep.port), kTuple);
    if (rec) co_return rec;
    std::tie(ec, std::ignore) = co_await asio::async_connect(s, results, kTuple);
  }
  if (ec) co_return ec;
  // A peer that started between the two attempts (connecting takes a while) listens on its
  // same-host socket by now, if at all: it opens that before its TCP port (PeerImpl's
  // constructor). Without this second look, the connection would stay on TCP for good.
  if (try_local && !peers_[static_cast<std::size_t>(out.peer)].no_local &&
      !co_await connect_local()) {
    co_return boost::system::error_code{};
  }
  set_socket_options(s, opts_.socket_buffer_bytes);
  out.sock = Stream(std::move(s));
  co_return ec;
}

awaitable<std::error_code> Mesh::dial(Outgoing& out) {
  KF_DCHECK_IO(driver_);
  const Endpoint ep = peers_[static_cast<std::size_t>(out.peer)].ep;
  const auto give_up = Clock::now() + opts_.connect_timeout;
  std::chrono::milliseconds backoff{2};
  for (;;) {
    const boost::system::error_code cec = co_await connect(out, ep);
    if (!cec) break;
    if (stopping_ || out.closed) co_return make_error_code(errc::cancelled);
    if (cec == boost::asio::error::connection_refused &&
        peers_[static_cast<std::size_t>(out.peer)].died) {
      // Its connection to us broke and nothing listens at its address now: gone, not late.
      KF_LOG(info, "transport", "{}: {} refuses connections after its connection broke: gone",
             identity_, ep.str());
      co_return make_error_code(errc::peer_lost);
    }
    if (Clock::now() + backoff >= give_up) {
      KF_LOG(warn, "transport", "{}: cannot connect to {}: {}", identity_, ep.str(), cec.message());
      co_return make_error_code(errc::peer_lost);
    }
    // The peer may not be listening yet (workers start at slightly different times): retry
    // with exponential backoff until the connect deadline.
    asio::steady_timer t(ex(), backoff);
    co_await t.async_wait(kTuple);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  // Dialer side of the handshake.
  Incoming reader(std::move(out.sock));
  std::string why;
  auto handshake = [&]() -> awaitable<std::error_code> {
    std::vector<std::byte> payload;
    if (auto ec = co_await read_control(*this, reader, FrameType::challenge, payload, why)) {
      co_return ec;
    }
    if (payload.size() != sizeof(transport::Nonce)) {
      why = "malformed challenge";
      co_return make_error_code(errc::protocol_error);
    }
    transport::Nonce their;
    std::memcpy(their.data(), payload.data(), their.size());
    transport::Hello hello{
        opts_.job_id, identity_, transport::random_nonce(), {}, opts_.frame_auth};
    hello.mac = transport::hello_mac(peer_key_, opts_.frame_auth, !out.local, opts_.job_id,
                                     identity_, ep.str(), their);
    if (auto ec = co_await write_control(reader.sock, FrameType::hello, transport::encode(hello))) {
      co_return ec;
    }
    if (auto ec = co_await read_control(*this, reader, FrameType::welcome, payload, why)) {
      co_return ec;
    }
    auto w = transport::decode_welcome(payload);
    if (!w) {
      why = "malformed welcome";
      co_return make_error_code(errc::protocol_error);
    }
    if (w->frame_auth != opts_.frame_auth) {
      why = "peer " + ep.str() + " has frame MACs " + (w->frame_auth ? "on" : "off") +
            " and this worker " + (opts_.frame_auth ? "on" : "off") +
            " (KF_FRAME_AUTH must be the same on every worker)";
      co_return make_error_code(errc::auth_failed);
    }
    const auto want = transport::welcome_mac(peer_key_, w->frame_auth, !out.local, opts_.job_id,
                                             w->identity, hello.nonce);
    if (!transport::mac_equal(want, w->mac)) {
      why = "peer " + ep.str() + " does not prove the job token";
      co_return make_error_code(errc::auth_failed);
    }
    if (w->identity != ep.str()) {
      // Another worker of the job answered (the dial was redirected on the way).
      why = "the worker that answered at " + ep.str() + " is " + printable(w->identity) +
            ", not the one dialled";
      co_return make_error_code(errc::auth_failed);
    }
    if (opts_.frame_auth && !out.local) {
      out.mac = std::make_unique<transport::FrameMac>(
          transport::connection_key(peer_key_, their, hello.nonce, identity_, w->identity),
          opts_.frame_auth_openssl ? transport::FrameMac::Kind::openssl
                                   : transport::FrameMac::Kind::best);
    }
    if (out.local && opts_.transport == Transport::automatic && opts_.shm_frame_bytes > 0) {
      co_return co_await offer_ring(out, reader, why);
    }
    co_return std::error_code{};
  };
  asio::steady_timer deadline(ex(), opts_.connect_timeout);
  auto outcome = co_await (handshake() || deadline.async_wait(kTuple));
  std::error_code ec = outcome.index() == 0 ? std::get<0>(outcome) : make_error_code(errc::timeout);
  out.sock = std::move(reader.sock);
  if (ec && out.local && !stopping_ && !out.closed) {
    // Whoever answers on the peer's same-host socket name is not the peer (another process
    // took the name first): TCP still reaches the peer itself.
    KF_LOG(warn, "transport",
           "{}: handshake over the same-host socket of {} failed ({}); "
           "using TCP",
           identity_, ep.str(), why.empty() ? ec.message() : why);
    peers_[static_cast<std::size_t>(out.peer)].no_local = true;
    boost::system::error_code ignored;
    out.sock.close(ignored);
    co_return co_await dial(out);
  }
  if (ec) {
    KF_LOG(warn, "transport", "{}: handshake with {} failed: {}", identity_, ep.str(),
           why.empty() ? ec.message() : why);
    co_return make_error_code(errc::peer_lost);
  }
  co_return std::error_code{};
}

awaitable<void> Mesh::run_outgoing(std::shared_ptr<Outgoing> out) {
  KF_DCHECK_IO(driver_);
  std::error_code ec = co_await dial(*out);
  out->connected = !ec;
  // Non-blocking for post_send's own writes (write_now, which it skips should this fail);
  // Asio's asynchronous operations do not depend on this mode.
  boost::system::error_code nbec;
  if (!ec) out->sock.non_blocking(true, nbec);
  while (!ec) {
    while (out->queue.empty() && !out->closed) {
      // Idle: wake up after one heartbeat interval unless a send arrives first.
      const bool beat = opts_.heartbeat_interval.count() > 0;
      out->signal.expires_at(beat ? Clock::now() + opts_.heartbeat_interval
                                  : Clock::time_point::max());
      auto [wec] = co_await out->signal.async_wait(kTuple);
      if (!wec && beat && out->queue.empty() && !out->closed) {
        SendReq hb(ex());
        FrameHeader h;
        h.type = FrameType::heartbeat;
        h.cluster_version = io_cluster_.version;
        hb.header = transport::encode(h);
        ec = co_await write_frame(*out, hb);
        if (ec) break;
      }
    }
    if (ec) break;
    if (out->queue.empty()) break;  // closed with nothing left to send
    auto req = out->queue.front();
    if (req->cancelled) {
      out->queue.pop_front();
      continue;
    }
    req->in_progress = true;
    ec = co_await write_frame(*out, *req);
    req->in_progress = false;
    out->queue.pop_front();
    req->ev.set(ec ? make_error_code(errc::peer_lost) : std::error_code{});
    if (transport::FrameType(static_cast<std::uint8_t>(req->header[6])) == FrameType::bye) break;
  }
  out->closed = true;
  for (auto& r : out->queue) r->ev.set(make_error_code(errc::peer_lost));
  out->queue.clear();
  boost::system::error_code ignored;
  out->sock.close(ignored);
  auto& ps = peers_[static_cast<std::size_t>(out->peer)];
  if (ps.out == out) ps.out.reset();
  if (ec && !stopping_) {
    mark_lost(out->peer, make_error_code(errc::peer_lost),
              "connection to " + ps.key + " broke: " + ec.message());
  }
}

std::shared_ptr<SendReq> Mesh::send_frame(int peer, const FrameHeader& h, std::string_view name,
                                          const std::byte* data, bool copy_if_queued) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  auto refused = [&](std::error_code ec) {
    auto req = std::make_shared<SendReq>(ex());
    req->ev.set(ec);
    return req;
  };
  if (ps.lost || ps.departed) return refused(make_error_code(errc::peer_lost));
  // A broken version takes no new data: a collective that reaches its next step after the
  // failure must not wait for peers that have given the version up.
  if (broken_ && h.type == FrameType::data && h.cluster_version == io_cluster_.version) {
    return refused(broken_);
  }
  if (!ps.out) {
    ps.out = std::make_shared<Outgoing>(ex(), peer);
    asio::co_spawn(ex(), run_outgoing(ps.out), asio::detached);
    ++driver_.handlers_posted;
  }
  // The shared-memory ring, while the receiver polls and nothing queued for the socket has to
  // go first. The send is complete here (its payload is in the ring already): it needs no
  // request of its own, and gets the shared completed one.
  Outgoing& out = *ps.out;
  if (out.ring && h.type == FrameType::data && out.queue.empty() && !out.closed &&
      h.payload_bytes <= opts_.shm_frame_bytes &&
      transport::ShmRing::fits(name.size(), h.payload_bytes) && !out.ring->reader_sleeping() &&
      out.ring->try_write(out.socket_frames, h, name, data)) {
    Counters::add(counters_.shm_bytes, h.payload_bytes);
    // No sign of life (last_tx): a record in the ring says nothing of whether the peer takes
    // what it is sent, as bytes leaving a socket do.
    // It went to sleep as the record landed, perhaps without seeing it: a frame on the socket
    // (a heartbeat) wakes it, and it takes the ring's records before that frame.
    if (out.ring->reader_sleeping()) post_control(peer, FrameType::heartbeat, {});
    return nullptr;
  }
  const transport::HeaderBytes header = transport::encode(h);
  // Straight into the socket while the writer has nothing to do. A frame that went whole is
  // complete and, like a ring record, needs no request of its own (an allocation, a copy of the
  // name and an event per frame); one that does not fit goes on through the writer from where
  // this left it.
  std::size_t written = 0;
  transport::Tag tag{};
  bool tagged = false;
  if (h.type == FrameType::data && out.connected && out.sock.non_blocking() && !out.closed &&
      !out.writing && out.queue.empty() && h.payload_bytes <= kWriteNowBytes &&
      !(out.single_copy && h.payload_bytes >= opts_.single_copy_bytes)) {
    written = write_now(out, header, name, data, h.payload_bytes, tag);
    tagged = out.mac != nullptr;
    if (written == header.size() + name.size() + h.payload_bytes + (tagged ? tag.size() : 0)) {
      return nullptr;
    }
    // Nothing went: the frame is not numbered yet. Queued, it may still be cancelled, and a
    // number taken by a frame never sent would make the receiver refuse the next one's tag; the
    // writer tags it when its first byte goes.
    if (tagged && written == 0) {
      out.mac->rewind();
      tagged = false;
    }
  }
  auto req = std::make_shared<SendReq>(ex());
  if (tagged) {
    std::memcpy(req->tag.data(), tag.data(), tag.size());
    req->tag_ready = true;
  }
  req->header = header;
  req->name = std::string(name);
  req->data = data;
  req->bytes = h.payload_bytes;
  req->written = written;
  // Partly in the socket already: the rest must follow, so it cannot be cancelled any more.
  if (written > 0) req->in_progress = true;
  // The writer sends `owned` when it has one (write_frame); what write_now wrote already is the
  // same bytes.
  if (copy_if_queued && req->bytes > 0) req->owned.assign(data, data + req->bytes);
  ps.out->queue.push_back(req);
  ps.out->signal.cancel();
  ++driver_.handlers_posted;
  return req;
}

std::shared_ptr<SendReq> Mesh::post_control(int peer, FrameType t, std::vector<std::byte> payload) {
  KF_DCHECK_IO(driver_);
  FrameHeader h;
  h.type = t;
  h.cluster_version = io_cluster_.version;
  h.payload_bytes = payload.size();
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.out && ps.out->closed) {
    auto req = std::make_shared<SendReq>(ex());
    req->ev.set(make_error_code(errc::closed));
    return req;
  }
  auto req = post_send(peer, h, {}, nullptr);
  req->owned = std::move(payload);
  return req;
}

void Mesh::cancel(const std::shared_ptr<SendReq>& r, std::error_code ec) {
  KF_DCHECK_IO(driver_);
  if (r->ev.done || r->in_progress) return;
  r->cancelled = true;
  r->ev.set(ec);
}

}  // namespace kf::detail
