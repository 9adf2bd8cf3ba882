// SPDX-License-Identifier: Apache-2.0
// Runs every plan for every rank over an in-memory simulator (no sockets): messages go into
// per-(sender, receiver, lane) FIFO queues as snapshots taken when a step starts; a step ends
// when all its receives can be matched. Checks results, bitwise agreement between ranks, that
// message sizes match on both sides, and that nothing deadlocks or is left unreceived.
#include "coll/plan/plan.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace kf::coll {
namespace {

using Vec = std::vector<std::int64_t>;

struct SimResult {
  std::vector<Vec> work;
  std::string error;
};

SimResult simulate(CollOp op, Algorithm a, int p, std::size_t count, int root, int lanes,
                   const std::vector<Vec>& init, std::size_t max_xfer = 0, std::size_t rd_max = 0,
                   std::shared_ptr<const std::vector<int>> hosts = nullptr) {
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
  };
  std::vector<std::vector<Cursor>> cur(p);
  for (int r = 0; r < p; ++r) cur[r].resize(plans[r].lanes.size());
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      for (std::size_t l = 0; l < plans[r].lanes.size(); ++l) {
        auto& c = cur[r][l];
        const auto& steps = plans[r].lanes[l].steps;
        if (c.step >= steps.size()) continue;
        const Step& st = steps[c.step];
        if (!c.started) {
          for (const auto& x : st.xfers) {
            if (x.kind != XferKind::send) continue;
            Vec snap(res.work[r].begin() + x.offset, res.work[r].begin() + x.offset + x.count);
            queues[{r, x.peer, static_cast<int>(l)}].push_back(std::move(snap));
          }
          c.started = true;
          progress = true;
        }
        // Can every receive be matched?
        std::map<int, std::size_t> need;
        for (const auto& x : st.xfers) {
          if (x.kind != XferKind::send) need[x.peer]++;
        }
        bool ok = true;
        for (auto [src, n] : need) {
          if (queues[{src, r, static_cast<int>(l)}].size() < n) ok = false;
        }
        if (!ok) continue;
        std::vector<std::pair<const Xfer*, Vec>> got;
        for (const auto& x : st.xfers) {
          if (x.kind == XferKind::send) continue;
          auto& q = queues[{x.peer, r, static_cast<int>(l)}];
          Vec m = std::move(q.front());
          q.pop_front();
          if (m.size() != x.count) {
            res.error = "size mismatch at rank " + std::to_string(r);
            return res;
          }
          got.emplace_back(&x, std::move(m));
        }
        for (auto& [x, m] : got) {
          for (std::size_t i = 0; i < x->count; ++i) {
            auto& dst = res.work[r][x->offset + i];
            dst = x->kind == XferKind::recv_copy ? m[i] : dst + m[i];
          }
        }
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
