// SPDX-License-Identifier: Apache-2.0
// Runs a collective's plan over the peer's connections: prepares the work buffer, runs the
// plan's lanes concurrently, reduces received data in plan order (so every worker computes
// every element with the same grouping), and completes the handle. A failed step cancels what
// it can and waits for transfers already touching the caller's buffers, so no buffer is used
// after the handle completes.
#include <openssl/evp.h>

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

bool overlaps(const coll::Xfer& a, const coll::Xfer& b) {
  return a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

}  // namespace

awaitable<std::error_code> PeerImpl::run_lane(CollCtx& ctx, const coll::Lane& lane,
                                              std::uint32_t tag, std::byte* work,
                                              std::string& why) {
  const DType dt = ctx.send.dtype;
  const std::size_t es = dtype_bytes(dt);
  std::size_t scratch_bytes = 0;
  for (const auto& st : lane.steps) {
    std::size_t n = 0;
    for (const auto& x : st.xfers) {
      if (x.kind == coll::XferKind::recv_reduce) n += x.count * es;
    }
    scratch_bytes = std::max(scratch_bytes, n);
  }
  ScratchPool::Block scratch = scratch_.acquire(scratch_bytes);
  // Copies the parts of [off, off+count) that are still only in the send buffer.
  auto fill = [&](std::size_t off, std::size_t count) {
    if (!ctx.lazy_src) return;
    ctx.filled.for_gaps(off, off + count, [&](std::size_t b, std::size_t e) {
      std::memcpy(work + b * es, ctx.lazy_src + b * es, (e - b) * es);
    });
    ctx.filled.add(off, off + count);
  };
  std::error_code result;
  StepVec<std::shared_ptr<SendReq>> sends;
  StepVec<std::shared_ptr<RecvReq>> recvs;
  StepVec<int> send_peer, recv_peer;
  StepVec<bool> streamed;
  for (const auto& st : lane.steps) {
    sends.clear();
    recvs.clear();
    send_peer.clear();
    recv_peer.clear();
    streamed.clear();
    // A step's only reduction, into a range no send of the step reads, can reduce on arrival.
    const coll::Xfer* stream = nullptr;
    int reductions = 0;
    for (const auto& x : st.xfers) {
      if (x.kind == coll::XferKind::recv_reduce) {
        ++reductions;
        stream = &x;
      }
    }
    if (reductions != 1 || stream->count * es < kStreamReduceMinBytes) stream = nullptr;
    for (const auto& x : st.xfers) {
      if (stream && x.kind == coll::XferKind::send && overlaps(x, *stream)) stream = nullptr;
    }
    std::size_t sc = 0;
    for (const auto& x : st.xfers) {
      const int peer = (*ctx.rank_to_peer)[static_cast<std::size_t>(x.peer)];
      std::byte* at = work + x.offset * es;
      if (x.kind == coll::XferKind::send) {
        const std::byte* from = at;
        if (ctx.lazy_src && ctx.filled.disjoint(x.offset, x.offset + x.count)) {
          from = ctx.lazy_src + x.offset * es;  // untouched so far: send straight from the input
        } else {
          fill(x.offset, x.count);
        }
        transport::FrameHeader h;
        h.type = transport::FrameType::data;
        h.cluster_version = ctx.version;
        h.tag = tag;
        h.name_bytes = static_cast<std::uint32_t>(ctx.name.size());
        h.payload_bytes = x.count * es;
        sends.push_back(post_send(peer, h, ctx.name, from));
        send_peer.push_back(peer);
        continue;
      }
      const MailKey key{peer, ctx.version, tag, ctx.name};
      if (&x == stream) {
        RecvReq how(ex(), key);
        how.dtype = dt;
        how.op = ctx.opts.op;
        if (ctx.lazy_src && ctx.filled.disjoint(x.offset, x.offset + x.count)) {
          how.src = ctx.lazy_src + x.offset * es;
        } else {
          fill(x.offset, x.count);
        }
        recvs.push_back(post_recv(key, at, x.count * es, &how));
        streamed.push_back(true);
      } else if (x.kind == coll::XferKind::recv_reduce) {
        recvs.push_back(post_recv(key, scratch.data.get() + sc, x.count * es));
        sc += x.count * es;
        streamed.push_back(false);
      } else {
        recvs.push_back(post_recv(key, at, x.count * es));
        streamed.push_back(false);
      }
      recv_peer.push_back(peer);
    }
    // A receive whose frame is in a shared-memory ring already is taken now: then it needs no
    // wait at all (a timer armed, cancelled, and a resumption posted), which for a small
    // collective costs more than the rest of the step.
    if (!ring_readers_.empty() &&
        std::any_of(recvs.begin(), recvs.end(), [](const auto& r) { return !r->ev.done; })) {
      poll_rings();
    }
    // Wait for everything; the first failure stops the wait.
    // (What is done already, such as a send that went into a ring, is not waited for at all.)
    // (An if, not ?:, around co_await: GCC 12 evaluates both arms of a conditional there.)
    for (std::size_t i = 0; i < recvs.size() && !result; ++i) {
      Event& ev = recvs[i]->ev;
      result = ev.ec;
      if (!ev.done) result = co_await wait_progress(ev, recv_peer[i], ctx.timeout);
      if (result) why = "receiving from " + peers_[recv_peer[i]].key + ": " + result.message();
    }
    for (std::size_t i = 0; i < sends.size() && !result; ++i) {
      Event& ev = sends[i]->ev;
      result = ev.ec;
      if (!ev.done) result = co_await wait_progress(ev, send_peer[i], ctx.timeout);
      if (result) why = "sending to " + peers_[send_peer[i]].key + ": " + result.message();
    }
    if (result) {
      co_await abandon_step(ctx, sends, send_peer, recvs, recv_peer, result);
      break;
    }
    // Reduce what was received into scratch, in plan order (deterministic), then record which
    // ranges of the receive buffer now hold data.
    sc = 0;
    for (const auto& x : st.xfers) {
      if (x.kind == coll::XferKind::send) continue;
      if (x.kind == coll::XferKind::recv_reduce && &x != stream) {
        std::byte* at = work + x.offset * es;
        if (ctx.lazy_src && ctx.filled.disjoint(x.offset, x.offset + x.count)) {
          reduce_to(at, ctx.lazy_src + x.offset * es, scratch.data.get() + sc, x.count, dt,
                    ctx.opts.op);
        } else {
          fill(x.offset, x.count);
          reduce_into(at, scratch.data.get() + sc, x.count, dt, ctx.opts.op);
        }
        sc += x.count * es;
      }
      if (ctx.lazy_src) ctx.filled.add(x.offset, x.offset + x.count);
    }
  }
  scratch_.release(std::move(scratch));
  co_return result;
}

