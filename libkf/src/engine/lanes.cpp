// SPDX-License-Identifier: Apache-2.0
// The engine's lanes: each runs its plan lane step by step, posting a step's transfers, waiting
// for them as a Waiter on their events (with one deadline timer for all lanes), and reducing
// what came in plan order, so every worker computes every element with the same grouping. A
// failed step cancels what it can and waits for transfers already touching the caller's
// buffers, so no buffer is used after the handle completes.
#include "engine/engine.hpp"
#include "engine/engine_util.hpp"
#include "kf/common/log.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

namespace {

// Receives of at least this size that are a step's only reduction are reduced on arrival.
constexpr std::size_t kStreamReduceMinBytes = 64 * 1024;
// The most a lane reduces in one go before it lets the context run what else is ready
// (Engine::advance). Without a bound a star or tree root reduced every peer's whole buffer
// in one handler, and sent no heartbeat meanwhile: 2 x 3.6 MB took 150-400 ms under TSan on
// 2 cores, enough, with the heartbeat interval on top, for its peers to count it lost. 1 MiB
// takes about 0.2 ms here at release speed, against a post of about 1 us.
constexpr std::size_t kReduceSliceBytes = 1 << 20;

// Receives posted before their step (Engine::post_ahead) are at most this many steps ahead, and
// only large ones: a small frame that comes early costs less to copy once more than to track.
constexpr std::size_t kAheadSteps = 8;

// The step's receive that is reduced on arrival, if any: its only reduction, into a range no
// send of the step reads, of at least kStreamReduceMinBytes.
const coll::Xfer* stream_of(const coll::Step& st, std::size_t es) {
  const coll::Xfer* x = coll::sole_reduction(st);
  return x != nullptr && x->count * es >= kStreamReduceMinBytes ? x : nullptr;
}

}  // namespace

std::shared_ptr<RecvReq> Engine::post_receive(LaneRun& l, const coll::Xfer& x, bool stream,
                                              std::byte* scratch) {
  CollCtx& c = *l.coll;
  const std::size_t es = dtype_bytes(c.send.dtype);
  const int peer = (*c.rank_to_peer)[static_cast<std::size_t>(x.peer)];
  const MailKeyView key{peer, c.version, l.tag, c.name};
  std::byte* at = c.work + x.offset * es;
  if (stream) {
    ReduceOnArrival how;
    how.dtype = c.send.dtype;
    how.op = c.opts.op;
    if (c.lazy_src && c.filled.disjoint(x.offset, x.offset + x.count)) {
      how.src = c.lazy_src + x.offset * es;
    } else {
      fill(c, es, x.offset, x.count);
    }
    return mesh_.post_recv(key, at, x.count * es, &how);
  }
  if (x.kind == coll::XferKind::recv_reduce) return mesh_.post_recv(key, scratch, x.count * es);
  return mesh_.post_recv(key, at, x.count * es);
}

void Engine::post_step(LaneRun& l) {
  KF_DCHECK_IO(driver_);
  CollCtx& c = *l.coll;
  const coll::Step& st = l.lane->steps[l.step];
  const std::size_t es = dtype_bytes(c.send.dtype);
  l.sends.clear();
  l.recvs.clear();
  l.send_peer.clear();
  l.recv_peer.clear();
  l.reduce_x = l.reduce_done = l.reduce_sc = 0;
  // A step's only reduction, into a range no send of the step reads, can reduce on arrival.
  l.stream = stream_of(st, es);
  std::size_t sc = 0;
  for (std::size_t i = 0; i < st.xfers.size(); ++i) {
    const coll::Xfer& x = st.xfers[i];
    const int peer = (*c.rank_to_peer)[static_cast<std::size_t>(x.peer)];
    if (x.kind == coll::XferKind::send) {
      std::byte* at = c.work + x.offset * es;
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
      l.sends.push_back(mesh_.post_send(peer, h, c.name, from));
      l.send_peer.push_back(peer);
      continue;
    }
    const bool stream = &x == l.stream;
    if (!l.ahead.empty() && l.ahead.front().step == l.step && l.ahead.front().xfer == i) {
      l.recvs.push_back(std::move(l.ahead.front().req));  // posted by post_ahead
      l.ahead.erase(l.ahead.begin());
    } else if (x.kind == coll::XferKind::recv_reduce && !stream) {
      l.recvs.push_back(post_receive(l, x, false, l.scratch.data.get() + sc));
      sc += x.count * es;
    } else {
      l.recvs.push_back(post_receive(l, x, stream, nullptr));
    }
    l.recv_peer.push_back(peer);
  }
  post_ahead(l);
}

