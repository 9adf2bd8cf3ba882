// SPDX-License-Identifier: Apache-2.0
// Private state of kf::Peer. Everything below runs on the peer's single I/O thread (kf-io)
// unless a comment says otherwise, so it needs no locks; other threads reach it through
// asio::post / co_spawn. Asio lives only in this header and the .cpp files that include it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/asio.hpp"
#include "common/clock.hpp"
#include "common/scratch_pool.hpp"
#include "driver/driver.hpp"
#include "engine/collective.hpp"
#include "kf/common/error.hpp"
#include "kf/peer.hpp"
#include "mailbox/mailbox.hpp"
#include "mailbox/request.hpp"
#include "mesh/link.hpp"
#include "transport/frame.hpp"

namespace kf::detail {

class PeerImpl {
 public:
  explicit PeerImpl(PeerOptions opts);
  ~PeerImpl();

  // ---- called from user threads ----
  Endpoint endpoint() const { return self_; }
  void start(const Cluster& c);
  void update(const Cluster& c);
  std::vector<Endpoint> lost_peers();
  /// Checks a collective's arguments and hands it to the backend of its buffers' device
  /// (backend/submit.cpp).
  Handle submit(std::shared_ptr<CollCtx> ctx);
  /// Completes `c` at once with invalid_argument and `why`; its handle.
  Handle fail_request(CollCtx& c, const std::string& why);
  /// What is wrong with a collective's arguments, or nothing.
  std::string check_arguments(const CollCtx& c) const;
  Handle invite(const Endpoint& to, std::string payload);
  std::optional<Invitation> wait_invitation(std::chrono::milliseconds timeout);
  Algorithm resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept;

  // Immutable after start() (set before any collective is submitted).
  Cluster cluster_;
  int rank_ = 0;
  // Every worker on this host and the default transport: `auto` prices messages by
  // coll::kSameHostLink instead of the TCP-sized defaults.
  bool same_host_link_ = false;
  std::shared_ptr<const std::vector<int>> rank_to_peer_;

  // ---- I/O thread only ----
  Cluster io_cluster_;  // the I/O thread's copy of the current cluster
  int io_rank_ = 0;
  asio::any_io_executor ex() { return ioc_.get_executor(); }
  int peer_index(const Endpoint& ep);
  /// Accepts connections on `acceptor` (TCP or Unix-domain) and serves each.
  template <typename Acceptor>
  awaitable<void> accept_loop(Acceptor& acceptor);
  /// Reads an accepted connection's frames until it ends. `from` names the remote end in logs
  /// until the handshake tells who it is.
  awaitable<void> serve_incoming(std::shared_ptr<Incoming> in, std::string from);
  /// The acceptor's handshake: challenge, hello (which must prove the job token), welcome; sets
  /// in.peer.
  awaitable<std::error_code> accept_handshake(Incoming& in, std::string& why);
  /// Runs the handshake within the connect timeout; a connection that fails it is closed.
  awaitable<bool> admit(Incoming& in, const std::string& from);
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
  /// Whether connections to `ep` try the Unix-domain socket first (not Transport::tcp).
  bool same_host(const Endpoint& ep) const;
  /// Whether `ep` is on this host: the same host string, or both loopback addresses. Any thread.
  bool on_this_host(const Endpoint& ep) const;
  /// Connects out.sock to the peer: its Unix-domain socket when it is on this host, else TCP.
  awaitable<boost::system::error_code> connect(Outgoing& out, const Endpoint& ep);
  awaitable<void> run_outgoing(std::shared_ptr<Outgoing> out);
  awaitable<std::error_code> dial(Outgoing& out);
  awaitable<std::error_code> read_exact(Incoming& in, std::byte* dst, std::size_t n);
  /// The next n payload bytes of the frame being read, into dst (from the socket, or copied
  /// from the sender's memory for a single-copy frame).
  awaitable<std::error_code> read_payload(Incoming& in, PayloadSource& src, std::byte* dst,
                                          std::size_t n, std::string& why);
  /// Reads the frame's payload into a posted receive or, when none is posted, into the
  /// unexpected-message buffer. Returns an error that ends the connection.
  awaitable<std::error_code> receive_data(Incoming& in, int peer, const transport::FrameHeader& h,
                                          const std::string& name, PayloadSource& src,
                                          std::string& why);
  awaitable<std::error_code> write_frame(Outgoing& out, SendReq& req);
  /// A small data frame to a connection whose writer is idle: written straight into the socket
  /// without blocking, saving the hand-off to the writer coroutine. Returns the bytes of the
  /// frame (header, name, payload) that went; the caller queues the rest.
  std::size_t write_now(Outgoing& out, const transport::HeaderBytes& header,
                        std::string_view name, const std::byte* data, std::size_t bytes);

