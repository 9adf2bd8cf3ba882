// SPDX-License-Identifier: Apache-2.0
// Runs a collective's plan over the peer's connections: prepares the work buffer, runs the
// plan's lanes concurrently, reduces received data in plan order (so every worker computes
// every element with the same grouping), and completes the handle. A failed step cancels what
// it can and waits for transfers already touching the caller's buffers, so no buffer is used
// after the handle completes. Tiny allreduces take the express path (below) instead.
#include <openssl/evp.h>

#include <bit>

#include "kf/coll/cost_model.hpp"
#include "kf/common/log.hpp"
#include "peer_impl.hpp"

namespace kf::detail {

namespace {

constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

std::array<std::byte, 64> consensus_digest(const Buffer& b) {
  // [sha256 | length | ~sha256 | ~length]: a min-allreduce over this gives min and ~max of the
  // digest at once; they agree exactly when every worker passed the same bytes.
  std::array<std::byte, 64> out{};
  unsigned int len = 0;
  EVP_Digest(b.data, b.bytes(), reinterpret_cast<unsigned char*>(out.data()), &len, EVP_sha256(),
             nullptr);
  const std::uint64_t n = b.bytes();
  std::memcpy(out.data() + 32 - 8, &n, 8);  // the digest's last 8 bytes make room for the length
  for (std::size_t i = 0; i < 32; ++i) out[32 + i] = ~out[i];
  return out;
}

}  // namespace

namespace {

// Receives of at least this size that are a step's only reduction are reduced on arrival.
constexpr std::size_t kStreamReduceMinBytes = 64 * 1024;
// The most a lane reduces in one go before it lets the context run what else is ready
// (PeerImpl::advance). Without a bound a star or tree root reduced every peer's whole buffer
// in one handler, and sent no heartbeat meanwhile: 2 x 3.6 MB took 150-400 ms under TSan on
// 2 cores, enough, with the heartbeat interval on top, for its peers to count it lost. 1 MiB
// takes about 0.2 ms here at release speed, against a post of about 1 us.
constexpr std::size_t kReduceSliceBytes = 1 << 20;
// Out-of-place allreduces up to this size copy the send buffer into the receive buffer up front
// instead of filling it lazily (CollCtx::lazy_src).
constexpr std::size_t kEagerFillBytes = 256;

bool overlaps(const coll::Xfer& a, const coll::Xfer& b) {
  return a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

}  // namespace

namespace {

// Copies the parts of [off, off+count) of an out-of-place collective's work buffer that are
// still only in the send buffer.
void fill(CollCtx& c, std::size_t es, std::size_t off, std::size_t count) {
  if (!c.lazy_src) return;
  c.filled.for_gaps(off, off + count, [&](std::size_t b, std::size_t e) {
    std::memcpy(c.work + b * es, c.lazy_src + b * es, (e - b) * es);
  });
  c.filled.add(off, off + count);
}

std::string label(const CollCtx& c) { return std::string(to_string(c.op)) + " '" + c.name + "'"; }

// Why a peer that a timed-out wait depended on counts as lost.
std::string no_progress(std::chrono::milliseconds timeout) {
  return "no progress for " + std::to_string(timeout.count()) + " ms";
}

}  // namespace

void PeerImpl::post_step(LaneRun& l) {
  CollCtx& c = *l.coll;
  const coll::Step& st = l.lane->steps[l.step];
  const DType dt = c.send.dtype;
  const std::size_t es = dtype_bytes(dt);
  l.sends.clear();
  l.recvs.clear();
  l.send_peer.clear();
  l.recv_peer.clear();
  l.reduce_x = l.reduce_done = l.reduce_sc = 0;
  // A step's only reduction, into a range no send of the step reads, can reduce on arrival.
  l.stream = nullptr;
  int reductions = 0;
  for (const auto& x : st.xfers) {
    if (x.kind == coll::XferKind::recv_reduce) {
      ++reductions;
      l.stream = &x;
    }
  }
  if (reductions != 1 || l.stream->count * es < kStreamReduceMinBytes) l.stream = nullptr;
  for (const auto& x : st.xfers) {
    if (l.stream && x.kind == coll::XferKind::send && overlaps(x, *l.stream)) l.stream = nullptr;
  }
  std::size_t sc = 0;
  for (const auto& x : st.xfers) {
    const int peer = (*c.rank_to_peer)[static_cast<std::size_t>(x.peer)];
    std::byte* at = c.work + x.offset * es;
    if (x.kind == coll::XferKind::send) {
      const std::byte* from = at;
      if (c.lazy_src && c.filled.disjoint(x.offset, x.offset + x.count)) {
        from = c.lazy_src + x.offset * es;  // untouched so far: send straight from the input
      } else {
        fill(c, es, x.offset, x.count);
      }
      transport::FrameHeader h;
      h.type = transport::FrameType::data;
      h.cluster_version = c.version;
      h.tag = l.tag;
      h.name_bytes = static_cast<std::uint32_t>(c.name.size());
      h.payload_bytes = x.count * es;
      l.sends.push_back(post_send(peer, h, c.name, from));
      l.send_peer.push_back(peer);
      continue;
    }
    const MailKeyView key{peer, c.version, l.tag, c.name};
    if (&x == l.stream) {
      ReduceOnArrival how;
      how.dtype = dt;
      how.op = c.opts.op;
      if (c.lazy_src && c.filled.disjoint(x.offset, x.offset + x.count)) {
        how.src = c.lazy_src + x.offset * es;
      } else {
        fill(c, es, x.offset, x.count);
      }
      l.recvs.push_back(post_recv(key, at, x.count * es, &how));
    } else if (x.kind == coll::XferKind::recv_reduce) {
      l.recvs.push_back(post_recv(key, l.scratch.data.get() + sc, x.count * es));
      sc += x.count * es;
    } else {
      l.recvs.push_back(post_recv(key, at, x.count * es));
    }
    l.recv_peer.push_back(peer);
  }
}

bool PeerImpl::reduce_step(LaneRun& l, std::size_t& budget) {
  // What was received into scratch is reduced in plan order (deterministic); then the ranges
  // of the work buffer that now hold data are recorded. A transfer's range is recorded as
  // filled only once it is reduced whole: until then each slice of it chooses the same way
  // between reducing from the send buffer and reducing into the work buffer (the lane's
  // ranges are its own, so nothing else fills them meanwhile).
  CollCtx& c = *l.coll;
  const coll::Step& st = l.lane->steps[l.step];
  const DType dt = c.send.dtype;
  const std::size_t es = dtype_bytes(dt);
  for (; l.reduce_x < st.xfers.size(); ++l.reduce_x, l.reduce_done = 0) {
    const auto& x = st.xfers[l.reduce_x];
    if (x.kind == coll::XferKind::send) continue;
    if (x.kind == coll::XferKind::recv_reduce && &x != l.stream) {
      const bool from_src = c.lazy_src && c.filled.disjoint(x.offset, x.offset + x.count);
      if (!from_src) fill(c, es, x.offset, x.count);
      while (l.reduce_done < x.count) {
        const std::size_t n = std::min(x.count - l.reduce_done, budget / es);
        if (n == 0) return false;
        const std::size_t off = x.offset + l.reduce_done;
        const std::byte* in = l.scratch.data.get() + l.reduce_sc + l.reduce_done * es;
        if (from_src) {
          reduce_to(c.work + off * es, c.lazy_src + off * es, in, n, dt, c.opts.op);
        } else {
          reduce_into(c.work + off * es, in, n, dt, c.opts.op);
        }
        l.reduce_done += n;
        budget -= n * es;
      }
      l.reduce_sc += x.count * es;
    }
    if (c.lazy_src) c.filled.add(x.offset, x.offset + x.count);
  }
  return true;
}

void PeerImpl::advance(LaneRun& l) {
  try {
    const auto& steps = l.lane->steps;
    std::size_t budget = kReduceSliceBytes;
    while (l.step < steps.size()) {
      if (!l.posted) {
        post_step(l);
        l.posted = true;
        // A receive whose frame is in a shared-memory ring already is taken now: then it
        // needs no wait at all.
        if (!ring_readers_.empty() &&
            std::any_of(l.recvs.begin(), l.recvs.end(), [](const auto& r) { return !r->ev.done; })) {
          poll_rings();
        }
      }
      // The first failure fails the lane; the first unfinished transfer is waited for. (What
      // is done already, such as a send that went into a ring, costs nothing here.)
      for (std::size_t i = 0; i < l.recvs.size(); ++i) {
        Event& ev = l.recvs[i]->ev;
        if (!ev.done) return wait_for(l, ev, l.recv_peer[i]);
        if (ev.ec) return fail_transfer(l, true, l.recv_peer[i], ev.ec);
      }
      for (std::size_t i = 0; i < l.sends.size(); ++i) {
        Event& ev = l.sends[i]->ev;
        if (!ev.done) return wait_for(l, ev, l.send_peer[i]);
        if (ev.ec) return fail_transfer(l, false, l.send_peer[i], ev.ec);
      }
      if (!reduce_step(l, budget)) {
        // The rest after what is ready in the context (a heartbeat, a frame to read). The lane
        // waits on nothing meanwhile; its collective stays in runs_ until the lane finishes.
        ++handlers_posted_;
        driver_->context_due = true;
        asio::post(ex(), [this, &l, keep = runs_[l.coll->run_index]] { advance(l); });
        return;
      }
      l.posted = false;
      ++l.step;
    }
  } catch (const std::exception& e) {
    // Nothing here throws but allocation and the like: the collective fails, the peer goes on.
    KF_LOG(err, "coll", "{} raised: {}", label(*l.coll), e.what());
    return fail_lane(l, make_error_code(errc::protocol_error), e.what());
  }
  lane_finished(l, {}, {});
}

void PeerImpl::wait_for(LaneRun& l, Event& ev, int peer) {
  l.waiting_on = &ev;
  ev.waiter = &l;
  l.wait_peer = peer;
  l.deadline = Clock::now() + l.coll->timeout;
  arm_deadline(l.deadline);
}

void PeerImpl::arm_deadline(Clock::time_point t) {
  if (t >= deadline_due_) return;
  deadline_due_ = t;
  deadline_timer_.expires_at(t);
  deadline_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) check_deadlines();
  });
}