awaitable<void> PeerImpl::abandon_step(CollCtx& ctx,
                                       const StepVec<std::shared_ptr<SendReq>>& sends,
                                       const StepVec<int>& send_peer,
                                       const StepVec<std::shared_ptr<RecvReq>>& recvs,
                                       const StepVec<int>& recv_peer, std::error_code result) {
  // A peer that stops making progress counts as lost; everyone else is told.
  if (result == make_error_code(errc::timeout)) {
    const std::string stall = "no progress for " + std::to_string(ctx.timeout.count()) + " ms";
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      if (!recvs[i]->ev.done) mark_lost(recv_peer[i], result, stall);
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (!sends[i]->ev.done) mark_lost(send_peer[i], result, stall);
    }
  }
  for (auto& r : recvs) cancel(r, result);
  for (auto& s : sends) cancel(s, result);
  // Transfers already touching the caller's buffers finish or fail on their own (a broken
  // connection's coroutine completes them); close the connection if they do not.
  auto drain = [&](Event& ev, int peer) -> awaitable<void> {
    if (ev.done) co_return;
    if (co_await wait_progress(ev, peer, ctx.timeout)) {
      force_close(peer);
      ev.timer.expires_at(Clock::time_point::max());
      while (!ev.done) co_await ev.timer.async_wait(kTuple);
    }
  };
  for (std::size_t i = 0; i < recvs.size(); ++i) co_await drain(recvs[i]->ev, recv_peer[i]);
  for (std::size_t i = 0; i < sends.size(); ++i) co_await drain(sends[i]->ev, send_peer[i]);
}

awaitable<std::error_code> PeerImpl::run_plan(CollCtx& ctx, const coll::Plan& plan,
                                              std::byte* work, std::string& why) {
  if (plan.lanes.empty()) co_return std::error_code{};
  if (plan.lanes.size() == 1) co_return co_await run_lane(ctx, plan.lanes[0], 0, work, why);
  // Lanes run concurrently; the collective finishes when the last lane does.
  std::size_t pending = plan.lanes.size();
  std::error_code first;
  Event all_done(ex());
  std::vector<std::string> whys(plan.lanes.size());
  for (std::size_t l = 0; l < plan.lanes.size(); ++l) {
    asio::co_spawn(
        ex(),
        [&, l]() -> awaitable<void> {
          auto ec = co_await run_lane(ctx, plan.lanes[l], static_cast<std::uint32_t>(l), work,
                                      whys[l]);
          if (ec && !first) {
            first = ec;
            why = whys[l];
          }
          if (--pending == 0) all_done.set(first);
        },
        asio::detached);
  }
  while (!all_done.done) co_await all_done.timer.async_wait(kTuple);
  co_return first;
}

