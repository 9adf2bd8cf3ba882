// SPDX-License-Identifier: Apache-2.0
// A collective from start to finish: its work buffer (see coll/plan/plan.hpp for each
// operation's layout), its plan (cached), its lanes, and its completion. Tiny allreduces take
// the express path (engine/express.cpp) instead.
#include <openssl/evp.h>

#include "engine/engine.hpp"
#include "engine/engine_util.hpp"
#include "kf/coll/cost_model.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

namespace {

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

// Out-of-place allreduces up to this size copy the send buffer into the receive buffer up front
// instead of filling it lazily (CollCtx::lazy_src).
constexpr std::size_t kEagerFillBytes = 256;

}  // namespace

Engine::Engine(const PeerOptions& opts, asio::io_context& ioc, Driver& driver, Mailbox& mailbox,
               Mesh& mesh)
    : opts_(opts), ioc_(ioc), driver_(driver), mailbox_(mailbox), mesh_(mesh) {
  mailbox_.set_claimer(
      [](void* self, const MailKeyView& key, std::span<const std::byte> payload,
         std::error_code& conn, std::string& why) {
        return static_cast<Engine*>(self)->express_take(key, payload, conn, why);
      },
      [](void* self, const KeyMatch& match, std::error_code ec) {
        static_cast<Engine*>(self)->fail_express_if(match, ec);
      },
      this);
}

void Engine::start_collective(std::shared_ptr<CollCtx> ctx) {
  KF_DCHECK_IO(driver_);
  CollCtx& c = *ctx;
  // The express path takes the context over: runs_ owns it from then on, without a second
  // reference to take and drop (two atomic read-modify-writes), and `c` may be gone once it
  // returns.
  if (!mesh_.broken() && express_eligible(c)) return start_express(std::move(ctx));
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

// The work buffer of each operation (see coll/plan/plan.hpp for its layout), and the
// request's element count.
void Engine::prepare_work(CollCtx& c, coll::PlanRequest& req) {
  const std::size_t es = dtype_bytes(c.send.dtype);
  const auto p = static_cast<std::size_t>(c.size);
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
}

void Engine::prepare_collective(const std::shared_ptr<CollCtx>& ctx) {
  KF_DCHECK_IO(driver_);
  CollCtx& c = *ctx;
  if (mesh_.broken()) {
    c.state->complete(mesh_.broken(), label(c) + ": cluster version " + std::to_string(c.version) +
                                          " is broken: " + mesh_.broken_why());
    return;
  }
  const std::size_t es = dtype_bytes(c.send.dtype);
  coll::PlanRequest req;
  req.op = c.op;
  req.algorithm = c.algorithm;
  req.rank = c.rank;
  req.size = c.size;
  req.root = c.opts.root;
  req.hosts = c.hosts;
  req.max_xfer_count = std::max<std::size_t>(1, opts_.max_frame_bytes / es);

  prepare_work(c, req);
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

void Engine::finish_collective(CollCtx& c) {
  KF_DCHECK_IO(driver_);
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
      default: break;
    }
    scratch_.release(std::move(c.pooled));
    c.state->complete_ok();
    return;
  }
  scratch_.release(std::move(c.pooled));
  if (ec == make_error_code(errc::timeout) || ec == make_error_code(errc::peer_lost)) {
    if (mesh_.broken() && ec != mesh_.broken()) ec = mesh_.broken();
  }
  const std::string msg = label(c) + " (" + std::string(to_string(c.algorithm)) + ", v" +
                          std::to_string(c.version) +
                          ") failed: " + (mesh_.broken_why().empty() ? c.why : mesh_.broken_why());
  KF_LOG(debug, "coll", "{}: {}", mesh_.identity(), msg);
  c.state->complete(ec, msg);
}

}  // namespace kf::detail