// A receive of a later step may be posted now when what it writes is not read or written by any
// step from the current one to its own (coll::may_post_ahead; a send of the current step that
// is done reads nothing any more), so its data may land at any time in between, and it
// needs no scratch (a copy, or its step's reduction on arrival: the range holds then what it
// would hold at its step, so the sum is the same). Receives are posted in plan order, so that
// the frames of a peer still match them in order: the first receive that cannot be posted
// stops the walk, to be tried again at the next step.
void Engine::post_ahead(LaneRun& l) {
  KF_DCHECK_IO(driver_);
  const auto& steps = l.lane->steps;
  if (l.ahead_step <= l.step) {
    l.ahead_step = l.step + 1;
    l.ahead_xfer = 0;
  }
  const std::size_t es = dtype_bytes(l.coll->send.dtype);
  for (; l.ahead_step < steps.size() && l.ahead_step <= l.step + kAheadSteps;
       ++l.ahead_step, l.ahead_xfer = 0) {
    const coll::Step& st = steps[l.ahead_step];
    for (; l.ahead_xfer < st.xfers.size(); ++l.ahead_xfer) {
      const coll::Xfer& x = st.xfers[l.ahead_xfer];
      if (x.kind == coll::XferKind::send) continue;
      if (x.count * es < kStreamReduceMinBytes) return;
      const bool stream = x.kind == coll::XferKind::recv_reduce;
      if (stream && stream_of(st, es) != &x) return;
      const auto send_done = [&](std::size_t i) { return l.sends[i]->ev.done; };
      if (!coll::may_post_ahead(*l.lane, l.step, l.ahead_step, x, send_done)) return;
      const int peer = (*l.coll->rank_to_peer)[static_cast<std::size_t>(x.peer)];
      l.ahead.push_back({l.ahead_step, l.ahead_xfer, post_receive(l, x, stream, nullptr), peer});
    }
  }
}

