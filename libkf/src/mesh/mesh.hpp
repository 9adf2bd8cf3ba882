// SPDX-License-Identifier: Apache-2.0
// The mesh: this worker's connections to its peers. It listens (TCP, and a same-host Unix
// socket), dials lazily on the first frame for a peer, runs the handshake that proves the job
// token, keeps one writer and one reader coroutine per connection, polls the shared-memory
// rings, and hands every data frame to the mailbox. It knows who is alive: heartbeats, broken
// connections and peers' reports make a peer lost, a goodbye makes it departed, and a lost
// member breaks the cluster version (every waiting receive of it fails). It knows nothing of
// collectives. Thread-safety: I/O context only (checked in debug builds), except where a
// member says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/asio.hpp"
#include "driver/driver.hpp"
#include "kf/cluster/cluster.hpp"
#include "kf/common/keys.hpp"
#include "kf/common/log.hpp"
#include "kf/peer.hpp"
#include "mailbox/mailbox.hpp"
#include "mailbox/request.hpp"
#include "mesh/link.hpp"
#include "transport/frame.hpp"

namespace kf::detail {

class Mesh {
 public:
  /// Binds the listeners (throws kf::Error naming the address when it cannot); accepting starts
  /// with start().
  Mesh(const PeerOptions& opts, asio::io_context& ioc, Driver& driver, Mailbox& mailbox);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  /// Starts accepting and the heartbeat watchdog (coroutines on the context). Any thread,
  /// before the I/O thread runs.
  void start();
  /// This worker's endpoint and its name in logs. Any thread.
  const Endpoint& self() const noexcept { return self_; }
  const std::string& identity() const noexcept { return identity_; }
  std::size_t max_frame_bytes() const noexcept { return opts_.max_frame_bytes; }

  // ---- cluster versions and peers ----

  /// Adopts cluster version `c`, in which this worker has rank `rank`: its members start with a
  /// clean record, what the mailbox keeps for older versions is dropped, and a broken version
  /// is mended. Returns the peer index of each rank.
  std::vector<int> adopt(const Cluster& c, int rank);
  /// The members of the current version that are lost.
  std::vector<Endpoint> lost_peers() const;
  /// The index of the peer at `ep`, added when new; indices are never reused.
  int peer_index(const Endpoint& ep);
  /// A peer's name in messages ("host:port").
  const std::string& peer_key(int peer) const noexcept {
    return peers_[static_cast<std::size_t>(peer)].key;
  }
  /// When `peer` was last heard from or written to.
  Clock::time_point last_progress(int peer) const noexcept {
    const auto& ps = peers_[static_cast<std::size_t>(peer)];
    return std::max(ps.last_rx, ps.last_tx);
  }
  /// Whether `ep` is on this host: the same host string, or both loopback addresses. Any thread.
  bool on_this_host(const Endpoint& ep) const;
  /// Why the current version is broken (a member was lost), or no error; and the reason.
  std::error_code broken() const noexcept { return broken_; }
  /// The last cluster version that broke (0: none); any thread.
  std::uint64_t broken_version() const noexcept {
    return broken_version_.load(std::memory_order_acquire);
  }
  const std::string& broken_why() const noexcept { return broken_why_; }

  // ---- frames and transfers ----

