// SPDX-License-Identifier: Apache-2.0
// The express allreduce: a tiny allreduce by recursive doubling, without plan, lanes or
// requests.
#include <algorithm>
#include <bit>

#include "engine/engine.hpp"
#include "engine/engine_util.hpp"
#include "kf/coll/cost_model.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

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

bool Engine::express_eligible(const CollCtx& c) const noexcept {
  if (c.algorithm != Algorithm::rhd) return false;
  // A power of two; not std::has_single_bit, which without -mpopcnt is a call into libgcc.
  if (c.size < 2 || (c.size & (c.size - 1)) != 0) return false;
  // A barrier is an allreduce (max) of one byte, as prepare_collective sets it up.
  if (c.op == CollOp::barrier) return opts_.express_bytes >= 1 && opts_.max_frame_bytes >= 1;
  if (c.op != CollOp::allreduce) return false;
  const std::size_t bytes = c.send.bytes();
  if (bytes == 0 || bytes > opts_.express_bytes || bytes > opts_.max_frame_bytes) return false;
  // The plan would run recursive doubling in one lane too (see coll::make_plan).
  // (bytes <= the limit: the plan's count <= limit / element size, without the division.)
  return bytes <= coll::kRecursiveDoublingMaxBytes &&
         coll::default_lanes(c.op, c.algorithm, bytes, c.size) == 1;
}

void Engine::start_express(std::shared_ptr<CollCtx>&& ctx) {
  KF_DCHECK_IO(driver_);
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
  c.x_dist = 1;
  try {
    c.run_index = runs_.size();
    runs_.push_back(std::move(ctx));  // or, if it throws, the caller's `ctx` still holds it
  } catch (const std::exception& e) {
    return fail_express(c, make_error_code(errc::protocol_error), e.what());
  }
  // From here runs_ owns the collective, and finish_collective lets it go: nothing touches `c`
  // after the step that finishes it.
  try {
    express_step(c);
    // The partner's frame may be in a ring already: taken now, it needs no wait at all.
    if (!express_waiting_.empty() && mesh_.reads_rings()) mesh_.poll_rings();
  } catch (const std::exception& e) {
    // Allocation and the like: the collective fails, the peer goes on. Unless it finished
    // already: then it is out of runs_ (found by address only: it may be gone).
    const CollCtx* const mine = &c;
    const bool running =
        std::any_of(runs_.begin(), runs_.end(), [&](const auto& r) { return r.get() == mine; });
    KF_LOG(err, "coll", "an express allreduce's start raised: {}", e.what());
    if (running) fail_express(c, make_error_code(errc::protocol_error), e.what());
  }
}

void Engine::express_step(CollCtx& c) {
  KF_DCHECK_IO(driver_);
  const std::size_t bytes = c.count * dtype_bytes(c.send.dtype);
  while (c.x_dist < c.size) {
    const int peer = (*c.rank_to_peer)[static_cast<std::size_t>(c.rank ^ c.x_dist)];
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
    mesh_.send_frame(peer, h, c.name, data, /*copy_if_queued=*/true);
    if (data != c.work) std::memmove(c.work, data, bytes);
    // The frame came before this round: reduced at once.
    if (auto taken = mailbox_.take_early(MailKeyView{peer, c.version, 0, c.name})) {
      const std::size_t got = taken->bytes;
      if (got == bytes) reduce_into(c.work, taken->data(), c.count, c.send.dtype, c.opts.op);
      mailbox_.recycle(std::move(taken->block));
      if (got != bytes) {
        return fail_express(c, make_error_code(errc::protocol_error),
                            "receiving from " + mesh_.peer_key(peer) + ": a frame of " +
                                std::to_string(got) + " bytes, " + std::to_string(bytes) +
                                " expected");
      }
      c.x_dist <<= 1;
      continue;
    }
    // Refused as post_recv refuses a receive that can never complete.
    if (const std::error_code ec = mesh_.receive_refusal(peer, c.version)) {
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

bool Engine::express_take(const MailKeyView& key, std::span<const std::byte> payload,
                          std::error_code& conn, std::string& why) {
  KF_DCHECK_IO(driver_);
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
  const std::size_t align = dtype_bytes(c.send.dtype);  // a power of two
  if ((reinterpret_cast<std::uintptr_t>(payload.data()) & (align - 1)) != 0) {
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

void Engine::fail_express(CollCtx& c, std::error_code ec, std::string why) {
  KF_DCHECK_IO(driver_);
  if (c.x_waiting) express_done_waiting(c);
  if (!c.first) {
    c.first = ec;
    c.why = std::move(why);
  }
  finish_collective(c);
}

void Engine::fail_express_if(const KeyMatch& match, std::error_code ec) {
  KF_DCHECK_IO(driver_);
  if (express_waiting_.empty()) return;
  StepVec<std::shared_ptr<CollCtx>> hit;
  for (CollCtx* c : express_waiting_) {
    if (match(MailKeyView{c->x_peer, c->version, 0, c->name})) hit.push_back(runs_[c->run_index]);
  }
  for (const auto& c : hit) {
    if (c->x_waiting) fail_express(*c, ec, transfer_failure(true, c->x_peer, ec));
  }
}

}  // namespace kf::detail
