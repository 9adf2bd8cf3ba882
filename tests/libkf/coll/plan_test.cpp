// SPDX-License-Identifier: Apache-2.0
// Runs every plan for every rank over an in-memory simulator (no sockets): messages go into
// per-(sender, receiver, lane) FIFO queues as snapshots taken when a step starts; a step ends
// when all its receives are matched (optionally with receives of later steps posted ahead, as
// the engine posts them). Checks results, bitwise agreement between ranks, that
// message sizes match on both sides, and that nothing deadlocks or is left unreceived.
#include "coll/plan/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

namespace kf::coll {
namespace {

using Vec = std::vector<std::int64_t>;

struct SimResult {
  std::vector<Vec> work;
  std::string error;
  std::size_t posted_ahead = 0;  // receives posted before their step (SimOptions::ahead)
};

struct SimOptions {
  // Receives of later steps posted as the engine posts them (Engine::post_ahead, by
  // coll::may_post_ahead), and delivered as soon as their message is there: with the current
  // step's sends done when posted (the simulator's sends are), or all taken as still pending.
  enum class Ahead { off, sends_done, sends_pending } ahead = Ahead::off;
  // Reductions combine as dst = dst * 3 + msg, which the order of reductions into an element
  // changes, instead of dst + msg.
  bool order_sensitive = false;
  // Non-zero: each round, each lane of each rank moves on (starts or ends a step) only with
  // probability 1/2 (seeded by this), while messages still land in receives posted ahead, so
  // that slow lanes get later steps' messages early. Zero: every lane moves every round.
  unsigned seed = 0;
};

// A receive posted, in posting order; its message once matched.
struct Posted {
  std::size_t step;
  const Xfer* x;
  bool ahead;
  bool matched = false;
  Vec msg;
};

std::int64_t combine(std::int64_t dst, std::int64_t m, bool order_sensitive) {
  const auto d = static_cast<std::uint64_t>(dst);
  const auto v = static_cast<std::uint64_t>(m);
  return static_cast<std::int64_t>(order_sensitive ? d * 3 + v : d + v);
}

SimResult simulate(CollOp op, Algorithm a, int p, std::size_t count, int root, int lanes,
                   const std::vector<Vec>& init, std::size_t max_xfer = 0, std::size_t rd_max = 0,
                   std::shared_ptr<const std::vector<int>> hosts = nullptr, SimOptions opts = {}) {
  SimResult res;
  res.work = init;
  std::vector<Plan> plans;
  for (int r = 0; r < p; ++r) {
    PlanRequest req{op, a, r, p, count, root, lanes, max_xfer, rd_max, hosts};
    plans.push_back(make_plan(req));
  }
  std::map<std::tuple<int, int, int>, std::deque<Vec>> queues;  // (src, dst, lane)
  struct Cursor {
    std::size_t step = 0;
    bool started = false;
    std::deque<Posted> posted;
    std::size_t ahead_step = 0, ahead_xfer = 0;  // the next receive the ahead walk considers
  };
  std::vector<std::vector<Cursor>> cur(p);
  for (int r = 0; r < p; ++r) cur[r].resize(plans[r].lanes.size());
  auto apply = [&](int r, const Xfer& x, const Vec& m) {
    for (std::size_t i = 0; i < x.count; ++i) {
      auto& dst = res.work[r][x.offset + i];
      dst = x.kind == XferKind::recv_copy ? m[i] : combine(dst, m[i], opts.order_sensitive);
    }
  };
  std::mt19937 rng(opts.seed);
  bool progress = true;
  bool everyone = opts.seed == 0;  // every lane moves this round
  while (progress || !everyone) {
    if (!progress)
      everyone = true;  // a round of random skips did nothing: all move once
    else if (opts.seed != 0)
      everyone = false;
    progress = false;
    for (int r = 0; r < p; ++r) {
      for (std::size_t l = 0; l < plans[r].lanes.size(); ++l) {
        auto& c = cur[r][l];
        const Lane& lane = plans[r].lanes[l];
        const auto& steps = lane.steps;
        if (c.step >= steps.size()) continue;
        const Step& st = steps[c.step];
        const bool moves = everyone || (rng() & 1) != 0;
        if (!c.started && moves) {
          for (const auto& x : st.xfers) {
            if (x.kind != XferKind::send) continue;
            Vec snap(res.work[r].begin() + x.offset, res.work[r].begin() + x.offset + x.count);
            queues[{r, x.peer, static_cast<int>(l)}].push_back(std::move(snap));
          }
          for (const auto& x : st.xfers) {
            if (x.kind == XferKind::send) continue;
            const bool already = std::any_of(c.posted.begin(), c.posted.end(),
                                             [&](const Posted& e) { return e.x == &x; });
            if (!already) c.posted.push_back({c.step, &x, false});
          }
          if (opts.ahead != SimOptions::Ahead::off) {
            const bool done = opts.ahead == SimOptions::Ahead::sends_done;
            if (c.ahead_step <= c.step) {
              c.ahead_step = c.step + 1;
              c.ahead_xfer = 0;
            }
            bool stop = false;
            for (; !stop && c.ahead_step < steps.size(); ++c.ahead_step, c.ahead_xfer = 0) {
              const Step& later = steps[c.ahead_step];
              for (; c.ahead_xfer < later.xfers.size(); ++c.ahead_xfer) {
                const Xfer& x = later.xfers[c.ahead_xfer];
                if (x.kind == XferKind::send) continue;
                if ((x.kind == XferKind::recv_reduce && sole_reduction(later) != &x) ||
                    !may_post_ahead(lane, c.step, c.ahead_step, x,
                                    [&](std::size_t) { return done; })) {
                  stop = true;
                  break;
                }
                c.posted.push_back({c.ahead_step, &x, true});
                ++res.posted_ahead;
              }
              if (stop) break;
            }
          }
          c.started = true;
          progress = true;
        }
        // Messages to the receives posted, in posting order; those posted ahead land at once.
        for (auto& e : c.posted) {
          if (e.matched) continue;
          auto& q = queues[{e.x->peer, r, static_cast<int>(l)}];
          if (q.empty()) continue;
          e.msg = std::move(q.front());
          q.pop_front();
          e.matched = true;
          progress = true;
          if (e.msg.size() != e.x->count) {
            res.error = "size mismatch at rank " + std::to_string(r);
            return res;
          }
          if (e.ahead) apply(r, *e.x, e.msg);
        }
        // The step ends when all its receives are matched; the others are applied in plan order.
        if (!c.started || !moves) continue;
        const bool complete = std::all_of(c.posted.begin(), c.posted.end(), [&](const Posted& e) {
          return e.step != c.step || e.matched;
        });
        if (!complete) continue;
        for (const auto& e : c.posted) {
          if (e.step == c.step && !e.ahead) apply(r, *e.x, e.msg);
        }
        while (!c.posted.empty() && c.posted.front().step == c.step) c.posted.pop_front();
        c.step++;
        c.started = false;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    for (std::size_t l = 0; l < cur[r].size(); ++l) {
      if (cur[r][l].step < plans[r].lanes[l].steps.size()) {
        res.error = "deadlock: rank " + std::to_string(r) + " lane " + std::to_string(l);
        return res;
      }
    }
  }
  for (auto& [k, q] : queues) {
    if (!q.empty()) res.error = "unreceived message";
  }
  return res;
}

std::int64_t value(int rank, std::size_t i) {
  return static_cast<std::int64_t>(rank + 1) * 1000003 + static_cast<std::int64_t>(i * 7 + 1);
}

using Param = std::tuple<Algorithm, int, std::size_t>;

class PlanSweep : public ::testing::TestWithParam<Param> {};

TEST_P(PlanSweep, AllreduceSumsOnEveryRank) {
  auto [a, p, n] = GetParam();
  for (int variant : {0, 1, 2}) {
    const int lanes = variant == 1 ? 3 : 1;
    const std::size_t rd_max = variant == 2 ? n : 0;  // rhd: recursive doubling
    std::vector<Vec> init(p, Vec(n));
    for (int r = 0; r < p; ++r) {
      for (std::size_t i = 0; i < n; ++i) init[r][i] = value(r, i);
    }
    auto res = simulate(CollOp::allreduce, a, p, n, 0, lanes, init, 5, rd_max);
    ASSERT_EQ(res.error, "");
    for (int r = 0; r < p; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        std::int64_t want = 0;
        for (int q = 0; q < p; ++q) want += value(q, i);
        ASSERT_EQ(res.work[r][i], want) << "rank " << r << " i " << i << " lanes " << lanes;
      }
    }
  }
}

TEST_P(PlanSweep, BroadcastFromEveryRoot) {
  auto [a, p, n] = GetParam();
  for (int root = 0; root < p; ++root) {
    std::vector<Vec> init(p, Vec(n, -1));
    for (std::size_t i = 0; i < n; ++i) init[root][i] = value(root, i);
    auto res = simulate(CollOp::broadcast, a, p, n, root, 2, init);
    ASSERT_EQ(res.error, "");
    for (int r = 0; r < p; ++r) ASSERT_EQ(res.work[r], init[root]) << "root " << root;
  }
}

TEST_P(PlanSweep, AllgatherCollectsEveryBlock) {
  auto [a, p, n] = GetParam();
  std::vector<Vec> init(p, Vec(n * p, -1));
  Vec want(n * p);
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      init[r][r * n + i] = value(r, i);
      want[r * n + i] = value(r, i);
    }
  }
  for (int lanes : {1, 3}) {  // lanes take their part of every block
    auto res = simulate(CollOp::allgather, a, p, n, 0, lanes, init, 2);
    ASSERT_EQ(res.error, "");
    for (int r = 0; r < p; ++r) ASSERT_EQ(res.work[r], want) << "rank " << r << " lanes " << lanes;
  }
}

TEST_P(PlanSweep, ReduceScatterLeavesBlockRReduced) {
  auto [a, p, n] = GetParam();
  std::vector<Vec> init(p, Vec(n * p));
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < n * p; ++i) init[r][i] = value(r, i);
  }
  for (int lanes : {1, 3}) {
    auto res = simulate(CollOp::reduce_scatter, a, p, n, 0, lanes, init);
    ASSERT_EQ(res.error, "");
    for (int r = 0; r < p; ++r) {
      for (std::size_t i = r * n; i < (r + 1) * n; ++i) {
        std::int64_t want = 0;
        for (int q = 0; q < p; ++q) want += value(q, i);
        ASSERT_EQ(res.work[r][i], want) << "rank " << r << " lanes " << lanes;
      }
    }
  }
}