  /// Sends a frame. A data frame that went whole into a shared-memory ring or the socket at once
  /// is complete and gets `sent_`, shared by all such sends: callers only look at a request's
  /// event. With `copy_if_queued`, a frame that is not sent at once is sent from a copy of
  /// `data`, which the caller may then change (otherwise `data` must stay as it is until the
  /// request completes).
  std::shared_ptr<SendReq> post_send(int peer, const transport::FrameHeader& h,
                                     std::string_view name, const std::byte* data,
                                     bool copy_if_queued = false) {
    std::shared_ptr<SendReq> req = send_frame(peer, h, name, data, copy_if_queued);
    return req ? req : sent_;
  }
  /// post_send for a caller that has no use for a completed send: empty where post_send would
  /// return `sent_` (a frame that went whole at once), which saves taking and dropping a
  /// reference to it (two atomic read-modify-writes; the express allreduce's every round).
  std::shared_ptr<SendReq> send_frame(int peer, const transport::FrameHeader& h,
                                      std::string_view name, const std::byte* data,
                                      bool copy_if_queued = false);
  std::shared_ptr<SendReq> post_control(int peer, transport::FrameType t,
                                        std::vector<std::byte> payload);
  /// Posts a receive in the mailbox; with `reduce` the payload is reduced into dst on arrival
  /// instead of copied. One whose frame came before it is complete at once and gets the
  /// mailbox's shared completed receive; one that can never complete fails at once.
  std::shared_ptr<RecvReq> post_recv(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                     const ReduceOnArrival* reduce = nullptr);
  /// Why a receive from `peer` of `version` can never complete (the peer is gone, the version
  /// broken, or the peer has moved past it), or no error.
  std::error_code receive_refusal(int peer, std::uint64_t version) const;
  /// Cancels a send that is not being written.
  void cancel(const std::shared_ptr<SendReq>& r, std::error_code ec);
  /// Waits for `ev` while `peer` shows progress: times out once `timeout` passed with no word.
  awaitable<std::error_code> wait_progress(Event& ev, int peer, std::chrono::milliseconds timeout);
  /// Closes every connection with `peer`.
  void force_close(int peer);
  /// Closes the connection to `peer`, if any: its writer ends without writing more.
  void close_outgoing(int peer);
  /// `peer` is lost (no goodbye): a member's loss breaks the current version.
  void mark_lost(int peer, std::error_code ec, const std::string& why);

  // ---- invitations (the join protocol's first step) ----

  /// Sends `payload` to `to` as an invitation. Any thread.
  Handle invite(const Endpoint& to, std::string payload);
  /// The next invitation received, or none within `timeout`. Any thread.
  std::optional<Invitation> wait_invitation(std::chrono::milliseconds timeout);

  // ---- the shared-memory rings, polled by whoever runs the context (Driver) ----

  /// Whether this worker reads any ring.
  bool reads_rings() const noexcept { return !ring_readers_.empty(); }
  /// Drains every ring; returns the number of records taken.
  std::size_t poll_rings();
  /// asleep: tells every ring's writer that this side is about to sleep, and returns false
  /// (after taking the flag back) if a ring has a record after all. !asleep: awake again.
  bool rings_asleep(bool asleep);

  /// Says goodbye on every open connection and waits (2 s at most) for the goodbyes to leave;
  /// then closes the listeners and every connection.
  awaitable<void> shutdown();

  /// Bytes moved by each path; written by the I/O context, read from any thread.
  struct Counters {
    std::atomic<std::uint64_t> tcp_bytes{0}, socket_bytes{0}, single_copy_bytes{0},
        single_copy_refused{0}, shared_read_bytes{0}, shm_bytes{0}, accept_failures{0},
        handshakes_refused{0};
    static void add(std::atomic<std::uint64_t>& c, std::uint64_t n) {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  };
  const Counters& counters() const noexcept { return counters_; }

  /// Reads exactly n bytes of `in` (through its read-ahead buffer). Public for the handshake's
  /// read_control (transport/stream/socket_io.hpp).
  awaitable<std::error_code> read_exact(Incoming& in, std::byte* dst, std::size_t n);
  /// read_exact's first step alone: when the read-ahead buffer holds n bytes, takes them (into
  /// the frame's MAC too) and returns true; otherwise takes nothing.
  static bool take_buffered(Incoming& in, std::byte* dst, std::size_t n) noexcept;

 private:
  asio::any_io_executor ex() { return ioc_.get_executor(); }
  /// Makes PeerOptions::listen_fd the TCP acceptor once it is checked to be a TCP socket bound
  /// to the port and an address of opts_.listen (`ep`: the address that resolves to). Throws:
  /// kf::Error saying what the descriptor is instead (left open: it may be something else's).
  void adopt_listener(const tcp::endpoint& ep);

