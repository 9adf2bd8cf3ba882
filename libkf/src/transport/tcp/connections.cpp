// SPDX-License-Identifier: Apache-2.0
// Connections between peers. The dialer of a connection is its only data sender and the
// acceptor its only reader, so each ordered pair of peers has one connection with one writer
// coroutine (draining a queue) and one reader coroutine. Every connection starts with the
// HMAC handshake of transport/auth.hpp; a frame that fails validation closes the connection
// with a logged reason and never takes the process down.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <type_traits>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "kf/common/log.hpp"
#include "peer_impl.hpp"
#include "transport/auth.hpp"

namespace kf::detail {

using namespace boost::asio::experimental::awaitable_operators;
using transport::FrameHeader;
using transport::FrameType;

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
// Large payloads are written (and read straight into place) this much at a time, so that a
// long transfer shows progress (PeerState::last_tx, last_rx) to the collective's deadline. It
// was 1 MiB; 4 MiB measured 20-30% faster for 4-16 MiB allreduces of 2 workers over TCP
// (kf-bench, in turn: 4 MiB 3.7-4.1 -> 2.6-3.4 ms, 16 MiB 15.8-16.1 -> 10.9-14.0 ms) and no
// slower with 4 workers or over the same-host socket. Even at 100 MB/s a chunk takes 40 ms.
constexpr std::size_t kProgressChunk = std::size_t{4} << 20;
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
// idle (PeerImpl::write_now); larger ones always go through the writer coroutine.
constexpr std::size_t kWriteNowBytes = 64 * 1024;

std::error_code to_std(const boost::system::error_code& ec) {
  if (ec == asio::error::eof) return std::make_error_code(std::errc::connection_reset);
  return ec;
}

template <typename Socket>
void set_buffer_sizes(Socket& s, std::size_t bytes) {
  const int n = static_cast<int>(std::min<std::size_t>(bytes, std::size_t{1} << 30));
  boost::system::error_code ignored;
  s.set_option(asio::socket_base::send_buffer_size(n), ignored);
  s.set_option(asio::socket_base::receive_buffer_size(n), ignored);
}

// buffer_bytes: PeerOptions::socket_buffer_bytes.
void set_socket_options(tcp::socket& s, std::size_t buffer_bytes) {
  boost::system::error_code ignored;
  s.set_option(tcp::no_delay(true), ignored);
  if (buffer_bytes > 0) set_buffer_sizes(s, buffer_bytes);
}

// Unix-domain sockets have small default buffers (about 200 KiB): with larger ones a big frame
// moves in fewer, larger copies and the writer blocks less often on the reader.
void set_socket_options(local_stream::socket& s, std::size_t buffer_bytes) {
  set_buffer_sizes(s, buffer_bytes > 0 ? buffer_bytes : std::size_t{4} << 20);
}

std::string describe(const tcp::endpoint& ep) {
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}
std::string describe(const local_stream::endpoint&) { return "a same-host socket"; }

// The dialer's process on a same-host connection (0 over TCP), and whether its payloads may be
// copied out of it: only when it runs as this process's user. Otherwise a job member running as
// another user could have this process read, with this process's rights, memory it may not read
// itself (its pid may even have been reused by then); it gets "send inline" instead.
std::pair<pid_t, bool> peer_process(tcp::socket&) { return {0, false}; }
std::pair<pid_t, bool> peer_process(local_stream::socket& s) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return {0, false};
  }
  return {cred.pid, cred.uid == ::geteuid()};
}

// Copies n bytes at `addr` in process `pid` into dst: one copy, kernel to kernel.
std::error_code copy_from_process(pid_t pid, std::uint64_t addr, std::byte* dst, std::size_t n) {
  while (n > 0) {
    iovec local{dst, n};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), n};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return {errno, std::system_category()};
    if (got == 0) return std::make_error_code(std::errc::bad_address);
    dst += got;
    addr += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return {};
}

// Errors of process_vm_readv that mean "not allowed here", as opposed to a peer that is gone
// (ESRCH) or an address that is not the peer's (EFAULT).
bool copy_refused(const std::error_code& ec) {
  return ec == std::errc::operation_not_permitted || ec == std::errc::permission_denied ||
         ec == std::errc::function_not_supported;
}

awaitable<std::error_code> write_reply(Stream& s, transport::RemoteReply r) {
  const auto b = static_cast<std::uint8_t>(r);
  auto [ec, n] = co_await asio::async_write(s, asio::buffer(&b, 1), kTuple);
  co_return to_std(ec);
}

}  // namespace

// ---- reading --------------------------------------------------------------------------------

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

