// SPDX-License-Identifier: Apache-2.0
// The allreduce schedules of coll::make_plan (also barrier's and consensus's): ring, recursive
// halving-doubling and doubling, tree, star, clique and hierarchical, each over one lane's range.
#include <algorithm>
#include <bit>
#include <vector>

#include "coll/plan/builder.hpp"

namespace kf::coll::detail {

namespace {

// Contiguous union of segments [lo, hi) of `whole` split k ways.
Range seg_span(Range whole, int k, int lo, int hi) {
  if (hi <= lo) return Range{sub(whole, k, lo).begin, 0};
  const Range a = sub(whole, k, lo);
  const Range b = sub(whole, k, hi - 1);
  return Range{a.begin, b.begin + b.count - a.begin};
}

// The fold of the recursive algorithms for any p: with p2 the largest power of two <= p and
// rem = p - p2, the first 2*rem ranks pair up; the even one hands its vector to the odd one and
// gets the result back at the end. Returns the rank among the p2 that go on, or -1 for a rank
// that folded out (its steps are complete).
struct Fold {
  int p2, rem, nr;
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
};

Fold fold_in(LaneBuilder& b, int r, int p, Range w) {
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const int rem = p - p2;
  if (r < 2 * rem && r % 2 == 0) {
    b.send(r + 1, w);
    b.next();
    b.copy(r + 1, w);
    b.next();
    return Fold{p2, rem, -1};
  }
  if (r < 2 * rem) {
    b.reduce(r - 1, w);
    b.next();
    return Fold{p2, rem, r / 2};
  }
  return Fold{p2, rem, r - rem};
}

void fold_out(LaneBuilder& b, int r, const Fold& f, Range w) {
  if (r < 2 * f.rem) {
    b.send(r - 1, w);
    b.next();
  }
}

}  // namespace

void allreduce_ring(LaneBuilder& b, int r, int p, Range w) {
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  for (int s = 0; s < p - 1; ++s) {  // reduce-scatter: rank r ends owning segment r+1
    b.send(next, sub(w, p, mod(r - s, p)));
    b.reduce(prev, sub(w, p, mod(r - s - 1, p)));
    b.next();
  }
  for (int s = 0; s < p - 1; ++s) {  // allgather
    b.send(next, sub(w, p, mod(r + 1 - s, p)));
    b.copy(prev, sub(w, p, mod(r - s, p)));
    b.next();
  }
}

// Rabenseifner: recursive halving reduce-scatter then recursive doubling allgather among the
// largest power of two p2 <= p; the first 2*(p-p2) ranks fold pairwise into the odd one first.
void allreduce_rhd(LaneBuilder& b, int r, int p, Range w) {
  const Fold f = fold_in(b, r, p, w);
  if (f.nr < 0) return;
  const int p2 = f.p2, nr = f.nr;
  auto real = [&f](int v) { return f.real(v); };
  int lo = 0, hi = p2;
  for (int d = p2 / 2; d >= 1; d /= 2) {
    const int partner = real(nr ^ d);
    const int mid = (lo + hi) / 2;
    if (nr & d) {
      b.send(partner, seg_span(w, p2, lo, mid));
      b.reduce(partner, seg_span(w, p2, mid, hi));
      lo = mid;
    } else {
      b.send(partner, seg_span(w, p2, mid, hi));
      b.reduce(partner, seg_span(w, p2, lo, mid));
      hi = mid;
    }
    b.next();
  }
  for (int d = 1; d < p2; d *= 2) {
    const int partner = real(nr ^ d);
    b.send(partner, seg_span(w, p2, lo, hi));
    if (nr & d) {
      b.copy(partner, seg_span(w, p2, lo - d, lo));
      lo -= d;
    } else {
      b.copy(partner, seg_span(w, p2, hi, hi + d));
      hi += d;
    }
    b.next();
  }
  fold_out(b, r, f, w);
}

// Recursive doubling with the same fold as above: lg(p2) rounds, each a full exchange. Both
// partners reduce the same two operands (commutative), so they stay bitwise identical.
void allreduce_rd(LaneBuilder& b, int r, int p, Range w) {
  const Fold f = fold_in(b, r, p, w);
  if (f.nr < 0) return;
  for (int d = 1; d < f.p2; d *= 2) {
    const int partner = f.real(f.nr ^ d);
    b.send(partner, w);
    b.reduce(partner, w);
    b.next();
  }
  fold_out(b, r, f, w);
}

// Binary tree rooted at rank 0: reduce up, broadcast down. The send to the parent and the
// receive of the result share a step; that is safe because the parent sends the result only
// after it has received all of this rank's data.
void allreduce_tree(LaneBuilder& b, int r, int p, Range w) {
  for (int c : {2 * r + 1, 2 * r + 2}) {
    if (c < p) b.reduce(c, w);
  }
  b.next();
  if (r > 0) {
    b.send((r - 1) / 2, w);
    b.copy((r - 1) / 2, w);
    b.next();
  }
  for (int c : {2 * r + 1, 2 * r + 2}) {
    if (c < p) b.send(c, w);
  }
  b.next();
}

void allreduce_star(LaneBuilder& b, int r, int p, Range w) {
  if (r == 0) {
    for (int q = 1; q < p; ++q) b.reduce(q, w);
    b.next();
    for (int q = 1; q < p; ++q) b.send(q, w);
    b.next();
  } else {
    b.send(0, w);
    b.copy(0, w);
    b.next();
  }
}

// Every rank owns segment r: all-to-all reduce-scatter, then all-to-all allgather.
void allreduce_clique(LaneBuilder& b, int r, int p, Range w) {
  for (int q = 0; q < p; ++q) {
    if (q != r) b.send(q, sub(w, p, q));
  }
  for (int q = 0; q < p; ++q) {
    if (q != r) b.reduce(q, sub(w, p, r));
  }
  b.next();
  for (int q = 0; q < p; ++q) {
    if (q != r) b.send(q, sub(w, p, r));
  }
  for (int q = 0; q < p; ++q) {
    if (q != r) b.copy(q, sub(w, p, q));
  }
  b.next();
}

// See plan.hpp. `host_of` may be null (a host per rank).
void allreduce_hierarchical(LaneBuilder& b, int r, int p, Range w, const std::vector<int>* host_of,
                            std::size_t rd_max_count) {
  // Hosts in the order of their first rank, and each host's ranks in order.
  std::vector<int> host_ids;
  std::vector<std::vector<int>> hosts;
  int mine = 0;
  for (int q = 0; q < p; ++q) {
    const int id = host_of != nullptr ? (*host_of)[static_cast<std::size_t>(q)] : q;
    const auto it = std::find(host_ids.begin(), host_ids.end(), id);
    const auto h = static_cast<std::size_t>(it - host_ids.begin());
    if (it == host_ids.end()) {
      host_ids.push_back(id);
      hosts.emplace_back();
    }
    hosts[h].push_back(q);
    if (q == r) mine = static_cast<int>(h);
  }
  const std::vector<int>& here = hosts[static_cast<std::size_t>(mine)];
  std::size_t shards = here.size();
  for (const auto& h : hosts) shards = std::min(shards, h.size());
  const int s = static_cast<int>(shards);
  const int local = static_cast<int>(std::find(here.begin(), here.end(), r) - here.begin());
  const bool owner = local < s;
  auto shard = [&](int j) { return sub(w, s, j); };
  // 1. Every shard to its owner on this host, which reduces them.
  for (int j = 0; j < s; ++j) {
    if (j != local) b.send(here[static_cast<std::size_t>(j)], shard(j));
  }
  if (owner) {
    for (int q : here) {
      if (q != r) b.reduce(q, shard(local));
    }
  }
  b.next();
  // 2. The owners of this shard, one per host, allreduce it.
  if (owner && hosts.size() > 1) {
    std::vector<int> owners;
    for (const auto& h : hosts) owners.push_back(h[static_cast<std::size_t>(local)]);
    const int hp = static_cast<int>(owners.size());
    b.map_peers(&owners);
    if (shard(local).count <= rd_max_count) {
      allreduce_rd(b, mine, hp, shard(local));
    } else {
      allreduce_ring(b, mine, hp, shard(local));
    }
    b.next();
    b.map_peers(nullptr);
  }
  // 3. Each shard from its owner to the rest of the host.
  if (owner) {
    for (int q : here) {
      if (q != r) b.send(q, shard(local));
    }
  }
  for (int j = 0; j < s; ++j) {
    if (j != local) b.copy(here[static_cast<std::size_t>(j)], shard(j));
  }
  b.next();
}

}  // namespace kf::coll::detail
