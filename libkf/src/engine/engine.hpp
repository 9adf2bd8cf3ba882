// SPDX-License-Identifier: Apache-2.0
// The host engine: runs collectives on CPU buffers over the mesh. A collective gets its work
// buffer and plan (cached), and its lanes run as state machines that post a step's sends to the
// mesh and its receives to the mailbox, wait on their events, and reduce in plan order. Tiny
// allreduces take the express path, which claims its frames from the mailbox before the mailbox
// looks. Every wait has a deadline, kept by one timer. Thread-safety: I/O context only (checked
// in debug builds).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "common/asio.hpp"
#include "common/scratch_pool.hpp"
#include "driver/driver.hpp"
#include "engine/collective.hpp"
#include "kf/peer.hpp"
#include "mailbox/mailbox.hpp"
#include "mesh/mesh.hpp"

namespace kf::detail {

class Engine {
 public:
  /// Registers as the mailbox's claimer (the express path).
  Engine(const PeerOptions& opts, asio::io_context& ioc, Driver& driver, Mailbox& mailbox,
         Mesh& mesh);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Prepares the work buffer and plan of a submitted collective and runs its lanes as far as
  /// they go without waiting; the rest happens as their events are set. Runs on whichever
  /// thread holds the context (the submitting one, when it is free).
  void start_collective(std::shared_ptr<CollCtx> ctx);
  /// Advances the lanes whose events were set; returns how many ran (Driver::run_woken).
  std::size_t run_woken();

 private:
  // ---- a collective (engine/collective.cpp) ----
  /// start_collective's first part: the work buffer, the plan and the lanes; completes the
  /// collective itself when it fails or has nothing to do.
  void prepare_collective(const std::shared_ptr<CollCtx>& ctx);
  /// prepare_collective's work buffer, and the plan request's count.
  void prepare_work(CollCtx& c, coll::PlanRequest& req);
  /// Completes the collective once its last lane finished.
  void finish_collective(CollCtx& c);

  // ---- lanes (engine/lanes.cpp) ----
  /// Runs a lane until it must wait, fails, or finishes, or has reduced kReduceSliceBytes: then
  /// the rest of it is posted to the context, after whatever else is ready there.
  void advance(LaneRun& l);
  /// Posts the current step's transfers (taking those post_ahead posted), then post_ahead's.
  void post_step(LaneRun& l);
  /// Posts, in plan order, the large receives of the next few steps that land where no step
  /// before theirs reads or writes (LaneRun::ahead); stops at the first that cannot be.
  void post_ahead(LaneRun& l);
  /// Posts one receive of the lane's collective: reduced on arrival when `stream`, else a
  /// reduction into `scratch` or a copy into the work buffer.
  std::shared_ptr<RecvReq> post_receive(LaneRun& l, const coll::Xfer& x, bool stream,
                                        std::byte* scratch);
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
  /// Fails the waits whose deadline passed with no word from their peer; re-arms the timer.
  void check_deadlines();
  /// Makes the deadline timer fire by `t` at the latest.
  void arm_deadline(Clock::time_point t);
  /// Cancels a failed step's transfers and waits until none of them touches a buffer.
  awaitable<void> abandon_step(CollCtx& ctx, const StepVec<std::shared_ptr<SendReq>>& sends,
                               const StepVec<int>& send_peer,
                               const StepVec<std::shared_ptr<RecvReq>>& recvs,
                               const StepVec<int>& recv_peer, std::error_code result);

  // ---- express allreduce (engine/express.cpp) ----
  /// Whether a collective runs as an express allreduce (CollCtx::x_*): an allreduce of at most
  /// PeerOptions::express_bytes, or a barrier, by recursive doubling over a power-of-two number
  /// of workers.
  bool express_eligible(const CollCtx& c) const noexcept;
  /// Starts an eligible collective as an express allreduce. Takes `ctx` over (runs_ holds it
  /// until it finishes, perhaps before this returns), and leaves it as it was only if it
  /// could not be kept (then the collective failed).
  void start_express(std::shared_ptr<CollCtx>&& ctx);
  /// Runs the express allreduce's rounds until it waits for a frame, fails or finishes (then
  /// `c` may be gone).
  void express_step(CollCtx& c);
  /// The mailbox's claimer: a frame for a waiting express allreduce is reduced into its work
  /// buffer, and the collective goes on. Returns false when no express allreduce waits for
  /// `key`. `conn` is set to protocol_error (with `why`) when the frame's size is wrong, which
  /// ends the connection.
  bool express_take(const MailKeyView& key, std::span<const std::byte> payload,
                    std::error_code& conn, std::string& why);
  /// Fails the express allreduce `c` (then it is gone).
  void fail_express(CollCtx& c, std::error_code ec, std::string why);
  /// The mailbox's claimer: fails with `ec` the waiting express allreduces whose awaited frame's
  /// key `match` covers.
  void fail_express_if(const KeyMatch& match, std::error_code ec);
  /// Puts `c` on express_waiting_, and the mailbox asks the claimer first.
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

  const PeerOptions& opts_;
  asio::io_context& ioc_;
  Driver& driver_;
  Mailbox& mailbox_;
  Mesh& mesh_;
  ScratchPool scratch_;
  PlanCache plans_;
  // Collectives running (owned here until finished; their lanes point into them).
  std::vector<std::shared_ptr<CollCtx>> runs_;
  std::vector<Waiter*> woken_;  // lanes (LaneRun) whose event was set
  // Express allreduces (in runs_) waiting for a frame: the mailbox offers frames to them first.
  std::vector<CollCtx*> express_waiting_;
  // The one timer for all lanes' deadlines, and when it is armed for.
  asio::steady_timer deadline_timer_{ioc_};
  Clock::time_point deadline_due_ = Clock::time_point::max();
};

}  // namespace kf::detail
