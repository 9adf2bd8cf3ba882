// SPDX-License-Identifier: Apache-2.0
// The schedules of coll::make_plan for the operations other than allreduce: broadcast over one
// range, and the block operations (allgather, reduce_scatter, gather) over each rank's block.
#include <bit>
#include <vector>

#include "coll/plan/builder.hpp"

namespace kf::coll::detail {

namespace {

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

}  // namespace

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

}  // namespace kf::coll::detail