awaitable<std::error_code> PeerImpl::read_exact(Incoming& in, std::byte* dst, std::size_t n) {
  const std::size_t have = std::min(n, in.end - in.begin);
  if (have > 0) {
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
      auto [ec, got] = co_await in.sock.async_read_some(
          asio::buffer(dst, std::min(n, kProgressChunk)), kTuple);
      if (ec) co_return to_std(ec);
      dst += got;
      n -= got;
    } else {
      // Not with more workers than cores: there the drop's system call and the step aside
      // before it cost more of the shared cores than the ACK's place on the path does (4
      // workers over TCP, 4 B 33.6-37.2 -> 37.0-43.5 us, 64 KiB 113-115 -> 126-130).
      const bool peek = in.peek && !driver_->yield.load(std::memory_order_relaxed);
      auto [ec, got] = co_await in.sock.async_receive(
          asio::buffer(in.buf), peek ? asio::socket_base::message_peek : 0, kTuple);
      if (ec) co_return to_std(ec);
      if (peek) in.peeked = got;
      in.begin = 0;
      in.end = got;
      const std::size_t take = std::min(n, got);
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

awaitable<std::error_code> PeerImpl::read_payload(Incoming& in, PayloadSource& src,
                                                  std::byte* dst, std::size_t n,
                                                  std::string& why) {
  if (!src.remote) co_return co_await read_exact(in, dst, n);
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

namespace {

// Reads one control frame (handshake) into `payload`.
template <typename Self>
awaitable<std::error_code> read_control(Self& self, Incoming& in, FrameType want,
                                        std::vector<std::byte>& payload, std::string& why) {
  transport::HeaderBytes hb;
  if (auto ec = co_await self.read_exact(in, hb.data(), hb.size())) co_return ec;
  FrameHeader h;
  if (!transport::decode(hb, self.opts_.max_frame_bytes, h, why)) {
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

awaitable<std::error_code> write_control(Stream& s, FrameType t,
                                         const std::vector<std::byte>& payload) {
  FrameHeader h;
  h.type = t;
  h.payload_bytes = payload.size();
  const auto hb = transport::encode(h);
  std::array<asio::const_buffer, 2> bufs{asio::buffer(hb), asio::buffer(payload)};
  auto [ec, n] = co_await asio::async_write(s, bufs, kTuple);
  co_return to_std(ec);
}

}  // namespace

template <typename Acceptor>
awaitable<void> PeerImpl::accept_loop(Acceptor& acceptor) {
  while (!stopping_) {
    auto [ec, sock] = co_await acceptor.async_accept(kTuple);
    if (ec) {
      if (stopping_ || ec == asio::error::operation_aborted) co_return;
      KF_LOG(warn, "transport", "{}: accept failed: {}", identity_, ec.message());
      continue;
    }
    set_socket_options(sock, opts_.socket_buffer_bytes);
    boost::system::error_code rec;
    std::string from = describe(sock.remote_endpoint(rec));
    const auto [pid, same_user] = peer_process(sock);
    auto in = std::make_shared<Incoming>(Stream(std::move(sock)));
    in->pid = pid;
    in->single_copy = same_user;
    in->peek = std::is_same_v<Acceptor, tcp::acceptor>;
    asio::co_spawn(ex(), serve_incoming(in, std::move(from)), asio::detached);
  }
}

template awaitable<void> PeerImpl::accept_loop(tcp::acceptor&);
template awaitable<void> PeerImpl::accept_loop(local_stream::acceptor&);

awaitable<void> PeerImpl::serve_incoming(std::shared_ptr<Incoming> in, std::string from) {
  boost::system::error_code ignored;
  std::string why;
  // Handshake, raced against the connect deadline so a silent client cannot hold a socket.
  auto handshake = [&]() -> awaitable<std::error_code> {
    const transport::Nonce nonce = transport::random_nonce();
    std::vector<std::byte> ch(nonce.begin(), nonce.end());
    if (auto ec = co_await write_control(in->sock, FrameType::challenge, ch)) co_return ec;
    std::vector<std::byte> payload;
    if (auto ec = co_await read_control(*this, *in, FrameType::hello, payload, why)) co_return ec;
    auto hello = transport::decode_hello(payload);
    if (!hello) {
      why = "malformed hello";
      co_return make_error_code(errc::protocol_error);
    }
    if (hello->job_id != opts_.job_id) {
      why = "hello for job '" + hello->job_id + "', this is job '" + opts_.job_id + "'";
      co_return make_error_code(errc::auth_failed);
    }
    const auto want = transport::handshake_mac(opts_.job_token, "hello", hello->job_id,
                                               hello->identity, nonce);
    if (!transport::mac_equal(want, hello->mac)) {
      why = "hello from '" + hello->identity + "' does not prove the job token";
      co_return make_error_code(errc::auth_failed);
    }
    Endpoint ep;
    try {
      ep = Endpoint::parse(hello->identity);
    } catch (const std::exception& e) {
      why = e.what();
      co_return make_error_code(errc::protocol_error);
    }
    transport::Welcome w{identity_, transport::handshake_mac(opts_.job_token, "welcome",
                                                             opts_.job_id, identity_,
                                                             hello->nonce)};
    if (auto ec = co_await write_control(in->sock, FrameType::welcome, transport::encode(w))) {
      co_return ec;
    }
    in->peer = peer_index(ep);
    co_return std::error_code{};
  };
  asio::steady_timer deadline(ex(), opts_.connect_timeout);
  auto outcome = co_await (handshake() || deadline.async_wait(kTuple));
  std::error_code hec = outcome.index() == 0 ? std::get<0>(outcome)
                                             : make_error_code(errc::timeout);
  if (outcome.index() == 1) why = "handshake not completed in time";
  if (hec) {
    if (why.empty() && hec == std::errc::connection_reset) {
      // Closed before it said anything: a dialer that found the same-host socket after all
      // (PeerImpl::connect), or a port probe. Nothing was rejected.
      KF_LOG(debug, "transport", "{}: connection from {} closed before its hello", identity_,
             from);
    } else {
      KF_LOG(warn, "transport", "{}: rejected connection from {}: {} ({})", identity_, from,
             why.empty() ? hec.message() : why, hec.message());
    }
    in->sock.close(ignored);
    co_return;
  }
  const int peer = in->peer;
  peers_[static_cast<std::size_t>(peer)].in.push_back(in);
  peers_[static_cast<std::size_t>(peer)].last_rx = coarse_now();
  KF_LOG(debug, "transport", "{}: accepted {}", identity_, peers_[peer].key);

  std::vector<std::byte> control;
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
    if ((ec = co_await read_exact(*in, hb.data(), hb.size()))) break;
    FrameHeader h;
    if (!transport::decode(hb, opts_.max_frame_bytes, h, why)) {
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
    note_version(peer, h.cluster_version);
    if (h.type == FrameType::data && (h.flags & transport::kFlagRemote) == 0 &&
        in->end - in->begin >= h.name_bytes + h.payload_bytes) {
      // The whole frame is in the read-ahead buffer already (a small frame usually arrives in
      // one piece): delivered from there, without the four coroutine calls of the general path
      // (1.9k of the 14.6k instructions a 4-byte allreduce cost over TCP, callgrind).
      const std::byte* at = in->buf.data() + in->begin;
      const MailKeyView key{peer, h.cluster_version, h.tag,
                            std::string_view(reinterpret_cast<const char*>(at), h.name_bytes)};
      in->begin += h.name_bytes + h.payload_bytes;
      KF_LOG(trace, "transport", "{}: frame '{}' tag {} from {} ({} bytes, read ahead)", identity_,
             key.name, h.tag, peers_[peer].key, h.payload_bytes);
      if ((ec = store_frame(peer, key, {at + h.name_bytes, h.payload_bytes}, nullptr, why))) break;
    } else if (h.type == FrameType::data) {
      name.resize(h.name_bytes);
      if ((ec = co_await read_exact(*in, reinterpret_cast<std::byte*>(name.data()), name.size()))) {
        break;
      }
      PayloadSource src;
      if ((h.flags & transport::kFlagRemote) != 0) {
        if (in->pid <= 0) {
          why = "single-copy frame over a connection from another host";
          ec = make_error_code(errc::protocol_error);
          break;
        }
        std::array<std::byte, transport::kRemoteAddressBytes> a;
        if ((ec = co_await read_exact(*in, a.data(), a.size()))) break;
        for (std::size_t i = 0; i < a.size(); ++i) {
          src.remote_addr |= static_cast<std::uint64_t>(a[i]) << (8 * i);
        }
        src.remote = in->single_copy;
        if (src.remote && h.payload_bytes > 0) {
          // One byte first: a refusal (another user, Yama's ptrace rules) is then known before
          // anything is delivered, and the sender writes the payload into the socket instead.
          std::byte probe;
          const std::error_code pec = copy_from_process(in->pid, src.remote_addr, &probe, 1);
          if (pec && copy_refused(pec)) {
            KF_LOG(info, "transport", "{}: cannot copy from {}'s memory ({}); its payloads come "
                   "through the socket", identity_, peers_[peer].key, pec.message());
            in->single_copy = false;
            src.remote = false;
          } else if (pec == std::errc::bad_address) {
            why = "single-copy frame names memory its sender does not have";
            ec = make_error_code(errc::protocol_error);
            break;
          } else if (pec) {
            ec = pec;
            break;
          }
        }
        if (!src.remote &&
            (ec = co_await write_reply(in->sock, transport::RemoteReply::send_inline))) {
          break;
        }
      }
      if ((ec = co_await receive_data(*in, peer, h, name, src, why))) break;
      if (src.remote && (ec = co_await write_reply(in->sock, transport::RemoteReply::copied))) {
        break;
      }
    } else if (h.type == FrameType::notice_lost || h.type == FrameType::heartbeat) {
      control.resize(h.payload_bytes);
      if ((ec = co_await read_exact(*in, control.data(), control.size()))) break;
      if (h.type == FrameType::notice_lost && h.cluster_version == io_cluster_.version) {
        const std::string who(reinterpret_cast<const char*>(control.data()), control.size());
        auto pit = peer_by_key_.find(who);
        if (pit != peer_by_key_.end() && who != identity_) {
          mark_lost(pit->second, make_error_code(errc::peer_lost),
                    "reported lost by " + peers_[peer].key);
        }
      }
    } else if (h.type == FrameType::invite) {
      std::string payload(h.payload_bytes, '\0');
      if ((ec = co_await read_exact(*in, reinterpret_cast<std::byte*>(payload.data()),
                                    payload.size()))) {
        break;
      }
      KF_LOG(debug, "transport", "{}: invitation from {} (v{}, {} bytes)", identity_,
             peers_[peer].key, h.cluster_version, payload.size());
      {
        std::lock_guard<std::mutex> lk(invite_mu_);
        invitations_.push_back(
            Invitation{peers_[peer].ep, h.cluster_version, std::move(payload)});
      }
      invite_cv_.notify_all();
    } else if (h.type == FrameType::bye) {
      said_bye = true;
      mark_departed(peer);
      break;
    } else if (h.type == FrameType::ring_offer) {
      control.resize(h.payload_bytes);
      if ((ec = co_await read_exact(*in, control.data(), control.size()))) break;
      if ((ec = co_await accept_ring(in, control, why))) break;
      continue;  // not counted: the ring's count starts after its offer
    } else {
      why = "unexpected frame type " + std::to_string(static_cast<int>(h.type));
      ec = make_error_code(errc::protocol_error);
      break;
    }
    if (h.type != FrameType::heartbeat) ++in->socket_frames;
  }
  if (!in->closed_why.empty()) {
    why = in->closed_why;
    ec = make_error_code(errc::protocol_error);
  }
  std::erase(ring_readers_, in);
  driver_->reads_rings = !ring_readers_.empty();
  in->sock.close(ignored);
  auto& ins = peers_[static_cast<std::size_t>(peer)].in;
  std::erase(ins, in);
  if (said_bye || stopping_) co_return;
  if (ec == make_error_code(errc::protocol_error)) {
    KF_LOG(warn, "transport", "{}: closed connection from {}: {}", identity_, peers_[peer].key, why);
  }
  mark_lost(peer, make_error_code(errc::peer_lost),
            "connection from " + peers_[peer].key + " broke: " +
                (why.empty() ? ec.message() : why));
}

awaitable<std::error_code> PeerImpl::receive_data(Incoming& in, int peer, const FrameHeader& h,
                                                  const std::string& name, PayloadSource& src,
                                                  std::string& why) {
  const MailKeyView key{peer, h.cluster_version, h.tag, name};
  KF_LOG(trace, "transport", "{}: frame '{}' tag {} from {} ({} bytes{})", identity_, name, h.tag,
         peers_[peer].key, h.payload_bytes, src.remote ? ", single copy" : "");
  auto it = mailbox_.find(key);
  if (it != mailbox_.end() && !it->second.posted.empty()) {
    auto req = it->second.posted.front();
    if (req->bytes != h.payload_bytes) {
      why = wrong_size(name, h.payload_bytes, req->bytes);
      co_return make_error_code(errc::protocol_error);
    }
    req->in_progress = true;
    std::error_code ec;
    if (req->reduce) {
      if (in.chunk.empty()) in.chunk.resize(Incoming::kReduceChunk);
      for (std::size_t done = 0; done < req->bytes && !ec;) {
        const std::size_t n = std::min(req->bytes - done, Incoming::kReduceChunk);
        ec = co_await read_payload(in, src, in.chunk.data(), n, why);
        if (!ec) deliver(*req, in.chunk.data(), done, n);
        done += n;
      }
    } else {
      ec = co_await read_payload(in, src, req->dst, req->bytes, why);
    }
    req->in_progress = false;
    auto it2 = mailbox_.find(key);
    if (it2 != mailbox_.end() && !it2->second.posted.empty() &&
        it2->second.posted.front() == req) {
      it2->second.posted.erase(it2->second.posted.begin());
      if (it2->second.empty()) mailbox_.erase(it2);
    }
    req->ev.set(ec ? make_error_code(errc::peer_lost) : std::error_code{});
    co_return ec;
  }
  if (unexpected_bytes_ + h.payload_bytes > opts_.max_unexpected_bytes) {
    why = "peer sent more unrequested data than the limit of " +
          std::to_string(opts_.max_unexpected_bytes) + " bytes";
    co_return make_error_code(errc::protocol_error);
  }
  ScratchPool::Block block = early_block(h.payload_bytes);
  if (auto ec = co_await read_payload(in, src, block.data.get(), h.payload_bytes, why)) {
    recycle(std::move(block));
    co_return ec;
  }
  // The receive may have been posted while this payload was being read: then the block was
  // not kept, and goes back to the pool.
  const std::error_code ec =
      store_frame(peer, key, {block.data.get(), h.payload_bytes}, &block, why);
  if (block.data) recycle(std::move(block));
  co_return ec;
}

std::error_code PeerImpl::store_frame(int peer, const MailKeyView& key,
                                      std::span<const std::byte> payload,
                                      ScratchPool::Block* owned, std::string& why) {
  if (!express_waiting_.empty()) {
    std::error_code conn;
    if (express_take(key, payload, conn, why)) return conn;
  }
  auto it = mailbox_.empty() ? mailbox_.end() : mailbox_.find(key);
  if (it != mailbox_.end() && !it->second.posted.empty()) {
    auto req = it->second.posted.front();
    it->second.posted.erase(it->second.posted.begin());
    if (it->second.empty()) drop_slot(it);
    if (req->bytes != payload.size()) {
      why = wrong_size(key.name, payload.size(), req->bytes);
      req->ev.set(make_error_code(errc::protocol_error));
      return make_error_code(errc::protocol_error);
    }
    deliver(*req, payload.data(), 0, payload.size());
    req->ev.set({});
    return {};
  }
  if (key.version < io_cluster_.version) {
    KF_LOG(debug, "transport", "{}: dropped '{}' of stale version {} from {}", identity_, key.name,
           key.version, peers_[static_cast<std::size_t>(peer)].key);
    return {};
  }
  if (unexpected_bytes_ + payload.size() > opts_.max_unexpected_bytes) {
    why = "peer sent more unrequested data than the limit of " +
          std::to_string(opts_.max_unexpected_bytes) + " bytes";
    return make_error_code(errc::protocol_error);
  }
  unexpected_bytes_ += payload.size();
  Counters::add(counters_.early_bytes, payload.size());
  if (key.tag == 0 && payload.size() <= EarlyFrame::kSmallBytes && mailbox_.empty() &&
      key.name.size() <= QuickEarly::kNameBytes && quick_early_.size() < QuickEarly::kMax) {
    QuickEarly& q = quick_early_.emplace_back();
    q.peer = key.peer;
    q.version = key.version;
    q.name_bytes = key.name.size();
    std::memcpy(q.name_chars.data(), key.name.data(), key.name.size());
    q.frame.bytes = payload.size();
    if (!payload.empty()) std::memcpy(q.frame.small.data(), payload.data(), payload.size());
    return {};
  }
  EarlyFrame early{owned ? std::move(*owned) : early_block(payload.size()), payload.size()};
  if (!owned && !payload.empty()) {
    std::memcpy(early.block.data.get(), payload.data(), payload.size());
  }
  (it != mailbox_.end() ? it : add_slot(key))->second.unexpected.push_back(std::move(early));
  return {};
}

Mailbox::iterator PeerImpl::slot_for(const MailKeyView& key) {
  auto it = mailbox_.find(key);
  return it != mailbox_.end() ? it : add_slot(key);
}

Mailbox::iterator PeerImpl::add_slot(const MailKeyView& key) {
  if (spare_slots_.empty()) return mailbox_.try_emplace(key.owned()).first;
  Mailbox::node_type node = std::move(spare_slots_.back());
  spare_slots_.pop_back();
  MailKey& k = node.key();
  k.peer = key.peer;
  k.version = key.version;
  k.tag = key.tag;
  k.name.assign(key.name);
  return mailbox_.insert(std::move(node)).position;
}

void PeerImpl::drop_slot(Mailbox::iterator it) {
  constexpr std::size_t kSpareSlots = 16;
  if (spare_slots_.size() < kSpareSlots) {
    spare_slots_.push_back(mailbox_.extract(it));
  } else {
    mailbox_.erase(it);
  }
}

ScratchPool::Block PeerImpl::early_block(std::size_t bytes) {
  return early_pool_for(bytes).acquire(std::max(bytes, kSmallEarlyBytes));
}

void PeerImpl::recycle(ScratchPool::Block b) { early_pool_for(b.bytes).release(std::move(b)); }

// ---- shared-memory rings ----------------------------------------------------------------------

awaitable<std::error_code> PeerImpl::offer_ring(Outgoing& out, Incoming& reader,
                                                std::string& why) {
  std::error_code cec;
  auto ring = transport::ShmRing::create(cec);
  if (!ring) {
    KF_LOG(info, "transport", "{}: no shared-memory ring ({}); small frames to {} go through the "
           "socket", identity_, cec.message(), peers_[static_cast<std::size_t>(out.peer)].key);
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

awaitable<std::error_code> PeerImpl::accept_ring(const std::shared_ptr<Incoming>& in,
                                                 const std::vector<std::byte>& payload,
                                                 std::string& why) {
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
  driver_->reads_rings = true;
  co_return co_await write_reply(in->sock, transport::RemoteReply::copied);
}

std::size_t PeerImpl::drain_ring(Incoming& in) {
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

std::size_t PeerImpl::poll_rings() {
  std::size_t n = 0;
  for (std::size_t i = 0; i < ring_readers_.size(); ++i) n += drain_ring(*ring_readers_[i]);
  return n;
}

// Before it sleeps, the thread running the context tells every writer so (writers then use the
// socket, which wakes it), and looks once more: a record published before a writer could see
// the flag is taken now instead of waiting for the next socket event.
bool PeerImpl::rings_asleep(bool asleep) {
  if (ring_readers_.empty()) return true;
  for (auto& in : ring_readers_) in->ring->set_reader_sleeping(asleep);
  if (!asleep || poll_rings() == 0) return true;
  for (auto& in : ring_readers_) in->ring->set_reader_sleeping(false);
  return false;
}

// ---- writing --------------------------------------------------------------------------------

bool PeerImpl::same_host(const Endpoint& ep) const {
  return opts_.transport != Transport::tcp && local_acceptor_.is_open() && on_this_host(ep);
}

bool PeerImpl::on_this_host(const Endpoint& ep) const {
  if (ep.host == self_.host) return true;
  boost::system::error_code e1, e2;
  const auto a = asio::ip::make_address(ep.host, e1);
  const auto b = asio::ip::make_address(self_.host, e2);
  return !e1 && !e2 && a.is_loopback() && b.is_loopback();
}

awaitable<boost::system::error_code> PeerImpl::connect(Outgoing& out, const Endpoint& ep) {
  out.local = false;
  out.single_copy = false;
  out.ring.reset();
  const bool try_local = same_host(ep) && !peers_[static_cast<std::size_t>(out.peer)].no_local;
  // The peer's same-host socket, into `out` when it answers.
  auto connect_local = [&]() -> awaitable<boost::system::error_code> {
    local_stream::socket s(ex());
    auto [ec] = co_await s.async_connect(local_stream::endpoint(local_socket_name(ep)), kTuple);
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
  tcp::resolver resolver(ex());
  auto [rec, results] = co_await resolver.async_resolve(ep.host, std::to_string(ep.port), kTuple);
  if (rec) co_return rec;
  tcp::socket s(ex());
  auto [ec, connected] = co_await asio::async_connect(s, results, kTuple);
  if (ec) co_return ec;
  // A peer that started between the two attempts (the name lookup takes a while) listens on its
  // same-host socket by now, if at all: it opens that before its TCP port (PeerImpl's
  // constructor). Without this second look, the connection would stay on TCP for good.
  if (try_local && !co_await connect_local()) co_return boost::system::error_code{};
  set_socket_options(s, opts_.socket_buffer_bytes);
  out.sock = Stream(std::move(s));
  co_return ec;
}

awaitable<std::error_code> PeerImpl::dial(Outgoing& out) {
  const Endpoint ep = peers_[static_cast<std::size_t>(out.peer)].ep;
  const auto give_up = Clock::now() + opts_.connect_timeout;
  std::chrono::milliseconds backoff{2};
  for (;;) {
    const boost::system::error_code cec = co_await connect(out, ep);
    if (!cec) break;
    if (stopping_ || out.closed) co_return make_error_code(errc::cancelled);
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
    transport::Hello hello{opts_.job_id, identity_, transport::random_nonce(), {}};
    hello.mac = transport::handshake_mac(opts_.job_token, "hello", opts_.job_id, identity_, their);
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
    const auto want = transport::handshake_mac(opts_.job_token, "welcome", opts_.job_id,
                                               w->identity, hello.nonce);
    if (!transport::mac_equal(want, w->mac)) {
      why = "peer " + ep.str() + " does not prove the job token";
      co_return make_error_code(errc::auth_failed);
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
    KF_LOG(warn, "transport", "{}: handshake over the same-host socket of {} failed ({}); "
           "using TCP", identity_, ep.str(), why.empty() ? ec.message() : why);
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

awaitable<std::error_code> PeerImpl::write_frame(Outgoing& out, SendReq& req) {
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
    std::array<std::byte, transport::kRemoteAddressBytes> addr;
    const auto a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data));
    for (std::size_t i = 0; i < addr.size(); ++i) addr[i] = static_cast<std::byte>(a >> (8 * i));
    std::array<asio::const_buffer, 3> bufs{asio::buffer(hb), asio::buffer(req.name),
                                           asio::buffer(addr)};
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
    KF_LOG(info, "transport", "{}: {} cannot copy from this process; sending payloads through "
           "the socket", identity_, peers_[static_cast<std::size_t>(out.peer)].key);
    out.single_copy = false;
    Counters::add(counters_.single_copy_refused, 1);
  } else {
    done = std::min(req.bytes, kProgressChunk);
    std::array<asio::const_buffer, 3> bufs{asio::buffer(req.header), asio::buffer(req.name),
                                           asio::buffer(data, done)};
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
  while (!ec && done < req.bytes) {
    const std::size_t len = std::min(req.bytes - done, kProgressChunk);
    auto [wec, n] =
        co_await asio::async_write(out.sock, asio::buffer(data + done, len), AllAtOnce{}, kTuple);
    ec = wec;
    done += len;
    touch();
  }
  if (!ec && req.header[6] == static_cast<std::byte>(FrameType::data)) {
    Counters::add(out.local ? counters_.socket_bytes : counters_.tcp_bytes, req.bytes);
  }
  co_return to_std(ec);
}

std::size_t PeerImpl::write_now(Outgoing& out, const transport::HeaderBytes& header,
                               std::string_view name, const std::byte* data, std::size_t bytes) {
  const std::array<asio::const_buffer, 3> bufs{asio::buffer(header),
                                               asio::buffer(name.data(), name.size()),
                                               asio::buffer(data, bytes)};
  boost::system::error_code ec;
  // The socket is in non-blocking mode (run_outgoing): would_block means nothing was written.
  const std::size_t n = out.sock.write_some(bufs, ec);
  if (n == 0) return 0;
  // Some bytes are in the socket: the frame is this connection's next, whatever happens now.
  ++out.socket_frames;
  peers_[static_cast<std::size_t>(out.peer)].last_tx = coarse_now();
  if (n == header.size() + name.size() + bytes) {
    Counters::add(out.local ? counters_.socket_bytes : counters_.tcp_bytes, bytes);
  }
  return n;
}

awaitable<void> PeerImpl::run_outgoing(std::shared_ptr<Outgoing> out) {
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

std::shared_ptr<SendReq> PeerImpl::post_send(int peer, const FrameHeader& h,
                                             std::string_view name, const std::byte* data,
                                             bool copy_if_queued) {
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
    ++handlers_posted_;
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
    ps.last_tx = coarse_now();
    // It went to sleep as the record landed, perhaps without seeing it: a frame on the socket
    // (a heartbeat) wakes it, and it takes the ring's records before that frame.
    if (out.ring->reader_sleeping()) post_control(peer, FrameType::heartbeat, {});
    return sent_;
  }
  const transport::HeaderBytes header = transport::encode(h);
  // Straight into the socket while the writer has nothing to do. A frame that went whole is
  // complete and, like a ring record, needs no request of its own (an allocation, a copy of the
  // name and an event per frame); one that does not fit goes on through the writer from where
  // this left it.
  std::size_t written = 0;
  if (h.type == FrameType::data && out.connected && out.sock.non_blocking() && !out.closed &&
      !out.writing && out.queue.empty() && h.payload_bytes <= kWriteNowBytes &&
      !(out.single_copy && h.payload_bytes >= opts_.single_copy_bytes)) {
    written = write_now(out, header, name, data, h.payload_bytes);
    if (written == header.size() + name.size() + h.payload_bytes) return sent_;
  }
  auto req = std::make_shared<SendReq>(ex());
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
  ++handlers_posted_;
  return req;
}

std::shared_ptr<SendReq> PeerImpl::post_control(int peer, FrameType t,
                                                std::vector<std::byte> payload) {
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

std::shared_ptr<RecvReq> PeerImpl::post_recv(const MailKeyView& key, std::byte* dst,
                                             std::size_t bytes, const ReduceOnArrival* reduce) {
  KF_LOG(trace, "transport", "{}: post recv '{}' tag {} from {} ({} bytes)", identity_, key.name,
         key.tag, peers_[key.peer].key, bytes);
  // The frame came first (a peer a moment ahead): delivered now, with no request of its own
  // (the shared completed one).
  if (auto taken = take_early(key)) {
    EarlyFrame& early = *taken;
    std::shared_ptr<RecvReq> req = received_;
    if (early.bytes != bytes) {
      req = std::make_shared<RecvReq>(ex(), key.owned());
      req->ev.set(make_error_code(errc::protocol_error));
    } else if (reduce) {
      deliver_to(dst, true, reduce->src, reduce->dtype, reduce->op, early.data(), bytes);
    } else {
      deliver_to(dst, false, nullptr, DType::u8, ReduceOp::sum, early.data(), bytes);
    }
    recycle(std::move(early.block));
    return req;
  }
  auto req = std::make_shared<RecvReq>(ex(), key.owned());
  const MailKey& k = req->key;
  req->dst = dst;
  req->bytes = bytes;
  if (reduce) {
    req->reduce = true;
    req->src = reduce->src;
    req->dtype = reduce->dtype;
    req->op = reduce->op;
  }
  // No frame came before it (searched above): the receive waits in its slot.
  auto it = slot_for(key);
  if (const std::error_code ec = receive_refusal(k.peer, k.version)) {
    if (it->second.empty()) drop_slot(it);
    req->ev.set(ec);
    return req;
  }
  it->second.posted.push_back(req);
  return req;
}

std::error_code PeerImpl::receive_refusal(int peer, std::uint64_t version) const {
  const auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.lost || ps.departed) return make_error_code(errc::peer_lost);
  if (broken_ && version == io_cluster_.version) return broken_;
  if (ps.max_version > version) return make_error_code(errc::stale_version);
  return {};
}

// An empty mailbox, the usual case, is not even searched.
std::optional<EarlyFrame> PeerImpl::take_early(const MailKeyView& key) {
  if (key.tag == 0) {
    for (auto q = quick_early_.begin(); q != quick_early_.end(); ++q) {
      if (q->peer == key.peer && q->version == key.version && q->name() == key.name) {
        std::optional<EarlyFrame> early(std::move(q->frame));
        unexpected_bytes_ -= early->bytes;
        quick_early_.erase(q);
        return early;
      }
    }
  }
  if (mailbox_.empty()) return std::nullopt;
  auto it = mailbox_.find(key);
  if (it == mailbox_.end() || it->second.unexpected.empty()) return std::nullopt;
  EarlyFrame early = std::move(it->second.unexpected.front());
  it->second.unexpected.erase(it->second.unexpected.begin());
  unexpected_bytes_ -= early.bytes;
  if (it->second.empty()) drop_slot(it);
  return early;
}

void PeerImpl::cancel(const std::shared_ptr<SendReq>& r, std::error_code ec) {
  if (r->ev.done || r->in_progress) return;
  r->cancelled = true;
  r->ev.set(ec);
}

void PeerImpl::cancel(const std::shared_ptr<RecvReq>& r, std::error_code ec) {
  if (r->ev.done || r->in_progress) return;
  auto it = mailbox_.find(r->key);
  if (it != mailbox_.end()) {
    auto& posted = it->second.posted;
    posted.erase(std::remove(posted.begin(), posted.end(), r), posted.end());
    if (it->second.empty()) mailbox_.erase(it);
  }
  r->ev.set(ec);
}

awaitable<std::error_code> PeerImpl::wait_progress(Event& ev, int peer,
                                                   std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!ev.done) {
    ev.timer().expires_at(deadline);
    co_await ev.timer().async_wait(kTuple);
    if (ev.done) break;
    const auto& ps = peers_[static_cast<std::size_t>(peer)];
    const auto last = std::max(ps.last_rx, ps.last_tx) + timeout;
    const auto now = Clock::now();
    if (now >= deadline && now >= last) co_return make_error_code(errc::timeout);
    deadline = std::max(deadline, last);
  }
  co_return ev.ec;
}

void PeerImpl::force_close(int peer) {
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  boost::system::error_code ignored;
  for (auto& in : ps.in) in->sock.close(ignored);
  if (ps.out) {
    ps.out->closed = true;
    ps.out->sock.close(ignored);
    ps.out->signal.cancel();
  }
}

// ---- failure bookkeeping ------------------------------------------------------------------

void PeerImpl::mark_lost(int peer, std::error_code ec, const std::string& why) {
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.lost || stopping_) return;
  // A peer that said goodbye is gone by its own choice: what waited on it has already failed
  // (mark_departed), and its connections breaking afterwards is expected.
  if (ps.departed) return;
  ps.lost = true;
  const bool member = io_cluster_.rank_of(ps.ep).has_value();
  KF_LOG(warn, "transport", "{} (rank {}, v{}): peer {} lost: {}", identity_, io_rank_,
         io_cluster_.version, ps.key, why);
  if (member) break_version(ec, "peer " + ps.key + " lost: " + why);
}

void PeerImpl::mark_departed(int peer) {
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  ps.departed = true;
  KF_LOG(debug, "transport", "{}: peer {} said goodbye", identity_, ps.key);
  fail_receives([peer](const auto& k) { return k.peer == peer; },
                make_error_code(errc::peer_lost));
}

void PeerImpl::note_version(int peer, std::uint64_t version) {
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (version <= ps.max_version) return;
  ps.max_version = version;
  KF_LOG(debug, "transport", "{}: {} moved to version {}", identity_, ps.key, version);
  fail_receives([&](const auto& k) { return k.peer == peer && k.version < version; },
                make_error_code(errc::stale_version));
}

// A member is gone, so every collective of this cluster version fails on this worker and on
// every worker we can still tell (they may be waiting on someone other than the lost peer).
void PeerImpl::break_version(std::error_code ec, const std::string& why) {
  if (broken_) return;
  broken_ = ec;
  broken_why_ = why;
  for (auto& [key, slot] : mailbox_) {
    for (auto& r : slot.posted) {
      if (!r->in_progress) r->ev.set(ec);
    }
    slot.drop_idle();
  }
  std::erase_if(mailbox_, [](const auto& kv) { return kv.second.empty(); });
  fail_express_if([](const MailKeyView&) { return true; }, ec);
  std::vector<std::string> lost;
  for (auto& ps : peers_) {
    if (ps.lost) lost.push_back(ps.key);
    if (!ps.out) continue;
    for (auto& r : ps.out->queue) cancel(r, ec);
  }
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].lost || peers_[i].departed || !io_cluster_.rank_of(peers_[i].ep)) continue;
    if (peers_[i].key == identity_) continue;  // this worker knows already
    for (const auto& who : lost) {
      std::vector<std::byte> payload(reinterpret_cast<const std::byte*>(who.data()),
                                     reinterpret_cast<const std::byte*>(who.data()) + who.size());
      post_control(static_cast<int>(i), FrameType::notice_lost, std::move(payload));
    }
  }
}

// Members that send us data also send heartbeats while idle; one that stays silent past the
// heartbeat timeout (a stopped process, a lost machine: nothing closes its connection) is lost.
//
// Silence counts only while this thread runs on time. A tick that comes late means this
// process did not run for that long (a loaded machine, a paused VM), and most likely neither
// did its peers on the same host: what they wrote meanwhile may still be unread, or not yet
// written by a peer that got its core back later than this one. From such a tick on, every
// member's silence counts afresh (`awake_since`). Judging only the late tick itself, as this
// did first, lost members across two stalls in a row, and whenever a peer got its core back
// after this one (PeerLoss.AHostWidePauseLosesNobody). The price: a process starved without
// pause finds its silent peers late (the collectives' own deadlines still hold).
awaitable<void> PeerImpl::watchdog() {
  const auto timeout = opts_.heartbeat_timeout;
  asio::steady_timer t(ex());
  const auto tick = std::max(timeout / 4, std::chrono::milliseconds(10));
  Clock::time_point awake_since{};
  while (!stopping_ && timeout.count() > 0) {
    const auto due = Clock::now() + tick;
    t.expires_at(due);
    auto [ec] = co_await t.async_wait(kTuple);
    if (ec || stopping_) co_return;
    const auto now = Clock::now();
    if (now - due > tick / 2) {
      awake_since = now;
      continue;
    }
    for (const auto& w : io_cluster_.workers) {
      auto it = peer_by_key_.find(w.endpoint.str());
      if (it == peer_by_key_.end()) continue;
      const auto& ps = peers_[static_cast<std::size_t>(it->second)];
      if (ps.in.empty() || ps.lost || ps.departed) continue;
      if (now - std::max(ps.last_rx, awake_since) < timeout) continue;
      bool pending = false;  // bytes waiting in the kernel mean the peer is alive
      for (const auto& in : ps.in) {
        boost::system::error_code aec;
        pending = pending || in->sock.available(aec) > 0;
      }
      if (pending) continue;
      mark_lost(it->second, make_error_code(errc::timeout),
                "no heartbeat for " + std::to_string(timeout.count()) + " ms");
    }
  }
}

// Says goodbye on every open connection, so that those peers know this one left by choice, and
// waits for the goodbyes to be written: 2 s for all of them together. A connection still being
// dialled gets no goodbye: its peer never heard from this one (or has left: at the end of a job
// the peers go one after another), and waiting for the dial would hold the shutdown up to the
// connect timeout. From the start nothing is marked lost and nothing new is dialled: a peer
// that leaves has nobody left to tell.
awaitable<void> PeerImpl::shutdown() {
  stopping_ = true;
  std::vector<std::shared_ptr<SendReq>> byes;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const auto& out = peers_[i].out;
    if (!out || out->closed) continue;
    if (out->connected) {
      byes.push_back(post_control(static_cast<int>(i), FrameType::bye, {}));
    } else {
      out->closed = true;  // dial() gives up at its next attempt
      for (auto& r : out->queue) r->ev.set(make_error_code(errc::closed));
      out->queue.clear();
    }
  }
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  for (auto& b : byes) {
    if (!b->ev.done) {
      b->ev.timer().expires_at(deadline);
      co_await b->ev.timer().async_wait(kTuple);
    }
  }
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  local_acceptor_.close(ignored);
  for (std::size_t i = 0; i < peers_.size(); ++i) force_close(static_cast<int>(i));
}

}  // namespace kf::detail