// As a coroutine's wait used to: a wait times out once its deadline passed and its peer has
// been silent (sent nothing, taken nothing) for the collective's timeout.
void PeerImpl::check_deadlines() {
  deadline_due_ = Clock::time_point::max();
  const auto now = Clock::now();
  auto next = Clock::time_point::max();
  StepVec<LaneRun*> expired;
  // Whether a wait on `peer` with this deadline has expired; if not, moves the deadline to the
  // peer's last sign of life plus the timeout, and keeps the earliest deadline in `next`.
  auto expired_wait = [&](Clock::time_point& deadline, int peer, std::chrono::milliseconds t) {
    if (deadline <= now) {
      const auto& ps = peers_[static_cast<std::size_t>(peer)];
      const auto last = std::max(ps.last_rx, ps.last_tx) + t;
      if (now >= last) return true;
      deadline = last;
    }
    next = std::min(next, deadline);
    return false;
  };
  StepVec<std::shared_ptr<CollCtx>> express_expired;
  for (CollCtx* c : express_waiting_) {
    if (expired_wait(c->x_deadline, c->x_peer, c->timeout)) {
      express_expired.push_back(runs_[c->run_index]);
    }
  }
  for (const auto& c : runs_) {
    for (auto& l : c->lanes) {
      if (l.waiting_on && expired_wait(l.deadline, l.wait_peer, c->timeout)) expired.push_back(&l);
    }
  }
  for (LaneRun* l : expired) {
    const bool recv = std::any_of(l->recvs.begin(), l->recvs.end(),
                                  [&](const auto& r) { return &r->ev == l->waiting_on; });
    fail_transfer(*l, recv, l->wait_peer, make_error_code(errc::timeout));
  }
  // As abandon_step does for a lane: the silent peer counts as lost (everyone is told), then
  // the collective fails.
  for (const auto& c : express_expired) {
    if (!c->x_waiting) continue;
    const int peer = c->x_peer;
    const auto timeout = make_error_code(errc::timeout);
    mark_lost(peer, timeout, no_progress(c->timeout));
    if (c->x_waiting) fail_express(*c, timeout, transfer_failure(true, peer, timeout));
  }
  if (next != Clock::time_point::max()) arm_deadline(next);
}

