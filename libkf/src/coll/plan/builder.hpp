// SPDX-License-Identifier: Apache-2.0
// What the files that build plans share: LaneBuilder, the range arithmetic that their loops call
// (inline here, so that every schedule keeps it inlined), and the per-operation schedules that
// make_plan (plan.cpp) runs for each lane: allreduce in allreduce.cpp, broadcast and the block
// operations in blocks.cpp. Private to coll/plan. Thread-safety: pure functions; a LaneBuilder
// belongs to the plan being built.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "coll/plan/plan.hpp"

namespace kf::coll::detail {

inline int mod(int a, int p) { return ((a % p) + p) % p; }

// Builds one lane step by step. Empty steps are dropped: matching is by order per rank pair,
// not by step index, so ranks may have different numbers of steps.
class LaneBuilder {
 public:
  void next() {
    if (!cur_.xfers.empty()) lane_.steps.push_back(std::move(cur_));
    cur_ = Step{};
  }
  /// While set, peers are indices into `ranks` (a sub-group's plan built with its own numbering).
  void map_peers(const std::vector<int>* ranks) { map_ = ranks; }
  void send(int peer, Range r) { add(XferKind::send, peer, r); }
  void reduce(int peer, Range r) { add(XferKind::recv_reduce, peer, r); }
  void copy(int peer, Range r) { add(XferKind::recv_copy, peer, r); }
  Lane finish() {
    next();
    return std::move(lane_);
  }

 private:
  void add(XferKind k, int peer, Range r) {
    if (map_ != nullptr) peer = (*map_)[static_cast<std::size_t>(peer)];
    cur_.xfers.push_back(Xfer{k, peer, r.begin, r.count});
  }
  const std::vector<int>* map_ = nullptr;
  Lane lane_;
  Step cur_;
};

// Part i of `whole` split k ways (split(), moved to whole.begin).
inline Range sub(Range whole, int k, int i) {
  Range s = split(whole.count, k, i);
  s.begin += whole.begin;
  return s;
}

// Block i of p (count elements each), or of a lane only its part `part` (a range within a block).
struct Blocks {
  std::size_t count;
  Range part{0, count};
  Range operator[](int i) const {
    return Range{static_cast<std::size_t>(i) * count + part.begin, part.count};
  }
};

// ---- the schedules: this rank's steps in one lane (r: its rank, p: the ranks, w: the range) ---

// allreduce.cpp
void allreduce_ring(LaneBuilder& b, int r, int p, Range w);
void allreduce_rhd(LaneBuilder& b, int r, int p, Range w);
void allreduce_rd(LaneBuilder& b, int r, int p, Range w);
void allreduce_tree(LaneBuilder& b, int r, int p, Range w);
void allreduce_star(LaneBuilder& b, int r, int p, Range w);
void allreduce_clique(LaneBuilder& b, int r, int p, Range w);
void allreduce_hierarchical(LaneBuilder& b, int r, int p, Range w, const std::vector<int>* host_of,
                            std::size_t rd_max_count);

// blocks.cpp
void broadcast(LaneBuilder& b, Algorithm a, int r, int p, int root, Range w);
void allgather(LaneBuilder& b, Algorithm a, int r, int p, Blocks B);
void reduce_scatter(LaneBuilder& b, Algorithm a, int r, int p, Blocks B);
void gather(LaneBuilder& b, Algorithm a, int r, int p, int root, Blocks B);

}  // namespace kf::coll::detail
