// SPDX-License-Identifier: Apache-2.0
#include "coll/plan/plan.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

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

namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

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

Range sub(Range whole, int k, int i) {
  Range s = split(whole.count, k, i);
  s.begin += whole.begin;
  return s;
}

// Contiguous union of segments [lo, hi) of `whole` split k ways.
Range seg_span(Range whole, int k, int lo, int hi) {
  if (hi <= lo) return Range{sub(whole, k, lo).begin, 0};
  const Range a = sub(whole, k, lo);
  const Range b = sub(whole, k, hi - 1);
  return Range{a.begin, b.begin + b.count - a.begin};
}

// ---- allreduce over one range -----------------------------------------------------------------

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

// ---- broadcast over one range -----------------------------------------------------------------

void broadcast(LaneBuilder& b, Algorithm a, int r, int p, int root, Range w) {
  const int v = mod(r - root, p);
  auto real = [&](int u) { return mod(u + root, p); };
  switch (a) {
    case Algorithm::ring:  // a chain 0 -> 1 -> ... -> p-1 in virtual ranks
      if (v > 0) b.copy(real(v - 1), w);
      b.next();
      if (v + 1 < p) b.send(real(v + 1), w);
      b.next();
      return;
    case Algorithm::tree:
      if (v > 0) b.copy(real((v - 1) / 2), w);
      b.next();
      for (int c : {2 * v + 1, 2 * v + 2}) {
        if (c < p) b.send(real(c), w);
      }
      b.next();
      return;
    case Algorithm::rhd: {  // binomial tree
      int mask = 1;
      while (mask < p) {
        if (v & mask) {
          b.copy(real(v - mask), w);
          b.next();
          break;
        }
        mask <<= 1;
      }
      for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < p) b.send(real(v + mask), w);
      }
      b.next();
      return;
    }
    default:  // star, clique: the root sends to everyone
      if (v == 0) {
        for (int u = 1; u < p; ++u) b.send(real(u), w);
      } else {
        b.copy(root, w);
      }
      b.next();
      return;
  }
}

// ---- block operations (allgather, reduce_scatter, gather) -------------------------------------

// Block i of p (count elements each), or of a lane only its part `part` (a range within a block).
struct Blocks {
  std::size_t count;
  Range part{0, count};
  Range operator[](int i) const {
    return Range{static_cast<std::size_t>(i) * count + part.begin, part.count};
  }
};

// Virtual ranks of the binary-tree subtree under v, in preorder.
void subtree(int v, int p, std::vector<int>& out) {
  if (v >= p) return;
  out.push_back(v);
  subtree(2 * v + 1, p, out);
  subtree(2 * v + 2, p, out);
}

// Collects every block of v's subtree at v (virtual ranks rotated by root).
void tree_gather_up(LaneBuilder& b, int r, int p, int root, Blocks B) {
  const int v = mod(r - root, p);
  auto real = [&](int u) { return mod(u + root, p); };
  std::vector<int> nodes;
  for (int c : {2 * v + 1, 2 * v + 2}) {
    nodes.clear();
    subtree(c, p, nodes);
    for (int u : nodes) b.copy(real(c), B[real(u)]);
  }
  b.next();
  if (v > 0) {
    nodes.clear();
    subtree(v, p, nodes);
    for (int u : nodes) b.send(real((v - 1) / 2), B[real(u)]);
    b.next();
  }
}

void all_blocks(LaneBuilder& b, XferKind k, int peer, int p, Blocks B) {
  for (int i = 0; i < p; ++i) {
    if (k == XferKind::send) b.send(peer, B[i]);
    if (k == XferKind::recv_copy) b.copy(peer, B[i]);
    if (k == XferKind::recv_reduce) b.reduce(peer, B[i]);
  }
}

bool pow2(int p) { return std::has_single_bit(static_cast<unsigned>(p)); }

void allgather(LaneBuilder& b, Algorithm a, int r, int p, Blocks B) {
  if (a == Algorithm::rhd && !pow2(p)) a = Algorithm::ring;
  switch (a) {
    case Algorithm::ring:
      for (int s = 0; s < p - 1; ++s) {
        b.send(mod(r + 1, p), B[mod(r - s, p)]);
        b.copy(mod(r - 1, p), B[mod(r - s - 1, p)]);
        b.next();
      }
      return;
    case Algorithm::rhd:  // recursive doubling
      for (int d = 1; d < p; d *= 2) {
        const int partner = r ^ d;
        const int mine = r & ~(d - 1), theirs = partner & ~(d - 1);
        for (int i = 0; i < d; ++i) b.send(partner, B[mine + i]);
        for (int i = 0; i < d; ++i) b.copy(partner, B[theirs + i]);
        b.next();
      }
      return;
    case Algorithm::clique:
      for (int q = 0; q < p; ++q) {
        if (q != r) b.send(q, B[r]);
      }
      for (int q = 0; q < p; ++q) {
        if (q != r) b.copy(q, B[q]);
      }
      b.next();
      return;
    case Algorithm::tree:
      tree_gather_up(b, r, p, 0, B);
      if (r > 0) {
        all_blocks(b, XferKind::recv_copy, (r - 1) / 2, p, B);
        b.next();
      }
      for (int c : {2 * r + 1, 2 * r + 2}) {
        if (c < p) all_blocks(b, XferKind::send, c, p, B);
      }
      b.next();
      return;
    default:  // star
      if (r == 0) {
        for (int q = 1; q < p; ++q) b.copy(q, B[q]);
        b.next();
        for (int q = 1; q < p; ++q) all_blocks(b, XferKind::send, q, p, B);
        b.next();
      } else {
        b.send(0, B[r]);
        b.next();
        all_blocks(b, XferKind::recv_copy, 0, p, B);
        b.next();
      }
      return;
  }
}