std::size_t PeerImpl::run_woken() {
  if (woken_.empty()) return 0;
  // Advancing a lane may wake others (its sends and receives, its rings): they are appended
  // and run in this same pass. A woken lane is unfinished, so its collective is alive.
  std::size_t i = 0;
  for (; i < woken_.size(); ++i) advance(static_cast<LaneRun&>(*woken_[i]));
  woken_.clear();
  return i;
}

std::string PeerImpl::transfer_failure(bool recv, int peer, std::error_code ec) const {
  return (recv ? "receiving from " : "sending to ") + peers_[static_cast<std::size_t>(peer)].key +
         ": " + ec.message();
}

void PeerImpl::fail_transfer(LaneRun& l, bool recv, int peer, std::error_code ec) {
  fail_lane(l, ec, transfer_failure(recv, peer, ec));
}

void PeerImpl::fail_lane(LaneRun& l, std::error_code ec, std::string why) {
  l.stop_waiting();
  ++handlers_posted_;
  std::shared_ptr<CollCtx> keep = runs_[l.coll->run_index];
  asio::co_spawn(
      ex(),
      [this, &l, keep = std::move(keep), ec, why = std::move(why)]() mutable -> awaitable<void> {
        co_await abandon_step(*keep, l.sends, l.send_peer, l.recvs, l.recv_peer, ec);
        lane_finished(l, ec, std::move(why));
      },
      asio::detached);
}

