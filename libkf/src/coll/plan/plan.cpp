// SPDX-License-Identifier: Apache-2.0
// coll::make_plan, which runs each lane's schedule (allreduce.cpp, blocks.cpp; what they share is
// in coll/plan/builder.hpp) and normalises its transfers, and the plan arithmetic: split,
// work_count, default_lanes.
#include "coll/plan/plan.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "coll/plan/builder.hpp"

namespace kf::coll {

Range split(std::size_t count, int k, int i) noexcept {
  const std::size_t uk = static_cast<std::size_t>(k);
  const std::size_t ui = static_cast<std::size_t>(i);
  const std::size_t base = count / uk;
  const std::size_t extra = count % uk;
  const std::size_t begin = ui * base + std::min(ui, extra);
  return Range{begin, base + (ui < extra ? 1 : 0)};
}

std::size_t work_count(const PlanRequest& r) noexcept {
  switch (r.op) {
    case CollOp::allreduce:
    case CollOp::broadcast:
    case CollOp::barrier:
    case CollOp::consensus: return r.count;
    case CollOp::allgather:
    case CollOp::reduce_scatter:
    case CollOp::gather: return r.count * static_cast<std::size_t>(r.size);
  }
  return r.count;
}

const Xfer* sole_reduction(const Step& st) noexcept {
  const Xfer* only = nullptr;
  for (const Xfer& x : st.xfers) {
    if (x.kind != XferKind::recv_reduce) continue;
    if (only != nullptr) return nullptr;
    only = &x;
  }
  if (only == nullptr) return nullptr;
  for (const Xfer& x : st.xfers) {
    if (x.kind == XferKind::send && overlaps(x, *only)) return nullptr;
  }
  return only;
}

namespace {

// Merges neighbouring transfers of the same kind to the same peer over adjacent ranges, then
// splits transfers above max_count. Both sides of every message list their transfers in the
// same order, so both make the same merges and splits.
void normalise(Lane& lane, std::size_t max_count) {
  for (auto& step : lane.steps) {
    std::vector<Xfer> out;
    for (const auto& x : step.xfers) {
      if (!out.empty() && out.back().kind == x.kind && out.back().peer == x.peer &&
          out.back().offset + out.back().count == x.offset) {
        out.back().count += x.count;
      } else {
        out.push_back(x);
      }
    }
    if (max_count > 0) {
      std::vector<Xfer> split_out;
      for (const auto& x : out) {
        std::size_t done = 0;
        do {
          const std::size_t n = std::min(max_count, x.count - done);
          split_out.push_back(Xfer{x.kind, x.peer, x.offset + done, n});
          done += n;
        } while (done < x.count);
      }
      out.swap(split_out);
    }
    step.xfers.swap(out);
  }
}

}  // namespace

int default_lanes(CollOp op, Algorithm a, std::size_t bytes, int size) noexcept {
  if (size <= 1) return 1;
  // Reduce-scatter can run in lanes too, but measured no faster in them: its lanes' reductions
  // compete for the same cores (np=4, 64 MiB blocks: 313 ms in one lane, 400 ms in eight).
  if (op == CollOp::gather || op == CollOp::reduce_scatter) return 1;
  if (a == Algorithm::star || a == Algorithm::clique) return 1;
  // Two workers exchange each half once per phase, and the receiver reduces each piece as it
  // arrives, so one lane already keeps both sides busy; more lanes only add buffers that evict
  // each other from the cache (kf-bench compare back to back, kf / mpi-shm at 8-64 MiB: 0.72-1.18
  // in one lane against 0.79-1.61 in eight, 64 MiB 19.5 against 21.4 ms; over TCP 64 MiB 34.4
  // against 36.1 ms).
  if (size == 2) return 1;
  constexpr std::size_t kChunk = 4u << 20;
  const std::size_t lanes = bytes / kChunk;
  return static_cast<int>(std::clamp<std::size_t>(lanes, 1, 8));
}

Plan make_plan(const PlanRequest& req) {
  const int p = req.size, r = req.rank;
  if (p < 1 || r < 0 || r >= p) throw std::invalid_argument("rank out of range");
  if (req.root < 0 || req.root >= p) {
    throw std::invalid_argument("root " + std::to_string(req.root) + " is not a rank of a " +
                                std::to_string(p) + "-worker cluster");
  }
  Algorithm a = req.algorithm;
  const bool reducing =
      req.op == CollOp::allreduce || req.op == CollOp::barrier || req.op == CollOp::consensus;
  if (a == Algorithm::hierarchical && !reducing) a = Algorithm::ring;
  if (a == Algorithm::hierarchical && req.hosts != nullptr &&
      req.hosts->size() != static_cast<std::size_t>(p)) {
    throw std::invalid_argument("hierarchical: " + std::to_string(req.hosts->size()) +
                                " hosts given for " + std::to_string(p) + " ranks");
  }
  if (a == Algorithm::job_default || a == Algorithm::auto_select) {
    throw std::invalid_argument("make_plan needs a concrete algorithm");
  }
  Plan plan;
  if (p == 1) return plan;
  const bool chunked = req.op != CollOp::gather;
  const int lanes = chunked ? std::max(1, req.lanes) : 1;
  for (int l = 0; l < lanes; ++l) {
    detail::LaneBuilder b;
    const Range w = detail::sub(Range{0, req.count}, lanes, l);
    const detail::Blocks B{req.count, detail::sub(Range{0, req.count}, lanes, l)};
    switch (req.op) {
      case CollOp::allreduce:
      case CollOp::barrier:
      case CollOp::consensus:
        switch (a) {
          case Algorithm::ring: detail::allreduce_ring(b, r, p, w); break;
          case Algorithm::rhd:
            if (req.count <= req.rd_max_count) {
              detail::allreduce_rd(b, r, p, w);
            } else {
              detail::allreduce_rhd(b, r, p, w);
            }
            break;
          case Algorithm::tree: detail::allreduce_tree(b, r, p, w); break;
          case Algorithm::clique: detail::allreduce_clique(b, r, p, w); break;
          case Algorithm::hierarchical:
            detail::allreduce_hierarchical(b, r, p, w, req.hosts.get(), req.rd_max_count);
            break;
          default: detail::allreduce_star(b, r, p, w); break;
        }
        break;
      case CollOp::broadcast: detail::broadcast(b, a, r, p, req.root, w); break;
      case CollOp::allgather: detail::allgather(b, a, r, p, B); break;
      case CollOp::reduce_scatter: detail::reduce_scatter(b, a, r, p, B); break;
      case CollOp::gather: detail::gather(b, a, r, p, req.root, B); break;
    }
    Lane lane = b.finish();
    normalise(lane, req.max_xfer_count);
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

}  // namespace kf::coll