TEST_P(PlanSweep, GatherCollectsAtEveryRoot) {
  auto [a, p, n] = GetParam();
  for (int root = 0; root < p; ++root) {
    std::vector<Vec> init(p, Vec(n * p, -1));
    Vec want(n * p);
    for (int r = 0; r < p; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        init[r][r * n + i] = value(r, i);
        want[r * n + i] = value(r, i);
      }
    }
    auto res = simulate(CollOp::gather, a, p, n, root, 1, init);
    ASSERT_EQ(res.error, "");
    ASSERT_EQ(res.work[root], want) << "root " << root;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, PlanSweep,
                         ::testing::Combine(::testing::Values(Algorithm::star, Algorithm::ring,
                                                              Algorithm::tree, Algorithm::clique,
                                                              Algorithm::rhd,
                                                              Algorithm::hierarchical),
                                            ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 16),
                                            ::testing::Values(std::size_t{0}, std::size_t{1},
                                                              std::size_t{3}, std::size_t{17})),
                         [](const auto& tpi) {
                           return std::string(to_string(std::get<0>(tpi.param))) + "_p" +
                                  std::to_string(std::get<1>(tpi.param)) + "_n" +
                                  std::to_string(std::get<2>(tpi.param));
                         });

// Receives posted ahead of their step (coll::may_post_ahead, as the engine posts them) and
// delivered the moment their message exists leave every rank with the same values as receives
// posted at their step, with lanes moving on at random while messages land in receives posted
// ahead, under a combination that the order of reductions changes: no receive
// posted ahead lands on data a step before its own still reads or writes, and the peers'
// messages still match their receives in order (no deadlock, none left over).
TEST(PlanAhead, ReceivesPostedAheadGiveTheSameResults) {
  using Ahead = SimOptions::Ahead;
  std::size_t rhd4_ahead = 0;
  for (CollOp op : {CollOp::allreduce, CollOp::broadcast, CollOp::allgather, CollOp::reduce_scatter,
                    CollOp::gather}) {
    for (Algorithm a : {Algorithm::star, Algorithm::ring, Algorithm::tree, Algorithm::clique,
                        Algorithm::rhd, Algorithm::hierarchical}) {
      for (int p : {2, 3, 4, 5, 8, 9}) {
        for (std::size_t n : {std::size_t{1}, std::size_t{17}}) {
          for (int variant : {0, 1, 2}) {
            const int lanes = variant == 1 ? 3 : 1;
            const std::size_t rd_max = variant == 2 ? n : 0;
            const std::size_t work = op == CollOp::allreduce || op == CollOp::broadcast
                                         ? n
                                         : n * static_cast<std::size_t>(p);
            std::vector<Vec> init(p, Vec(work));
            for (int r = 0; r < p; ++r) {
              for (std::size_t i = 0; i < work; ++i) init[r][i] = value(r, i);
            }
            const int root = p / 2;
            SimOptions at_step;
            at_step.order_sensitive = true;
            const auto want = simulate(op, a, p, n, root, lanes, init, 5, rd_max, nullptr, at_step);
            ASSERT_EQ(want.error, "");
            for (unsigned seed : {1u, 2u, 3u})
              for (Ahead mode : {Ahead::sends_done, Ahead::sends_pending}) {
                SCOPED_TRACE(testing::Message()
                             << to_string(op) << " " << to_string(a) << " p " << p << " n " << n
                             << " variant " << variant << " seed " << seed << " sends "
                             << (mode == Ahead::sends_done ? "done" : "pending"));
                SimOptions ahead = at_step;
                ahead.ahead = mode;
                ahead.seed = seed;
                const auto got =
                    simulate(op, a, p, n, root, lanes, init, 5, rd_max, nullptr, ahead);
                ASSERT_EQ(got.error, "");
                for (int r = 0; r < p; ++r) ASSERT_EQ(got.work[r], want.work[r]) << "rank " << r;
                if (op == CollOp::allreduce && a == Algorithm::rhd && p == 4 && variant == 0 &&
                    mode == Ahead::sends_done) {
                  rhd4_ahead += got.posted_ahead;
                }
              }
          }
        }
      }
    }
  }
  // Halving-doubling with 4 workers: each posts its last step's receive (the half it sent in
  // the first step) and its third step's (the quarter it sent in the second) ahead.
  EXPECT_GT(rhd4_ahead, 0u);
}