void PeerImpl::lane_finished(LaneRun& l, std::error_code ec, std::string why) {
  scratch_.release(std::move(l.scratch));
  CollCtx& c = *l.coll;
  if (ec && !c.first) {
    c.first = ec;
    c.why = std::move(why);
  }
  if (--c.lanes_left == 0) finish_collective(c);
}

awaitable<void> PeerImpl::abandon_step(CollCtx& ctx,
                                       const StepVec<std::shared_ptr<SendReq>>& sends,
                                       const StepVec<int>& send_peer,
                                       const StepVec<std::shared_ptr<RecvReq>>& recvs,
                                       const StepVec<int>& recv_peer, std::error_code result) {
  // A peer that stops making progress counts as lost; everyone else is told.
  if (result == make_error_code(errc::timeout)) {
    const std::string stall = no_progress(ctx.timeout);
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      if (!recvs[i]->ev.done) mark_lost(recv_peer[i], result, stall);
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (!sends[i]->ev.done) mark_lost(send_peer[i], result, stall);
    }
  }
  for (auto& r : recvs) mailbox_.cancel(r, result);
  for (auto& s : sends) cancel(s, result);
  // Transfers already touching the caller's buffers finish or fail on their own (a broken
  // connection's coroutine completes them); close the connection if they do not.
  auto drain = [&](Event& ev, int peer) -> awaitable<void> {
    if (ev.done) co_return;
    if (co_await wait_progress(ev, peer, ctx.timeout)) {
      force_close(peer);
      ev.timer().expires_at(Clock::time_point::max());
      while (!ev.done) co_await ev.timer().async_wait(kTuple);
    }
  };
  for (std::size_t i = 0; i < recvs.size(); ++i) co_await drain(recvs[i]->ev, recv_peer[i]);
  for (std::size_t i = 0; i < sends.size(); ++i) co_await drain(sends[i]->ev, send_peer[i]);
}