  // ---- shared-memory rings (transport/tcp/connections.cpp) ----
  /// Dialer: creates a ring and offers it over the fresh connection `reader` (still in the
  /// handshake); sets out.ring if the acceptor took it.
  awaitable<std::error_code> offer_ring(Outgoing& out, Incoming& reader, std::string& why);
  /// Acceptor: maps the offered ring and answers; an error ends the connection.
  awaitable<std::error_code> accept_ring(const std::shared_ptr<Incoming>& in,
                                         const std::vector<std::byte>& name, std::string& why);
  /// Takes every record of `in`'s ring whose turn has come and returns how many. A malformed
  /// record closes the connection, with the reason in in.closed_why.
  std::size_t drain_ring(Incoming& in);
  /// Drains every ring; returns the number of records taken.
  std::size_t poll_rings();
  /// asleep: tells every ring's writer that this side is about to sleep, and returns false
  /// (after taking the flag back) if a ring has a record after all. !asleep: awake again.
  bool rings_asleep(bool asleep);
  /// A data frame whose payload is wholly in memory, handed to the mailbox (Mailbox::store);
  /// logs a stale frame it dropped. Returns an error that ends the connection.
  std::error_code store_frame(int peer, const MailKeyView& key, std::span<const std::byte> payload,
                              ScratchPool::Block* owned, std::string& why);

  /// Sends a frame. A data frame that went whole into a shared-memory ring or the socket at once
  /// is complete and gets `sent_`, shared by all such sends: callers only look at a request's
  /// event. With `copy_if_queued`, a frame that is not sent at once is sent from a copy of
  /// `data`, which the caller may then change (otherwise `data` must stay as it is until the
  /// request completes).
  std::shared_ptr<SendReq> post_send(int peer, const transport::FrameHeader& h,
                                     std::string_view name, const std::byte* data,
                                     bool copy_if_queued = false);
  std::shared_ptr<SendReq> post_control(int peer, transport::FrameType t,
                                        std::vector<std::byte> payload);
  /// Posts a receive; with `reduce` the payload is reduced into dst on arrival instead of
  /// copied. One whose frame came before it is complete at once and gets the mailbox's shared
  /// completed receive.
  std::shared_ptr<RecvReq> post_recv(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                     const ReduceOnArrival* reduce = nullptr);
  /// Why a receive from `peer` of `version` can never complete (the peer is gone, the version
  /// broken, or the peer has moved past it), or no error.
  std::error_code receive_refusal(int peer, std::uint64_t version) const;
  void cancel(const std::shared_ptr<SendReq>& r, std::error_code ec);
  awaitable<std::error_code> wait_progress(Event& ev, int peer, std::chrono::milliseconds timeout);
  void force_close(int peer);

  void mark_lost(int peer, std::error_code ec, const std::string& why);
  void mark_departed(int peer);
  /// Records that `peer` sent a frame of `version`; fails its receives of older versions.
  void note_version(int peer, std::uint64_t version);
  /// Fails with `ec` every posted receive whose key satisfies `match` and that is not being
  /// filled right now, and drops the mailbox slots left empty.
  template <typename Match>
  void fail_receives(Match match, std::error_code ec) {
    mailbox_.fail_posted(match, ec);
    fail_express_if(match, ec);
  }
  void break_version(std::error_code ec, const std::string& why);