// The rule itself on a lane written by hand: a receive may go ahead past the current step's
// sends that are done, never past a step in between that touches its range.
TEST(PlanAhead, AReceiveGoesAheadOnlyOverRangesNothingBeforeItTouches) {
  const Xfer s0{XferKind::send, 1, 0, 4}, r0{XferKind::recv_copy, 1, 4, 4};
  const Xfer s1{XferKind::send, 2, 8, 4}, r1{XferKind::recv_reduce, 2, 0, 4};
  const Xfer r2{XferKind::recv_copy, 2, 8, 4}, r2b{XferKind::recv_copy, 1, 12, 4};
  const Lane lane{{Step{{s0, r0}}, Step{{s1, r1}}, Step{{r2, r2b}}}};
  const auto done = [](std::size_t) { return true; };
  const auto pending = [](std::size_t) { return false; };
  // Step 1's reduction lands where step 0 sends from: only once that send is done.
  EXPECT_TRUE(may_post_ahead(lane, 0, 1, r1, done));
  EXPECT_FALSE(may_post_ahead(lane, 0, 1, r1, pending));
  // Step 2's first receive lands where step 1 sends from: not from step 0, whatever is done.
  EXPECT_FALSE(may_post_ahead(lane, 0, 2, r2, done));
  EXPECT_TRUE(may_post_ahead(lane, 1, 2, r2, done));
  EXPECT_FALSE(may_post_ahead(lane, 1, 2, r2, pending));
  // Step 2's second receive lands where nothing before it goes.
  EXPECT_TRUE(may_post_ahead(lane, 0, 2, r2b, pending));
  // The reduction of a step is its sole one unless a send of the step reads its range.
  EXPECT_EQ(sole_reduction(lane.steps[1]), &lane.steps[1].xfers[1]);
  EXPECT_EQ(sole_reduction(Step{{r1, Xfer{XferKind::send, 3, 2, 4}}}), nullptr);
  EXPECT_EQ(sole_reduction(Step{{r1, Xfer{XferKind::recv_reduce, 3, 8, 4}}}), nullptr);
  EXPECT_EQ(sole_reduction(Step{{s0, r0}}), nullptr);
}