void PeerImpl::start_collective(std::shared_ptr<CollCtx> ctx) {
  CollCtx& c = *ctx;
  try {
    prepare_collective(ctx);
  } catch (const std::exception& e) {
    // Allocation and the like (a bad plan request fails in prepare_collective): the collective
    // fails, the peer goes on.
    KF_LOG(err, "coll", "{} raised: {}", label(c), e.what());
    c.first = make_error_code(errc::protocol_error);
    c.why = e.what();
    return finish_collective(c);
  }
  if (c.state->ready.load(std::memory_order_relaxed) || c.lanes_left == 0) return;
  // Lanes run concurrently; the collective finishes when the last lane does. (`ctx` keeps it
  // alive here even when its last lane finishes in this loop.)
  for (auto& l : c.lanes) advance(l);
}

void PeerImpl::prepare_collective(const std::shared_ptr<CollCtx>& ctx) {
  CollCtx& c = *ctx;
  if (broken_) {
    c.state->complete(broken_, label(c) + ": cluster version " + std::to_string(c.version) +
                                   " is broken: " + broken_why_);
    return;
  }
  if (express_eligible(c)) return start_express(ctx);
  const std::size_t es = dtype_bytes(c.send.dtype);
  const auto p = static_cast<std::size_t>(c.size);
  coll::PlanRequest req;
  req.op = c.op;
  req.algorithm = c.algorithm;
  req.rank = c.rank;
  req.size = c.size;
  req.root = c.opts.root;
  req.max_xfer_count = std::max<std::size_t>(1, opts_.max_frame_bytes / es);

  // Prepare the work buffer (see coll/plan/plan.hpp for each operation's layout).
  switch (c.op) {
    case CollOp::allreduce:
      req.count = c.send.count;
      c.work = static_cast<std::byte*>(c.recv.data);
      if (c.send.data != c.recv.data && c.send.bytes() > 0) {
        // A small vector is copied at once: tracking which of its ranges were filled costs
        // more than the copy.
        if (c.send.bytes() <= kEagerFillBytes) {
          std::memmove(c.work, c.send.data, c.send.bytes());
        } else {
          c.lazy_src = static_cast<const std::byte*>(c.send.data);
        }
      }
      break;
    case CollOp::broadcast:
      req.count = c.send.count;
      c.work = static_cast<std::byte*>(c.send.data);
      break;
    case CollOp::allgather:
      req.count = c.send.count;
      c.work = static_cast<std::byte*>(c.recv.data);
      if (c.send.bytes() > 0) {
        std::memmove(c.work + static_cast<std::size_t>(c.rank) * c.send.bytes(), c.send.data,
                     c.send.bytes());
      }
      break;
    case CollOp::gather:
    case CollOp::reduce_scatter:
      req.count = c.op == CollOp::gather ? c.send.count : c.recv.count;
      if (c.op == CollOp::gather && c.rank == c.opts.root) {
        c.work = static_cast<std::byte*>(c.recv.data);
      } else {
        // Pooled, so that it is not mapped and page-faulted afresh on every call (a
        // p-times-the-result buffer for reduce-scatter).
        c.pooled = scratch_.acquire(req.count * p * es);
        c.work = c.pooled.data.get();
      }
      if (c.op == CollOp::gather && c.send.bytes() > 0) {
        std::memmove(c.work + static_cast<std::size_t>(c.rank) * c.send.bytes(), c.send.data,
                     c.send.bytes());
      } else if (c.op == CollOp::reduce_scatter && c.send.bytes() > 0) {
        // As for an out-of-place allreduce: blocks are sent from, and reduced out of, the send
        // buffer until the plan first writes them.
        c.lazy_src = static_cast<const std::byte*>(c.send.data);
      }
      break;
    case CollOp::barrier:
      req.count = 1;
      c.work = &c.barrier_byte;
      c.send.dtype = DType::u8;
      c.opts.op = ReduceOp::max;
      break;
    case CollOp::consensus:
      c.digest = consensus_digest(c.send);
      req.count = c.digest.size();
      c.work = c.digest.data();
      c.send.dtype = DType::u8;
      c.opts.op = ReduceOp::min;
      break;
  }
  c.count = req.count;
  req.rd_max_count = coll::kRecursiveDoublingMaxBytes / es;
  req.lanes = coll::default_lanes(c.op, c.algorithm, req.count * es, c.size);
  try {
    c.plan = plans_.get(req);
  } catch (const std::invalid_argument& e) {
    c.first = make_error_code(errc::invalid_argument);
    c.why = e.what();
    return finish_collective(c);
  }
  const auto& lanes = c.plan->lanes;
  c.lanes.resize(lanes.size());
  c.lanes_left = lanes.size();
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    LaneRun& l = c.lanes[i];
    l.woken = &woken_;
    l.coll = &c;
    l.lane = &lanes[i];
    l.tag = static_cast<std::uint32_t>(i);
    std::size_t scratch_bytes = 0;  // the most any step receives to reduce
    for (const auto& st : l.lane->steps) {
      std::size_t n = 0;
      for (const auto& x : st.xfers) {
        if (x.kind == coll::XferKind::recv_reduce) n += x.count * es;
      }
      scratch_bytes = std::max(scratch_bytes, n);
    }
    l.scratch = scratch_.acquire(scratch_bytes);
  }
  c.run_index = runs_.size();
  runs_.push_back(ctx);
  if (lanes.empty()) finish_collective(c);
}