awaitable<void> PeerImpl::run_collective(std::shared_ptr<CollCtx> ctx) {
  CollCtx& c = *ctx;
  auto label = [&] { return std::string(to_string(c.op)) + " '" + c.name + "'"; };
  if (broken_) {
    c.state->complete(broken_, label() + ": cluster version " + std::to_string(c.version) +
                                   " is broken: " + broken_why_);
    co_return;
  }
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
  std::vector<std::byte> own;  // barrier's one byte
  // The work buffer when the caller's buffers cannot serve as one: pooled, so that it is not
  // mapped and page-faulted afresh on every call (a p-times-the-result buffer for reduce-scatter).
  ScratchPool::Block pooled;
  std::byte* work = nullptr;
  std::array<std::byte, 64> digest{};
  switch (c.op) {
    case CollOp::allreduce:
      req.count = c.send.count;
      work = static_cast<std::byte*>(c.recv.data);
      if (c.send.data != c.recv.data && c.send.bytes() > 0) {
        c.lazy_src = static_cast<const std::byte*>(c.send.data);
      }
      break;
    case CollOp::broadcast:
      req.count = c.send.count;
      work = static_cast<std::byte*>(c.send.data);
      break;
    case CollOp::allgather:
      req.count = c.send.count;
      work = static_cast<std::byte*>(c.recv.data);
      if (c.send.bytes() > 0) {
        std::memmove(work + static_cast<std::size_t>(c.rank) * c.send.bytes(), c.send.data,
                     c.send.bytes());
      }
      break;
    case CollOp::gather:
    case CollOp::reduce_scatter:
      req.count = c.op == CollOp::gather ? c.send.count : c.recv.count;
      if (c.op == CollOp::gather && c.rank == c.opts.root) {
        work = static_cast<std::byte*>(c.recv.data);
      } else {
        pooled = scratch_.acquire(req.count * p * es);
        work = pooled.data.get();
      }
      if (c.op == CollOp::gather && c.send.bytes() > 0) {
        std::memmove(work + static_cast<std::size_t>(c.rank) * c.send.bytes(), c.send.data,
                     c.send.bytes());
      } else if (c.op == CollOp::reduce_scatter && c.send.bytes() > 0) {
        // As for an out-of-place allreduce: blocks are sent from, and reduced out of, the send
        // buffer until the plan first writes them.
        c.lazy_src = static_cast<const std::byte*>(c.send.data);
      }
      break;
    case CollOp::barrier:
      req.count = 1;
      own.assign(1, std::byte{1});
      work = own.data();
      c.send.dtype = DType::u8;
      c.opts.op = ReduceOp::max;
      break;
    case CollOp::consensus:
      digest = consensus_digest(c.send);
      req.count = digest.size();
      work = digest.data();
      c.send.dtype = DType::u8;
      c.opts.op = ReduceOp::min;
      break;
  }
  req.rd_max_count = coll::kRecursiveDoublingMaxBytes / es;
  req.lanes = coll::default_lanes(c.op, c.algorithm, req.count * es, c.size);
  std::string why;
  std::error_code ec;
  try {
    const std::shared_ptr<const coll::Plan> plan = plans_.get(req);
    // One lane (every small message) runs in this coroutine: no frame for run_plan. (Not ?:,
    // see run_lane.)
    if (plan->lanes.size() == 1) {
      ec = co_await run_lane(c, plan->lanes[0], 0, work, why);
    } else {
      ec = co_await run_plan(c, *plan, work, why);
    }
  } catch (const std::invalid_argument& e) {
    ec = make_error_code(errc::invalid_argument);
    why = e.what();
  }
  if (!ec) {
    switch (c.op) {
      case CollOp::allreduce:
        if (c.lazy_src) {  // whatever the plan never touched (e.g. a single worker)
          c.filled.for_gaps(0, req.count, [&](std::size_t b, std::size_t e) {
            std::memcpy(work + b * es, c.lazy_src + b * es, (e - b) * es);
          });
        }
        if (c.opts.op == ReduceOp::avg) finish_avg(work, req.count, c.send.dtype, p);
        break;
      case CollOp::reduce_scatter:
        if (c.lazy_src) {  // this worker's block, where the plan never wrote it (one worker)
          const std::size_t first = static_cast<std::size_t>(c.rank) * c.recv.count;
          c.filled.for_gaps(first, first + c.recv.count, [&](std::size_t b, std::size_t e) {
            std::memcpy(work + b * es, c.lazy_src + b * es, (e - b) * es);
          });
        }
        if (c.opts.op == ReduceOp::avg) {
          finish_avg(work + static_cast<std::size_t>(c.rank) * c.recv.bytes(), c.recv.count,
                     c.send.dtype, p);
        }
        if (c.recv.bytes() > 0) {
          std::memcpy(c.recv.data, work + static_cast<std::size_t>(c.rank) * c.recv.bytes(),
                      c.recv.bytes());
        }
        break;
      case CollOp::consensus: {
        bool same = true;
        for (std::size_t i = 0; i < 32; ++i) same = same && (digest[i] == ~digest[32 + i]);
        if (c.agreed) *c.agreed = same;
        break;
      }
      default:
        break;
    }
    scratch_.release(std::move(pooled));
    c.state->complete({}, {});
    co_return;
  }
  scratch_.release(std::move(pooled));
  if (ec == make_error_code(errc::timeout) || ec == make_error_code(errc::peer_lost)) {
    if (broken_ && ec != broken_) ec = broken_;
  }
  const std::string msg = label() + " (" + std::string(to_string(c.algorithm)) + ", v" +
                          std::to_string(c.version) + ") failed: " +
                          (broken_why_.empty() ? why : broken_why_);
  KF_LOG(debug, "coll", "{}: {}", identity_, msg);
  c.state->complete(ec, msg);
}

}  // namespace kf::detail
