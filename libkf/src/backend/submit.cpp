// SPDX-License-Identifier: Apache-2.0
// A collective's way in: its arguments are checked, its algorithm resolved, and it goes to
// the backend of its buffers' device (backend/backend.hpp).
#include <array>

#include "backend/backend.hpp"
#include "common/recycle.hpp"
#include "kf/coll/cost_model.hpp"
#include "peer_impl.hpp"

namespace kf::detail {

Algorithm PeerImpl::resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept {
  if (a == Algorithm::job_default) a = default_algorithm_.load(std::memory_order_relaxed);
  if (a == Algorithm::job_default) a = Algorithm::auto_select;
  if (a != Algorithm::auto_select) return a;
  // choose() is a pure function of these and costs as much as a small collective's
  // bookkeeping; jobs repeat the same few sizes, so each thread remembers its last answers, by
  // size and operation under resolve_key_ (which stands for the rest, for every peer).
  struct Memo {
    std::uint64_t key = 0;  // no peer's: resolve keys start at 1
    std::size_t bytes = 0;
    CollOp op;
    Algorithm a;
  };
  thread_local std::array<Memo, 16> memo{};
  Memo& m = (*pinned(&memo))[(bytes * 31 + static_cast<std::size_t>(op)) % memo.size()];
  if (m.key == resolve_key_ && m.bytes == bytes && m.op == op) return m.a;
  const int p = std::max(1, cluster_.size());
  const coll::Topology& t = topology_;
  // Across hosts, flat schedules run at the pace of TCP, and hierarchical is a candidate.
  const Algorithm chosen =
      t.hosts > 1
          ? coll::choose(op, bytes, p, t, coll::kSameHostLink, coll::LinkParams{})
          : coll::choose(op, bytes, p, same_host_link_ ? coll::kSameHostLink : coll::LinkParams{});
  m = Memo{resolve_key_, bytes, op, chosen};
  return chosen;
}

Handle PeerImpl::submit(std::shared_ptr<CollCtx> ctx) {
  ctx->state = make_recycled<OpState>();
  if (ctx->state->driver != driver_) ctx->state->driver = driver_;
  Handle h(ctx->state);
  if (cluster_.workers.empty())
    return fail_request(*ctx, "the peer has no cluster yet (call start())");
  const BackendKind backend = backend_for(ctx->send, ctx->recv);
  ctx->version = cluster_.version;
  ctx->rank = rank_;
  ctx->size = cluster_.size();
  if (const std::string why = check_arguments(*ctx); !why.empty()) return fail_request(*ctx, why);
  ctx->timeout = ctx->opts.timeout.count() > 0 ? ctx->opts.timeout : opts_.timeout;
  ctx->algorithm = resolve(ctx->op, ctx->opts.algorithm, ctx->send.bytes());
  if (ctx->rank_to_peer != rank_to_peer_) ctx->rank_to_peer = rank_to_peer_;
  if (ctx->algorithm == Algorithm::hierarchical) ctx->hosts = host_of_rank_;
  switch (backend) {
    case BackendKind::host:
      // On crowded cores (Driver::yield) a long collective goes to the I/O thread
      // (kCrowdedIoThreadBytes).
      if (driver_->yield.load(std::memory_order_relaxed) &&
          std::max(ctx->send.bytes(), ctx->recv.bytes()) >= kCrowdedIoThreadBytes) {
        ctx->state->driver = nullptr;  // the waiter sleeps
        driver_->start_on_io(
            [this, ctx = std::move(ctx)]() mutable { engine_.start_collective(std::move(ctx)); });
        break;
      }
      // Started here when the context is free (the I/O thread parked on a waiter's lease): its
      // first frames leave now, not when the next thread to run the context gets to it.
      driver_->start([this, ctx = std::move(ctx)]() mutable {
        const std::uint64_t posted = driver_->handlers_posted;
        engine_.start_collective(std::move(ctx));
        return driver_->handlers_posted != posted;
      });
      break;
    case BackendKind::device:
      // NCCL or the staging backend moves the data (backend/device.cpp), while the mesh, the
      // mailbox and the step boundary stay on kf's own transport.
      return submit_device(std::move(ctx));
  }
  return h;
}

Handle PeerImpl::fail_request(CollCtx& c, const std::string& why) {
  c.state->complete(make_error_code(errc::invalid_argument),
                    std::string(to_string(c.op)) + " '" + c.name + "': " + why);
  return Handle(c.state);
}

std::string PeerImpl::check_arguments(const CollCtx& c) const {
  const auto p = static_cast<std::size_t>(c.size);
  if (c.opts.root < 0 || c.opts.root >= c.size) {
    return "root " + std::to_string(c.opts.root) + " is not a rank of this " +
           std::to_string(c.size) + "-worker cluster";
  }
  if (c.name.empty() || c.name.size() > transport::kMaxNameBytes) {
    return "a collective needs a name of 1-" + std::to_string(transport::kMaxNameBytes) + " bytes";
  }
  const Buffer& s = c.send;
  const Buffer& r = c.recv;
  switch (c.op) {
    case CollOp::allreduce:
      if (s.count != r.count || s.dtype != r.dtype) return "send and recv differ in shape";
      break;
    case CollOp::allgather:
    case CollOp::gather:
      if (s.dtype != r.dtype) return "send and recv differ in dtype";
      if ((c.op == CollOp::allgather || c.rank == c.opts.root) && r.count != s.count * p) {
        return "recv needs size*send.count = " + std::to_string(s.count * p) + " elements";
      }
      break;
    case CollOp::reduce_scatter:
      if (s.dtype != r.dtype) return "send and recv differ in dtype";
      if (s.count != r.count * p) {
        return "send needs size*recv.count = " + std::to_string(r.count * p) + " elements";
      }
      break;
    default: break;
  }
  const bool recv_unused = c.op == CollOp::gather && c.rank != c.opts.root;
  if ((s.count > 0 && s.data == nullptr) || (r.count > 0 && r.data == nullptr && !recv_unused)) {
    return "null buffer";
  }
  return {};
}

}  // namespace kf::detail