// ---- express allreduce ---------------------------------------------------------------------
//
// A tiny allreduce costs mostly bookkeeping: a plan, a lane, a request and a mailbox slot per
// transfer (about 2.5k instructions for 4 bytes over the rings, callgrind). Recursive doubling
// over a power-of-two number of workers needs none of them: each round sends the work buffer to
// one partner and reduces the partner's frame into it. Frames are offered to a waiting express
// allreduce before the mailbox (store_frame); one that came before its round is taken from the
// mailbox. The frames are the plan's (tag 0, the whole vector each round), so a worker that
// runs the same collective through the plan interoperates, and both partners reduce the same
// two operands (commutative): their results stay bitwise identical.

bool PeerImpl::express_eligible(const CollCtx& c) const noexcept {
  if (c.algorithm != Algorithm::rhd) return false;
  // A power of two; not std::has_single_bit, which without -mpopcnt is a call into libgcc.
  if (c.size < 2 || (c.size & (c.size - 1)) != 0) return false;
  // A barrier is an allreduce (max) of one byte, as prepare_collective sets it up.
  if (c.op == CollOp::barrier) return opts_.express_bytes >= 1 && opts_.max_frame_bytes >= 1;
  if (c.op != CollOp::allreduce) return false;
  const std::size_t bytes = c.send.bytes();
  if (bytes == 0 || bytes > opts_.express_bytes || bytes > opts_.max_frame_bytes) return false;
  // The plan would run recursive doubling in one lane too (see coll::make_plan).
  return c.send.count <= coll::kRecursiveDoublingMaxBytes / dtype_bytes(c.send.dtype) &&
         coll::default_lanes(c.op, c.algorithm, bytes, c.size) == 1;
}

