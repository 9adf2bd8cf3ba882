// SPDX-License-Identifier: Apache-2.0
// A collective in flight (CollCtx) and its lanes (LaneRun), which the engine advances over the
// mesh and the mailbox; and the cache of plans. Thread-safety: I/O context only, except
// CollCtx::state, which a Handle reads from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "coll/plan/plan.hpp"
#include "common/scratch_pool.hpp"
#include "driver/driver.hpp"
#include "engine/range_set.hpp"
#include "kf/peer.hpp"
#include "mailbox/request.hpp"

namespace kf::detail {

/// A step's few transfers: kept inline, so that running a small collective allocates nothing.
struct CollCtx;

template <typename T>
using StepVec = boost::container::small_vector<T, 4>;

/// One lane of a running collective: a state machine, not a coroutine, advanced by whichever
/// thread runs the context (Engine::advance). It posts a step's transfers, waits for them by
/// registering with one unfinished event at a time (Event::waiter; a set event puts the lane on
/// Engine::woken_), and reduces what came. A small collective thus costs no coroutine frame,
/// no resumption through the scheduler, and no timer per wait: deadlines are kept by one timer
/// for all lanes (Engine::check_deadlines).
struct LaneRun : Waiter {
  CollCtx* coll = nullptr;
  const coll::Lane* lane = nullptr;
  std::uint32_t tag = 0;
  std::size_t step = 0;  // the step being run
  bool posted = false;   // the step's transfers are posted
  ScratchPool::Block scratch;
  const coll::Xfer* stream = nullptr;  // the step's receive reduced on arrival, if any
  // How far the step's reduction got (Engine::reduce_step): the transfer, the elements of it
  // reduced, and where in scratch that transfer's data starts.
  std::size_t reduce_x = 0, reduce_done = 0, reduce_sc = 0;
  StepVec<std::shared_ptr<SendReq>> sends;
  StepVec<std::shared_ptr<RecvReq>> recvs;
  StepVec<int> send_peer, recv_peer;
  // Receives of later steps posted before their step (Engine::post_ahead), in plan order: a
  // frame that comes while the lane is still at an earlier step then goes straight to its
  // place instead of being kept and copied once more. `ahead_step` and `ahead_xfer` are the
  // next transfer to consider.
  struct Ahead {
    std::size_t step = 0, xfer = 0;
    std::shared_ptr<RecvReq> req;
    int peer = -1;
  };
  StepVec<Ahead> ahead;
  std::size_t ahead_step = 0, ahead_xfer = 0;
  // While waiting (Waiter::waiting_on): the peer it depends on, and when the wait times out
  // unless that peer was heard from meanwhile.
  int wait_peer = -1;
  Clock::time_point deadline{};

  LaneRun() = default;
  // Moved only while its collective sizes its lanes, before any runs.
  LaneRun(LaneRun&&) = default;
  LaneRun& operator=(LaneRun&&) = default;
  ~LaneRun() { stop_waiting(); }
  /// Leaves the event it waits on, if any, without being woken by it.
  void stop_waiting() noexcept {
    if (waiting_on) waiting_on->waiter = nullptr;
    waiting_on = nullptr;
  }
};

/// One collective in flight.
struct CollCtx {
  CollOp op = CollOp::allreduce;
  std::string name;
  Algorithm algorithm = Algorithm::auto_select;
  CollOptions opts;
  Buffer send, recv;
  bool* agreed = nullptr;
  std::uint64_t version = 0;
  // Out-of-place allreduce and reduce-scatter: the work buffer is filled lazily from `lazy_src`
  // (the send buffer) as the plan first touches each range, instead of one up-front copy.
  const std::byte* lazy_src = nullptr;
  RangeSet filled;
  std::shared_ptr<const std::vector<int>> rank_to_peer;  // the submitting version's, shared
  std::shared_ptr<const std::vector<int>> hosts;         // hierarchical: the host of each rank
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{};
  std::shared_ptr<OpState> state;

  // ---- while it runs (Engine::start_collective to Engine::finish_collective) ----
  std::shared_ptr<const coll::Plan> plan;
  std::size_t count = 0;               // elements of the plan's work buffer per rank block
  std::byte* work = nullptr;           // the plan's work buffer
  ScratchPool::Block pooled;           // the work buffer when the caller's cannot serve
  std::array<std::byte, 64> digest{};  // consensus: the work buffer
  std::byte barrier_byte{1};           // barrier: the work buffer
  boost::container::small_vector<LaneRun, 1> lanes;  // sized once: lanes do not move
  std::size_t lanes_left = 0;
  std::error_code first;  // the first lane failure, and its reason
  std::string why;
  std::size_t run_index = 0;  // in Engine::runs_