  // ---- the collective engine (engine/*.cpp) ----
  /// Prepares the work buffer and plan of a submitted collective and runs its lanes as far as
  /// they go without waiting; the rest happens as their events are set. Runs on whichever
  /// thread holds the context (the submitting one, when it is free).
  void start_collective(std::shared_ptr<CollCtx> ctx);
  /// start_collective's first part: the work buffer, the plan and the lanes; completes the
  /// collective itself when it fails or has nothing to do.
  void prepare_collective(const std::shared_ptr<CollCtx>& ctx);
  /// prepare_collective's work buffer, and the plan request's count.
  void prepare_work(CollCtx& c, coll::PlanRequest& req);
  /// Runs a lane until it must wait, fails, or finishes, or has reduced kReduceSliceBytes: then
  /// the rest of it is posted to the context, after whatever else is ready there.
  void advance(LaneRun& l);
  /// Posts the current step's transfers.
  void post_step(LaneRun& l);
  /// Reduces what the current step received, in plan order, taking the bytes it reduces from
  /// `budget`; returns false when the budget ran out first (LaneRun::reduce_x and reduce_done
  /// say where it stopped).
  bool reduce_step(LaneRun& l, std::size_t& budget);
  /// Registers the lane as the waiter of `ev` (a transfer with `peer`), with a deadline.
  void wait_for(LaneRun& l, Event& ev, int peer);
  /// A lane failed (it stops waiting): its transfers are abandoned (a coroutine), then it
  /// counts as finished.
  void fail_lane(LaneRun& l, std::error_code ec, std::string why);
  /// "receiving from PEER: why" (or "sending to"), a failed transfer's reason.
  std::string transfer_failure(bool recv, int peer, std::error_code ec) const;
  /// Fails the lane for its transfer with `peer` (a receive or a send).
  void fail_transfer(LaneRun& l, bool recv, int peer, std::error_code ec);
  void lane_finished(LaneRun& l, std::error_code ec, std::string why);
  /// Completes the collective once its last lane finished.
  void finish_collective(CollCtx& c);
  /// Whether a collective runs as an express allreduce (CollCtx::x_*): an allreduce of at most
  /// PeerOptions::express_bytes, or a barrier, by recursive doubling over a power-of-two number
  /// of workers.
  bool express_eligible(const CollCtx& c) const noexcept;
  /// Starts an eligible collective (its context in `ctx`) as an express allreduce.
  void start_express(const std::shared_ptr<CollCtx>& ctx);
  /// Runs the express allreduce's rounds until it waits for a frame, fails or finishes (then
  /// `c` may be gone).
  void express_step(CollCtx& c);
  /// A frame for a waiting express allreduce: reduced into its work buffer, and the collective
  /// goes on. Returns false when no express allreduce waits for `key`. `conn` is set to
  /// protocol_error (with `why`) when the frame's size is wrong, which ends the connection.
  bool express_take(const MailKeyView& key, std::span<const std::byte> payload,
                    std::error_code& conn, std::string& why);
  /// Fails the express allreduce `c` (then it is gone).
  void fail_express(CollCtx& c, std::error_code ec, std::string why);
  /// Fails with `ec` the waiting express allreduces whose awaited frame's key (peer, version)
  /// satisfies `match`.
  template <typename Match>
  void fail_express_if(Match match, std::error_code ec) {
    if (express_waiting_.empty()) return;
    StepVec<std::shared_ptr<CollCtx>> hit;
    for (CollCtx* c : express_waiting_) {
      if (match(MailKeyView{c->x_peer, c->version, 0, c->name})) hit.push_back(runs_[c->run_index]);
    }
    for (const auto& c : hit) {
      if (c->x_waiting) fail_express(*c, ec, transfer_failure(true, c->x_peer, ec));
    }
  }
  /// Advances the lanes whose events were set; returns how many ran.
  std::size_t run_woken();
  /// Fails the waits whose deadline passed with no word from their peer; re-arms the timer.
  void check_deadlines();
  /// Makes the deadline timer fire by `t` at the latest.
  void arm_deadline(Clock::time_point t);
  /// Cancels a failed step's transfers and waits until none of them touches a buffer.
  awaitable<void> abandon_step(CollCtx& ctx, const StepVec<std::shared_ptr<SendReq>>& sends,
                               const StepVec<int>& send_peer,
                               const StepVec<std::shared_ptr<RecvReq>>& recvs,
                               const StepVec<int>& recv_peer, std::error_code result);
  awaitable<void> shutdown();
  awaitable<void> watchdog();
  void io_loop();
  /// From a user thread: runs the coroutine function `f` on the I/O context and returns what it
  /// returns. Started here when the I/O thread is parked on a waiter's lease (Driver::run_ready).
  template <typename F>
  auto on_io(F&& f) {
    auto done = asio::co_spawn(ioc_, std::forward<F>(f), asio::use_future);
    driver_->run_ready();
    return done.get();
  }