// Hierarchical allreduce over uneven, interleaved and single-host layouts, with lanes, split
// transfers and recursive doubling among the owners: every rank gets the sum, and data crosses
// hosts only between owners of the same shard (the j-th workers of their hosts).
TEST(PlanHierarchical, SumsOverEveryHostLayout) {
  const std::vector<std::vector<int>> layouts{
      {0, 0, 1, 1, 2, 2},       {0, 0, 0, 1, 1, 2},         {7, 3, 7, 3}, {0, 0, 0, 0}, {0, 1, 2},
      {0, 0, 1, 1, 1, 1, 2, 2}, {4, 4, 4, 9, 9, 9, 1, 1, 1}};
  for (const auto& layout : layouts) {
    const int p = static_cast<int>(layout.size());
    auto hosts = std::make_shared<const std::vector<int>>(layout);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{40}}) {
      for (int variant : {0, 1, 2}) {
        const int lanes = variant == 1 ? 3 : 1;
        const std::size_t rd_max = variant == 2 ? n : 0;
        std::vector<Vec> init(p, Vec(n));
        for (int r = 0; r < p; ++r) {
          for (std::size_t i = 0; i < n; ++i) init[r][i] = value(r, i);
        }
        auto res = simulate(CollOp::allreduce, Algorithm::hierarchical, p, n, 0, lanes, init, 7,
                            rd_max, hosts);
        ASSERT_EQ(res.error, "") << "p " << p << " n " << n;
        for (int r = 0; r < p; ++r) {
          for (std::size_t i = 0; i < n; ++i) {
            std::int64_t want = 0;
            for (int q = 0; q < p; ++q) want += value(q, i);
            ASSERT_EQ(res.work[r][i], want) << "layout p " << p << " rank " << r << " i " << i;
          }
        }
      }
    }
    // Only owners of the same shard talk across hosts: the j-th worker of each host.
    auto local_index = [&](int q) {
      int k = 0;
      for (int x = 0; x < q; ++x) k += layout[x] == layout[q] ? 1 : 0;
      return k;
    };
    for (int r = 0; r < p; ++r) {
      const Plan plan = make_plan(
          PlanRequest{CollOp::allreduce, Algorithm::hierarchical, r, p, 1000, 0, 1, 0, 0, hosts});
      for (const auto& st : plan.lanes.at(0).steps) {
        for (const auto& x : st.xfers) {
          if (layout[x.peer] == layout[r]) continue;
          EXPECT_EQ(local_index(x.peer), local_index(r)) << "rank " << r << " peer " << x.peer;
        }
      }
    }
  }
}