  // ---- accepting (mesh/accept.cpp) ----
  /// Accepts connections on `acceptor` (TCP or Unix-domain) and serves each.
  template <typename Acceptor>
  awaitable<void> accept_loop(Acceptor& acceptor);
  /// Reads an accepted connection's frames until it ends. `from` names the remote end in logs
  /// until the handshake tells who it is.
  awaitable<void> serve_incoming(std::shared_ptr<Incoming> in, std::string from);
  /// The acceptor's handshake: challenge, hello (which must prove the job token), welcome; sets
  /// in.peer.
  awaitable<std::error_code> accept_handshake(Incoming& in, std::string& why);
  /// Runs the handshake within the handshake timeout; a connection that fails it is closed.
  awaitable<bool> admit(Incoming& in, const std::string& from);
  /// Why a connection from `source` (Incoming::source) cannot start a handshake now, if it
  /// cannot (PeerOptions::max_pending_handshakes).
  std::optional<std::string> handshake_room(const std::string& source) const;
  /// The handshake of `in` is over (either way): it no longer counts as pending.
  void end_handshake(Incoming& in);
  /// Logs a rejected connection at warn, within reject_log_'s rate (else at debug). Anything
  /// the remote end chose in `line` must have gone through kf::printable.
  void log_rejected(const std::string& line);
  /// The end of an incoming connection: a peer that did not say goodbye counts as lost.
  void close_incoming(const std::shared_ptr<Incoming>& in, bool said_bye, std::error_code ec,
                      std::string why);
  // The handlers of incoming frames, one per type; an error ends the connection.
  std::error_code on_data_read_ahead(Incoming& in, const transport::FrameHeader& h,
                                     std::string& why);
  awaitable<std::error_code> on_data(Incoming& in, const transport::FrameHeader& h,
                                     std::string& name, std::string& why);
  /// A single-copy frame's address in its sender's memory, and whether it can be copied.
  awaitable<std::error_code> take_remote_address(Incoming& in, const transport::FrameHeader& h,
                                                 PayloadSource& src, std::string& why);
  awaitable<std::error_code> skip_payload(Incoming& in, const transport::FrameHeader& h);
  awaitable<std::error_code> on_notice_lost(Incoming& in, const transport::FrameHeader& h);
  awaitable<std::error_code> on_invite(Incoming& in, const transport::FrameHeader& h);
  awaitable<std::error_code> on_ring_offer(const std::shared_ptr<Incoming>& in,
                                           const transport::FrameHeader& h, std::string& why);

  // ---- dialling and writing (mesh/outgoing.cpp, transport/stream/writes.cpp) ----
  /// Whether connections to `ep` try the Unix-domain socket first (not Transport::tcp).
  bool same_host(const Endpoint& ep) const;
  /// Connects out.sock to the peer: its Unix-domain socket when it is on this host, else TCP.
  awaitable<boost::system::error_code> connect(Outgoing& out, const Endpoint& ep);
  awaitable<void> run_outgoing(std::shared_ptr<Outgoing> out);
  awaitable<std::error_code> dial(Outgoing& out);
  awaitable<std::error_code> write_frame(Outgoing& out, SendReq& req);
  /// A small data frame to a connection whose writer is idle: written straight into the socket
  /// without blocking, saving the hand-off to the writer coroutine. Returns the bytes of the
  /// frame (header, name, payload and, with frame MACs, its tag, put in `tag`) that went; the
  /// caller queues the rest.
  std::size_t write_now(Outgoing& out, const transport::HeaderBytes& header, std::string_view name,
                        const std::byte* data, std::size_t bytes, transport::Tag& tag);
  /// With frame MACs (Incoming::mac): ends the frame being read by reading its tag and checking
  /// it. Call it after the frame's bytes were read and before acting on them. Returns
  /// protocol_error, with `why`, for a tag that does not match.
  awaitable<std::error_code> check_tag(Incoming& in, std::string& why);