bool Engine::reduce_step(LaneRun& l, std::size_t& budget) {
  KF_DCHECK_IO(driver_);
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

void Engine::advance(LaneRun& l) {
  KF_DCHECK_IO(driver_);
  try {
    const auto& steps = l.lane->steps;
    std::size_t budget = kReduceSliceBytes;
    while (l.step < steps.size()) {
      if (!l.posted) {
        post_step(l);
        l.posted = true;
        // A receive whose frame is in a shared-memory ring already is taken now: then it
        // needs no wait at all.
        if (mesh_.reads_rings() && std::any_of(l.recvs.begin(), l.recvs.end(),
                                               [](const auto& r) { return !r->ev.done; })) {
          mesh_.poll_rings();
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
        ++driver_.handlers_posted;
        driver_.context_due = true;
        asio::post(ioc_, [this, &l, keep = runs_[l.coll->run_index]] { advance(l); });
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

void Engine::wait_for(LaneRun& l, Event& ev, int peer) {
  KF_DCHECK_IO(driver_);
  l.waiting_on = &ev;
  ev.waiter = &l;
  l.wait_peer = peer;
  l.deadline = Clock::now() + l.coll->timeout;
  arm_deadline(l.deadline);
}

void Engine::arm_deadline(Clock::time_point t) {
  KF_DCHECK_IO(driver_);
  if (t >= deadline_due_) return;
  deadline_due_ = t;
  deadline_timer_.expires_at(t);
  deadline_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) check_deadlines();
  });
}

// A wait times out once its deadline passed and its peer has
// been silent (sent nothing, taken nothing) for the collective's timeout.
void Engine::check_deadlines() {
  KF_DCHECK_IO(driver_);
  deadline_due_ = Clock::time_point::max();
  const auto now = Clock::now();
  auto next = Clock::time_point::max();
  StepVec<LaneRun*> expired;
  // Whether a wait on `peer` with this deadline has expired; if not, moves the deadline to the
  // peer's last sign of life plus the timeout, and keeps the earliest deadline in `next`.
  auto expired_wait = [&](Clock::time_point& deadline, int peer, std::chrono::milliseconds t) {
    if (deadline <= now) {
      const auto last = mesh_.last_progress(peer) + t;
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
    mesh_.mark_lost(peer, timeout, no_progress(c->timeout));
    if (c->x_waiting) fail_express(*c, timeout, transfer_failure(true, peer, timeout));
  }
  if (next != Clock::time_point::max()) arm_deadline(next);
}

std::size_t Engine::run_woken() {
  KF_DCHECK_IO(driver_);
  if (woken_.empty()) return 0;
  // Advancing a lane may wake others (its sends and receives, its rings): they are appended
  // and run in this same pass. A woken lane is unfinished, so its collective is alive.
  std::size_t i = 0;
  for (; i < woken_.size(); ++i) advance(static_cast<LaneRun&>(*woken_[i]));
  woken_.clear();
  return i;
}

std::string Engine::transfer_failure(bool recv, int peer, std::error_code ec) const {
  return (recv ? "receiving from " : "sending to ") + mesh_.peer_key(peer) + ": " + ec.message();
}

void Engine::fail_transfer(LaneRun& l, bool recv, int peer, std::error_code ec) {
  fail_lane(l, ec, transfer_failure(recv, peer, ec));
}

void Engine::fail_lane(LaneRun& l, std::error_code ec, std::string why) {
  KF_DCHECK_IO(driver_);
  l.stop_waiting();
  // Receives posted ahead are abandoned with the step's.
  for (auto& a : l.ahead) {
    l.recvs.push_back(std::move(a.req));
    l.recv_peer.push_back(a.peer);
  }
  l.ahead.clear();
  ++driver_.handlers_posted;
  std::shared_ptr<CollCtx> keep = runs_[l.coll->run_index];
  asio::co_spawn(
      ioc_,
      [this, &l, keep = std::move(keep), ec, why = std::move(why)]() mutable -> awaitable<void> {
        co_await abandon_step(*keep, l.sends, l.send_peer, l.recvs, l.recv_peer, ec);
        lane_finished(l, ec, std::move(why));
      },
      asio::detached);
}

void Engine::lane_finished(LaneRun& l, std::error_code ec, std::string why) {
  KF_DCHECK_IO(driver_);
  scratch_.release(std::move(l.scratch));
  CollCtx& c = *l.coll;
  if (ec && !c.first) {
    c.first = ec;
    c.why = std::move(why);
  }
  if (--c.lanes_left == 0) finish_collective(c);
}

awaitable<void> Engine::abandon_step(CollCtx& ctx, const StepVec<std::shared_ptr<SendReq>>& sends,
                                     const StepVec<int>& send_peer,
                                     const StepVec<std::shared_ptr<RecvReq>>& recvs,
                                     const StepVec<int>& recv_peer, std::error_code result) {
  // A peer that stops making progress counts as lost; everyone else is told.
  if (result == make_error_code(errc::timeout)) {
    const std::string stall = no_progress(ctx.timeout);
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      if (!recvs[i]->ev.done) mesh_.mark_lost(recv_peer[i], result, stall);
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (!sends[i]->ev.done) mesh_.mark_lost(send_peer[i], result, stall);
    }
  }
  for (auto& r : recvs) mailbox_.cancel(r, result);
  for (auto& s : sends) mesh_.cancel(s, result);
  // Transfers already touching the caller's buffers finish or fail on their own (a broken
  // connection's coroutine completes them); close the connection if they do not.
  auto drain = [&](Event& ev, int peer) -> awaitable<void> {
    if (ev.done) co_return;
    if (co_await mesh_.wait_progress(ev, peer, ctx.timeout)) {
      mesh_.force_close(peer);
      ev.timer().expires_at(Clock::time_point::max());
      while (!ev.done) co_await ev.timer().async_wait(kTuple);
    }
  };
  for (std::size_t i = 0; i < recvs.size(); ++i) co_await drain(recvs[i]->ev, recv_peer[i]);
  for (std::size_t i = 0; i < sends.size(); ++i) co_await drain(sends[i]->ev, send_peer[i]);
}

}  // namespace kf::detail