// Three hosts of two: each rank sends half the vector within its host and a third of its shard
// twice across hosts (a ring of three over 500 elements), where a flat ring of six sends 5/6
// of the vector twice, half of it to another host.
TEST(PlanHierarchical, CrossHostBytesAreTheOwnersRing) {
  const std::vector<int> layout{0, 0, 1, 1, 2, 2};
  auto hosts = std::make_shared<const std::vector<int>>(layout);
  for (int r = 0; r < 6; ++r) {
    const Plan plan = make_plan(
        PlanRequest{CollOp::allreduce, Algorithm::hierarchical, r, 6, 1200, 0, 1, 0, 0, hosts});
    std::size_t local = 0, cross = 0;
    for (const auto& st : plan.lanes.at(0).steps) {
      for (const auto& x : st.xfers) {
        if (x.kind != XferKind::send) continue;
        (layout[x.peer] == layout[r] ? local : cross) += x.count;
      }
    }
    EXPECT_EQ(local, 1200u) << "rank " << r;  // its other shard, then its own shard's result
    EXPECT_EQ(cross, 800u) << "rank " << r;   // 2 * (3-1)/3 * 600
  }
}

TEST(PlanHierarchical, HostsMustMatchTheRanks) {
  auto hosts = std::make_shared<const std::vector<int>>(std::vector<int>{0, 0, 1});
  EXPECT_THROW(make_plan(PlanRequest{CollOp::allreduce, Algorithm::hierarchical, 0, 4, 8, 0, 1, 0,
                                     0, hosts}),
               std::invalid_argument);
}