  // ---- reading (transport/stream/reads.cpp, mesh/frames.cpp) ----
  /// The next n payload bytes of the frame being read, into dst (from the socket, or copied
  /// from the sender's memory for a single-copy frame).
  awaitable<std::error_code> read_payload(Incoming& in, PayloadSource& src, std::byte* dst,
                                          std::size_t n, std::string& why);
  /// The next n (at most Incoming::kReduceChunk) payload bytes, for a streamed reduction: in
  /// place in the sender's shared region when src is mapped, else read into in.chunk.
  awaitable<std::error_code> read_piece(Incoming& in, PayloadSource& src, std::size_t n,
                                        const std::byte*& piece, std::string& why);
  /// Reads the frame's payload into a posted receive or, when none is posted, into the
  /// mailbox's early frames. Returns an error that ends the connection.
  awaitable<std::error_code> receive_data(Incoming& in, int peer, const transport::FrameHeader& h,
                                          const std::string& name, PayloadSource& src,
                                          std::string& why);
  /// A data frame whose payload is wholly in memory, handed to the mailbox (Mailbox::store);
  /// logs a stale frame it dropped. Returns an error that ends the connection.
  std::error_code store_frame(int peer, const MailKeyView& key, std::span<const std::byte> payload,
                              ScratchPool::Block* owned, std::string& why);

  // ---- shared-memory rings (transport/shm/rings.cpp) ----
  /// Dialer: creates a ring and offers it over the fresh connection `reader` (still in the
  /// handshake); sets out.ring if the acceptor took it.
  awaitable<std::error_code> offer_ring(Outgoing& out, Incoming& reader, std::string& why);
  /// Acceptor: maps the offered ring and answers; an error ends the connection.
  awaitable<std::error_code> accept_ring(const std::shared_ptr<Incoming>& in,
                                         const std::vector<std::byte>& name, std::string& why);
  /// Takes every record of `in`'s ring whose turn has come and returns how many. A malformed
  /// record closes the connection, with the reason in in.closed_why.
  std::size_t drain_ring(Incoming& in);

  // ---- health (mesh/health.cpp) ----
  void mark_departed(int peer);
  /// Records that `peer` sent a frame of `version`; fails its receives of older versions.
  void note_version(int peer, std::uint64_t version);
  /// A member is gone: every collective of this version fails here and on every worker this one
  /// can still tell.
  void break_version(std::error_code ec, const std::string& why);
  /// Tells every member not known to be gone that the members `lost` are (notice_lost).
  void tell_lost(const std::vector<std::string>& lost);
  /// Loses members silent past the heartbeat timeout.
  awaitable<void> watchdog();

  const PeerOptions& opts_;
  const Key peer_key_;  // derive_key(opts_.job_token, KeyUse::peers): the handshake's key
  asio::io_context& ioc_;
  Driver& driver_;
  Mailbox& mailbox_;
  tcp::acceptor acceptor_;
  // Unix-domain listener of the same-host transport, in the abstract namespace (nothing on
  // disk to clean up), named after the TCP endpoint: local_socket_name(self_).
  local_stream::acceptor local_acceptor_;
  Endpoint self_;
  std::string identity_;

  Cluster io_cluster_;  // the current cluster version, as the I/O context sees it
  int io_rank_ = 0;
  std::vector<PeerState> peers_;
  std::unordered_map<std::string, int> peer_by_key_;
  std::vector<std::shared_ptr<Incoming>> ring_readers_;  // connections with a ring to read
  bool barrier_refused_ = false;  // the kernel refused a ring's sleep barrier (logged once)
  std::error_code broken_;
  std::atomic<std::uint64_t> broken_version_{0};
  std::string broken_why_;
  bool stopping_ = false;
  // The completed send that post_send hands out for transfers done at once (a ring write, a
  // frame written whole), instead of allocating one each. Never modified after construction.
  std::shared_ptr<SendReq> sent_;
  Counters counters_;

  // Accepted connections in their handshake, in all and by source (admit_limits); log lines
  // about rejected connections, rate-limited.
  int pending_handshakes_ = 0;
  std::unordered_map<std::string, int> pending_by_source_;
  LogLimiter reject_log_{20, std::chrono::seconds(10)};

  // Invitations received (the I/O context pushes, a user thread takes).
  std::mutex invite_mu_;
  std::condition_variable invite_cv_;
  std::deque<Invitation> invitations_;
  std::size_t invitation_bytes_ = 0;  // payload bytes held in invitations_
};

}  // namespace kf::detail
