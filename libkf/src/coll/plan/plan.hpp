// SPDX-License-Identifier: Apache-2.0
// Collective schedules as pure data: given (operation, algorithm, rank, size, element count) a
// plan says which ranges of a work buffer each rank sends to and receives from which rank, in
// which order. No I/O happens here; coll/exec runs plans over the transport, and the unit tests
// run them over an in-memory simulator.
//
// Shape: a plan has lanes that run concurrently (chunks of a pipelined message); a lane is a
// sequence of steps; a step is a set of transfers that run concurrently, and the next step
// starts when all of them are done. Messages between a pair of ranks within a lane are matched
// in order (first send to first receive), so every plan must list, for each ordered pair, its
// sends on one side in the same order as the matching receives on the other.
//
// hierarchical (allreduce, barrier, consensus; the other operations run ring): with s the fewest
// workers on any host, the vector is cut into s shards and the j-th worker of each host (in rank
// order) owns shard j. Each worker sends every shard to its owner on the same host, which
// reduces them; the owners of shard j, one per host, allreduce it among themselves (ring, or
// recursive doubling up to rd_max_count); each owner then sends its shard to the other workers
// of its host. With one worker per host that is a flat ring; with s = 1, a reduce to one leader
// per host, an allreduce among the leaders and a broadcast within each host.
//
// Work-buffer layout per operation (count = elements per rank where it applies):
//   allreduce       work = count elements (the receive buffer, initialised with the input)
//   broadcast       work = count elements
//   allgather       work = size*count, block r holds rank r's input
//   reduce_scatter  work = size*count (a copy of the input); rank r's result is block r
//   gather          work = size*count; block r holds rank r's input, the root gets them all
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kf/coll/types.hpp"

namespace kf::coll {

enum class XferKind : std::uint8_t { send, recv_reduce, recv_copy };

struct Xfer {
  XferKind kind;
  int peer;            ///< rank in the cluster
  std::size_t offset;  ///< elements from the start of the work buffer
  std::size_t count;   ///< elements
  friend bool operator==(const Xfer&, const Xfer&) = default;
};

struct Step {
  std::vector<Xfer> xfers;
};

struct Lane {
  std::vector<Step> steps;
};

struct Plan {
  std::vector<Lane> lanes;
};

struct PlanRequest {
  CollOp op = CollOp::allreduce;
  Algorithm algorithm = Algorithm::ring;  ///< a concrete algorithm (not job_default/auto)
  int rank = 0;
  int size = 1;
  std::size_t count = 0;  ///< allreduce/broadcast: elements; others: elements per rank
  int root = 0;
  int lanes = 1;  ///< pipeline chunks (of every block for allgather, reduce-scatter; gather: 1)
  std::size_t max_xfer_count = 0;  ///< split transfers larger than this (0: never)
  /// rhd allreduce of at most this many elements uses recursive doubling (one exchange of the
  /// whole vector per round: fewer rounds, more bytes) instead of halving-doubling.
  std::size_t rd_max_count = 0;
  /// hierarchical: the host of each rank (equal values: the same host), size() == size.
  /// nullptr: every rank on a host of its own. Ignored by the other algorithms.
  std::shared_ptr<const std::vector<int>> hosts;
};

/// The element count of the work buffer for a request (see the layout above).
std::size_t work_count(const PlanRequest& r) noexcept;

/// Whether two transfers' ranges of the work buffer share an element.
inline bool overlaps(const Xfer& a, const Xfer& b) noexcept {
  return a.offset < b.offset + b.count && b.offset < a.offset + a.count;
}

/// The step's only reduction when no send of the step reads its range (it may then be reduced
/// as it arrives); null when the step reduces more than one receive or none, or a send reads it.
const Xfer* sole_reduction(const Step& st) noexcept;

/// Whether `x`, a receive of step `later` of `lane`, may be posted while the lane is at step
/// `now` (< later), so that its data may land at any moment before its step: no transfer of
/// the steps `now` to `later` - 1 reads or writes its range, except a send of step `now` for
/// which `send_done(i)` is true (i counts the step's sends from 0): its data is gone already.
/// A receive reduced on arrival then finds its range as it would be at its own step.
template <typename SendDone>
bool may_post_ahead(const Lane& lane, std::size_t now, std::size_t later, const Xfer& x,
                    SendDone&& send_done) {
  std::size_t send_i = 0;
  for (const Xfer& y : lane.steps[now].xfers) {
    const bool gone = y.kind == XferKind::send && send_done(send_i++);
    if (!gone && overlaps(x, y)) return false;
  }
  for (std::size_t i = now + 1; i < later; ++i) {
    for (const Xfer& y : lane.steps[i].xfers) {
      if (overlaps(x, y)) return false;
    }
  }
  return true;
}

/// Builds the plan for one rank. Throws: std::invalid_argument for a root out of range or an
/// algorithm that is not concrete.
Plan make_plan(const PlanRequest& r);

/// How many lanes to pipeline a message of `bytes` over for this algorithm and size.
int default_lanes(CollOp op, Algorithm a, std::size_t bytes, int size) noexcept;

/// Splits [0, count) into k near-equal parts; part i is [begin, begin+len).
struct Range {
  std::size_t begin = 0;
  std::size_t count = 0;
};
Range split(std::size_t count, int k, int i) noexcept;

}  // namespace kf::coll