void PeerImpl::start_express(const std::shared_ptr<CollCtx>& ctx) {
  CollCtx& c = *ctx;
  if (c.op == CollOp::barrier) {
    c.count = 1;
    c.work = &c.barrier_byte;
    c.send.dtype = DType::u8;
    c.opts.op = ReduceOp::max;
  } else {
    c.count = c.send.count;
    c.work = static_cast<std::byte*>(c.recv.data);
  }
  c.run_index = runs_.size();
  runs_.push_back(ctx);
  c.x_dist = 1;
  express_step(c);
  // The partner's frame may be in a ring already: taken now, it needs no wait at all.
  if (!express_waiting_.empty() && !ring_readers_.empty()) poll_rings();
}

void PeerImpl::express_step(CollCtx& c) {
  const std::size_t bytes = c.count * dtype_bytes(c.send.dtype);
  while (c.x_dist < c.size) {
    const int peer = (*c.rank_to_peer)[static_cast<std::size_t>(c.rank ^ c.x_dist)];
    const auto& ps = peers_[static_cast<std::size_t>(peer)];
    transport::FrameHeader h;
    h.type = transport::FrameType::data;
    h.cluster_version = c.version;
    h.tag = 0;
    h.name_bytes = static_cast<std::uint32_t>(c.name.size());
    h.payload_bytes = bytes;
    // From a copy if queued: the work buffer changes in the next round, before the writer runs.
    // An out-of-place allreduce's first round sends from the send buffer and copies it into
    // the result afterwards: the copy's cache misses (the destination, often cold) then overlap
    // the wait for the partner instead of delaying the frame.
    const std::byte* data = c.work;
    if (c.x_dist == 1 && c.op == CollOp::allreduce && c.send.data != c.recv.data) {
      data = static_cast<const std::byte*>(c.send.data);
    }
    post_send(peer, h, c.name, data, /*copy_if_queued=*/true);
    if (data != c.work) std::memmove(c.work, data, bytes);
    // The frame came before this round: reduced at once.
    if (auto taken = mailbox_.take_early(MailKeyView{peer, c.version, 0, c.name})) {
      const std::size_t got = taken->bytes;
      if (got == bytes) reduce_into(c.work, taken->data(), c.count, c.send.dtype, c.opts.op);
      mailbox_.recycle(std::move(taken->block));
      if (got != bytes) {
        return fail_express(c, make_error_code(errc::protocol_error),
                            "receiving from " + ps.key + ": a frame of " + std::to_string(got) +
                                " bytes, " + std::to_string(bytes) + " expected");
      }
      c.x_dist <<= 1;
      continue;
    }
    // Refused as post_recv refuses a receive that can never complete.
    if (const std::error_code ec = receive_refusal(peer, c.version)) {
      return fail_express(c, ec, transfer_failure(true, peer, ec));
    }
    c.x_peer = peer;
    express_start_waiting(c);
    c.x_deadline = Clock::now() + c.timeout;
    arm_deadline(c.x_deadline);
    return;
  }
  finish_collective(c);
}

bool PeerImpl::express_take(const MailKeyView& key, std::span<const std::byte> payload,
                            std::error_code& conn, std::string& why) {
  if (key.tag != 0) return false;
  CollCtx* found = nullptr;
  for (CollCtx* c : express_waiting_) {
    if (c->x_peer == key.peer && c->version == key.version && c->name == key.name) {
      found = c;
      break;
    }
  }
  if (!found) return false;
  CollCtx& c = *found;
  express_done_waiting(c);
  const std::size_t bytes = c.count * dtype_bytes(c.send.dtype);
  if (payload.size() != bytes) {
    // As for a posted receive: the frame's sender broke the protocol; the connection ends.
    why = wrong_size(c.name, payload.size(), bytes);
    conn = make_error_code(errc::protocol_error);
    fail_express(c, conn, why);
    return true;
  }
  // A socket frame delivered from the read-ahead buffer sits wherever its header and name left
  // it; the reduction reads whole elements, so a misaligned payload is copied first (ring
  // records are aligned).
  const std::size_t align = dtype_bytes(c.send.dtype);
  if (reinterpret_cast<std::uintptr_t>(payload.data()) % align != 0) {
    ScratchPool::Block tmp = scratch_.acquire(bytes);
    std::memcpy(tmp.data.get(), payload.data(), bytes);
    reduce_into(c.work, tmp.data.get(), c.count, c.send.dtype, c.opts.op);
    scratch_.release(std::move(tmp));
  } else {
    reduce_into(c.work, payload.data(), c.count, c.send.dtype, c.opts.op);
  }
  c.x_dist <<= 1;
  express_step(c);
  return true;
}