void reduce_scatter(LaneBuilder& b, Algorithm a, int r, int p, Blocks B) {
  if (a == Algorithm::rhd && !pow2(p)) a = Algorithm::ring;
  switch (a) {
    case Algorithm::ring:  // rank r ends owning block r
      for (int s = 0; s < p - 1; ++s) {
        b.send(mod(r + 1, p), B[mod(r - s - 1, p)]);
        b.reduce(mod(r - 1, p), B[mod(r - s - 2, p)]);
        b.next();
      }
      return;
    case Algorithm::rhd: {  // recursive halving
      int lo = 0, hi = p;
      for (int d = p / 2; d >= 1; d /= 2) {
        const int partner = r ^ d;
        const int mid = (lo + hi) / 2;
        const bool upper = (r & d) != 0;
        for (int i = upper ? lo : mid; i < (upper ? mid : hi); ++i) b.send(partner, B[i]);
        for (int i = upper ? mid : lo; i < (upper ? hi : mid); ++i) b.reduce(partner, B[i]);
        (upper ? lo : hi) = mid;
        b.next();
      }
      return;
    }
    case Algorithm::clique:
      for (int q = 0; q < p; ++q) {
        if (q != r) b.send(q, B[q]);
      }
      for (int q = 0; q < p; ++q) {
        if (q != r) b.reduce(q, B[r]);
      }
      b.next();
      return;
    case Algorithm::tree:
    default: {  // reduce everything at rank 0 (tree or star), then scatter the blocks from there
      if (a == Algorithm::tree) {
        for (int c : {2 * r + 1, 2 * r + 2}) {
          if (c < p) all_blocks(b, XferKind::recv_reduce, c, p, B);
        }
        b.next();
        if (r > 0) all_blocks(b, XferKind::send, (r - 1) / 2, p, B);
        b.next();
      } else if (r == 0) {
        for (int q = 1; q < p; ++q) all_blocks(b, XferKind::recv_reduce, q, p, B);
        b.next();
      } else {
        all_blocks(b, XferKind::send, 0, p, B);
        b.next();
      }
      if (r == 0) {
        for (int q = 1; q < p; ++q) b.send(q, B[q]);
      } else {
        b.copy(0, B[r]);
      }
      b.next();
      return;
    }
  }
}

void gather(LaneBuilder& b, Algorithm a, int r, int p, int root, Blocks B) {
  if (a == Algorithm::tree) {
    tree_gather_up(b, r, p, root, B);
    return;
  }
  if (r == root) {
    for (int q = 0; q < p; ++q) {
      if (q != root) b.copy(q, B[q]);
    }
  } else {
    b.send(root, B[r]);
  }
  b.next();
}

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
    LaneBuilder b;
    const Range w = sub(Range{0, req.count}, lanes, l);
    const Blocks B{req.count, sub(Range{0, req.count}, lanes, l)};
    switch (req.op) {
      case CollOp::allreduce:
      case CollOp::barrier:
      case CollOp::consensus:
        switch (a) {
          case Algorithm::ring: allreduce_ring(b, r, p, w); break;
          case Algorithm::rhd:
            if (req.count <= req.rd_max_count) {
              allreduce_rd(b, r, p, w);
            } else {
              allreduce_rhd(b, r, p, w);
            }
            break;
          case Algorithm::tree: allreduce_tree(b, r, p, w); break;
          case Algorithm::clique: allreduce_clique(b, r, p, w); break;
          case Algorithm::hierarchical:
            allreduce_hierarchical(b, r, p, w, req.hosts.get(), req.rd_max_count);
            break;
          default: allreduce_star(b, r, p, w); break;
        }
        break;
      case CollOp::broadcast: broadcast(b, a, r, p, req.root, w); break;
      case CollOp::allgather: allgather(b, a, r, p, B); break;
      case CollOp::reduce_scatter: reduce_scatter(b, a, r, p, B); break;
      case CollOp::gather: gather(b, a, r, p, req.root, B); break;
    }
    Lane lane = b.finish();
    normalise(lane, req.max_xfer_count);
    plan.lanes.push_back(std::move(lane));
  }
  return plan;
}

}  // namespace kf::coll