  PeerOptions opts_;
  std::atomic<Algorithm> default_algorithm_;  // the job's default, changeable at run time
  asio::io_context ioc_{1};
  std::shared_ptr<Driver> driver_;
  tcp::acceptor acceptor_;
  // Unix-domain listener of the same-host transport, in the abstract namespace (nothing on
  // disk to clean up), named after the TCP endpoint: local_socket_name(self_).
  local_stream::acceptor local_acceptor_;
  Endpoint self_;
  std::string identity_;
  std::thread io_thread_;

  std::vector<PeerState> peers_;
  std::unordered_map<std::string, int> peer_by_key_;
  Mailbox mailbox_{*driver_, ioc_.get_executor(), opts_.max_unexpected_bytes};
  std::vector<std::shared_ptr<Incoming>> ring_readers_;  // connections with a ring to read
  std::error_code broken_;
  std::string broken_why_;
  bool stopping_ = false;
  ScratchPool scratch_;
  PlanCache plans_;
  // Collectives running (owned here until finished; their lanes point into them), lanes whose
  // event was set and that wait to be advanced, and the one timer for all lanes' deadlines.
  std::vector<std::shared_ptr<CollCtx>> runs_;
  // The completed send that post_send hands out for transfers done at once (a ring write, a
  // frame written whole), instead of allocating one each. Never modified after construction.
  std::shared_ptr<SendReq> sent_;
  std::vector<Waiter*> woken_;  // lanes (LaneRun) whose event was set
  // Express allreduces (in runs_) waiting for a frame: the mailbox offers frames to them first
  // (express_take is its claimer, on while this is not empty).
  std::vector<CollCtx*> express_waiting_;
  /// Puts `c` on express_waiting_.
  void express_start_waiting(CollCtx& c) {
    c.x_waiting = true;
    express_waiting_.push_back(&c);
    mailbox_.set_claiming(true);
  }
  /// Takes `c` off express_waiting_ (it waits no more).
  void express_done_waiting(CollCtx& c) {
    c.x_waiting = false;
    std::erase(express_waiting_, &c);
    mailbox_.set_claiming(!express_waiting_.empty());
  }
  // Counts what this code posts to the context (a writer to wake, a coroutine to start): a
  // collective's start that posted nothing needs no poll of the context after it, which with
  // nothing ready would be an epoll_wait system call on the submitting thread.
  std::uint64_t handlers_posted_ = 0;
  asio::steady_timer deadline_timer_{ioc_};
  Clock::time_point deadline_due_ = Clock::time_point::max();  // when it is armed for
  // Written by the I/O thread, read by Peer::transport_stats from any thread.
  struct Counters {
    std::atomic<std::uint64_t> tcp_bytes{0}, socket_bytes{0}, single_copy_bytes{0},
        single_copy_refused{0}, shm_bytes{0};
    static void add(std::atomic<std::uint64_t>& c, std::uint64_t n) {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  } counters_;

  // Invitations received (I/O thread pushes, a user thread takes).
  std::mutex invite_mu_;
  std::condition_variable invite_cv_;
  std::deque<Invitation> invitations_;
};

}  // namespace kf::detail