  // ---- express: a tiny allreduce run by recursive doubling without plan, lanes or requests
  // (Engine::start_express). The same frames as the plan's, so workers that run the same
  // collective either way interoperate. ----
  int x_dist = 0;          // the current round's distance: the partner is rank ^ x_dist
  int x_peer = -1;         // the partner's peer index while waiting for its frame
  bool x_waiting = false;  // in Engine::express_waiting_
  Clock::time_point x_deadline{};

  // User-provided, so that make_shared's value-initialisation runs the member initialisers only
  // instead of first zeroing all ~900 bytes (most of them the inline lane's storage).
  CollCtx() noexcept {}
  CollCtx(const CollCtx&) = delete;
  CollCtx& operator=(const CollCtx&) = delete;
  /// The last owner is the engine. If it lets go of a collective unfinished (the peer was
  /// destroyed with the collective in flight, and its context with it), the waiter still learns
  /// that the buffers are free again.
  ~CollCtx() { release_waiter(); }
  /// Back to the state of a new CollCtx (make_recycled: collectives take their contexts from a
  /// per-thread cache). Every member is reset here, and every reference dropped but
  /// rank_to_peer's (below).
  void recycle() noexcept {
    release_waiter();
    lanes.clear();  // first, as the destructor would: lanes point into the plan
    op = CollOp::allreduce;
    name.clear();
    algorithm = Algorithm::auto_select;
    opts = CollOptions{};
    send = Buffer{};
    recv = Buffer{};
    agreed = nullptr;
    version = 0;
    lazy_src = nullptr;
    filled = RangeSet{};
    // rank_to_peer stays: the next collective submitted from this cache is most likely of the
    // same cluster version, and finding the same map there saves taking and dropping a
    // reference (two atomic read-modify-writes) per collective. A context in the cache holds
    // at most one map alive after its version has passed.
    hosts.reset();
    rank = 0;
    size = 1;
    timeout = {};
    state.reset();
    plan.reset();
    count = 0;
    work = nullptr;
    pooled = ScratchPool::Block{};
    digest = {};
    barrier_byte = std::byte{1};
    lanes_left = 0;
    first = {};
    why.clear();
    run_index = 0;
    x_dist = 0;
    x_peer = -1;
    x_waiting = false;
    x_deadline = {};
  }

 private:
  void release_waiter() noexcept {
    if (state && !state->ready.load(std::memory_order_acquire)) {
      state->complete(make_error_code(errc::closed),
                      std::string(to_string(op)) + " '" + name +
                          "': the peer was destroyed before the collective finished");
    }
  }
};

/// The plans of the last few distinct requests: a training job repeats the same few collectives
/// (the same buckets, the same control collective) every step, and building a plan costs
/// allocations and more time than a small collective's transfer. I/O thread only.
class PlanCache {
 public:
  std::shared_ptr<const coll::Plan> get(const coll::PlanRequest& r) {
    for (auto& e : entries_) {
      if (same(e.req, r)) return e.plan;
    }
    auto plan = std::make_shared<const coll::Plan>(coll::make_plan(r));  // may throw
    if (entries_.size() < kEntries) {
      entries_.push_back({r, plan});
    } else {
      entries_[next_] = {r, plan};
      next_ = (next_ + 1) % kEntries;
    }
    return plan;
  }

 private:
  static constexpr std::size_t kEntries = 32;
  static bool same(const coll::PlanRequest& a, const coll::PlanRequest& b) noexcept {
    return a.op == b.op && a.algorithm == b.algorithm && a.rank == b.rank && a.size == b.size &&
           a.count == b.count && a.root == b.root && a.lanes == b.lanes &&
           a.max_xfer_count == b.max_xfer_count && a.rd_max_count == b.rd_max_count &&
           (a.hosts == b.hosts || (a.hosts && b.hosts && *a.hosts == *b.hosts));
  }
  struct Entry {
    coll::PlanRequest req;
    std::shared_ptr<const coll::Plan> plan;
  };
  std::vector<Entry> entries_;
  std::size_t next_ = 0;  // the entry replaced next once full (oldest first)
};

}  // namespace kf::detail