TEST(PlanSplit, PartsCoverTheRangeInOrder) {
  for (std::size_t n : {0u, 1u, 5u, 16u, 101u}) {
    for (int k = 1; k <= 9; ++k) {
      std::size_t next = 0;
      for (int i = 0; i < k; ++i) {
        Range r = split(n, k, i);
        EXPECT_EQ(r.begin, next);
        next += r.count;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(PlanRing, TwoRanksExchangeHalves) {
  Plan p0 = make_plan(PlanRequest{CollOp::allreduce, Algorithm::ring, 0, 2, 10, 0, 1, 0});
  ASSERT_EQ(p0.lanes.size(), 1u);
  ASSERT_EQ(p0.lanes[0].steps.size(), 2u);
  const auto& s0 = p0.lanes[0].steps[0].xfers;
  EXPECT_EQ(s0[0], (Xfer{XferKind::send, 1, 0, 5}));
  EXPECT_EQ(s0[1], (Xfer{XferKind::recv_reduce, 1, 5, 5}));
}

// Lanes of an allgather or reduce-scatter share the blocks out: rank 0 of a 3-rank ring sends
// two blocks' worth of elements in all, whatever the number of lanes, and each lane sends its
// own part of each block.
TEST(PlanRing, BlockLanesSplitEveryBlock) {
  for (CollOp op : {CollOp::allgather, CollOp::reduce_scatter}) {
    for (int lanes : {1, 2, 3}) {
      const Plan plan = make_plan(PlanRequest{op, Algorithm::ring, 0, 3, 10, 0, lanes, 0});
      ASSERT_EQ(plan.lanes.size(), static_cast<std::size_t>(lanes));
      std::size_t sent = 0;
      for (int l = 0; l < lanes; ++l) {
        const Range part = split(10, lanes, l);
        for (const auto& st : plan.lanes[l].steps) {
          for (const auto& x : st.xfers) {
            if (x.kind != XferKind::send) continue;
            sent += x.count;
            EXPECT_EQ(x.offset % 10, part.begin) << "lane " << l;
            EXPECT_EQ(x.count, part.count) << "lane " << l;
          }
        }
      }
      EXPECT_EQ(sent, 20u) << to_string(op) << " lanes " << lanes;
    }
  }
}

TEST(PlanLanes, TwoWorkersRunOneLaneMoreRunUpToEight) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  for (const Algorithm a : {Algorithm::ring, Algorithm::rhd, Algorithm::tree}) {
    EXPECT_EQ(default_lanes(CollOp::allreduce, a, 64 * MiB, 2), 1) << to_string(a);
    EXPECT_EQ(default_lanes(CollOp::allgather, a, 64 * MiB, 2), 1) << to_string(a);
    EXPECT_EQ(default_lanes(CollOp::allreduce, a, 4 * MiB, 4), 1) << to_string(a);
    EXPECT_EQ(default_lanes(CollOp::allreduce, a, 9 * MiB, 3), 2) << to_string(a);
    EXPECT_EQ(default_lanes(CollOp::allreduce, a, 64 * MiB, 4), 8) << to_string(a);
    EXPECT_EQ(default_lanes(CollOp::broadcast, a, 1024 * MiB, 8), 8) << to_string(a);
  }
  EXPECT_EQ(default_lanes(CollOp::allreduce, Algorithm::clique, 64 * MiB, 4), 1);
  EXPECT_EQ(default_lanes(CollOp::reduce_scatter, Algorithm::ring, 64 * MiB, 4), 1);
  EXPECT_EQ(default_lanes(CollOp::allreduce, Algorithm::ring, 64 * MiB, 1), 1);
}

TEST(PlanErrors, RootOutOfRangeIsRejected) {
  EXPECT_THROW(make_plan(PlanRequest{CollOp::broadcast, Algorithm::ring, 0, 3, 4, 3, 1, 0}),
               std::invalid_argument);
  EXPECT_THROW(make_plan(PlanRequest{CollOp::allreduce, Algorithm::auto_select, 0, 3, 4, 0, 1, 0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace kf::coll