void PeerImpl::fail_express(CollCtx& c, std::error_code ec, std::string why) {
  if (c.x_waiting) express_done_waiting(c);
  if (!c.first) {
    c.first = ec;
    c.why = std::move(why);
  }
  finish_collective(c);
}

void PeerImpl::finish_collective(CollCtx& c) {
  // The collective leaves runs_ now and is destroyed when `keep` goes, at the end.
  std::shared_ptr<CollCtx> keep;
  if (c.run_index < runs_.size() && runs_[c.run_index].get() == &c) {
    keep = std::move(runs_[c.run_index]);
    if (c.run_index + 1 != runs_.size()) {
      runs_[c.run_index] = std::move(runs_.back());
      runs_[c.run_index]->run_index = c.run_index;
    }
    runs_.pop_back();
  }
  const std::size_t es = dtype_bytes(c.send.dtype);
  const auto p = static_cast<std::size_t>(c.size);
  std::error_code ec = c.first;
  if (!ec) {
    switch (c.op) {
      case CollOp::allreduce:
        if (c.lazy_src) {  // whatever the plan never touched (e.g. a single worker)
          c.filled.for_gaps(0, c.count, [&](std::size_t b, std::size_t e) {
            std::memcpy(c.work + b * es, c.lazy_src + b * es, (e - b) * es);
          });
        }
        if (c.opts.op == ReduceOp::avg) finish_avg(c.work, c.count, c.send.dtype, p);
        break;
      case CollOp::reduce_scatter:
        if (c.lazy_src) {  // this worker's block, where the plan never wrote it (one worker)
          const std::size_t first = static_cast<std::size_t>(c.rank) * c.recv.count;
          c.filled.for_gaps(first, first + c.recv.count, [&](std::size_t b, std::size_t e) {
            std::memcpy(c.work + b * es, c.lazy_src + b * es, (e - b) * es);
          });
        }
        if (c.opts.op == ReduceOp::avg) {
          finish_avg(c.work + static_cast<std::size_t>(c.rank) * c.recv.bytes(), c.recv.count,
                     c.send.dtype, p);
        }
        if (c.recv.bytes() > 0) {
          std::memcpy(c.recv.data, c.work + static_cast<std::size_t>(c.rank) * c.recv.bytes(),
                      c.recv.bytes());
        }
        break;
      case CollOp::consensus: {
        bool same = true;
        for (std::size_t i = 0; i < 32; ++i) same = same && (c.digest[i] == ~c.digest[32 + i]);
        if (c.agreed) *c.agreed = same;
        break;
      }
      default:
        break;
    }
    scratch_.release(std::move(c.pooled));
    c.state->complete({}, {});
    return;
  }
  scratch_.release(std::move(c.pooled));
  if (ec == make_error_code(errc::timeout) || ec == make_error_code(errc::peer_lost)) {
    if (broken_ && ec != broken_) ec = broken_;
  }
  const std::string msg = label(c) + " (" + std::string(to_string(c.algorithm)) + ", v" +
                          std::to_string(c.version) + ") failed: " +
                          (broken_why_.empty() ? c.why : broken_why_);
  KF_LOG(debug, "coll", "{}: {}", identity_, msg);
  c.state->complete(ec, msg);
}

}  // namespace kf::detail
