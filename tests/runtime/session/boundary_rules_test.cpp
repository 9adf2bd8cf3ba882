// SPDX-License-Identifier: Apache-2.0
// The step boundary's rules over hand-made records: no sockets, no peers.
#include "session/boundary_rules.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace kf::detail {
namespace {

using Action = BoundaryDecision::Action;

Cluster cluster(std::uint64_t version, std::vector<std::uint16_t> ports) {
  Cluster c;
  c.version = version;
  int slot = 0;
  for (auto p : ports) c.workers.push_back(WorkerSpec{{"127.0.0.1", p}, slot++});
  return c;
}

BoundaryRecord seen(std::uint64_t version, std::uint64_t bytes = 0, std::uint64_t ready = 0) {
  return BoundaryRecord{version, 7, bytes, ready};
}

TEST(Decide, NothingNewerStays) {
  const Cluster current = cluster(3, {1, 2, 3});
  const std::vector<BoundaryRecord> records{seen(3), seen(3), seen(3)};
  EXPECT_EQ(decide({current, nullptr, 0}, records).action, Action::stay);
}

TEST(Decide, FetchesANewerVersionFromTheLowestRankThatHoldsIt) {
  const Cluster current = cluster(3, {1, 2, 3});
  const std::vector<BoundaryRecord> records{seen(3), seen(5, 120), seen(5, 121)};
  EXPECT_EQ(decide({current, nullptr, 0}, records),
            (BoundaryDecision{Action::fetch_newer, 1, 120}));
  // The newest version wins over a newer-than-current one seen first.
  const std::vector<BoundaryRecord> mixed{seen(4, 90), seen(3), seen(6, 150)};
  EXPECT_EQ(decide({current, nullptr, 0}, mixed), (BoundaryDecision{Action::fetch_newer, 2, 150}));
}

TEST(Decide, ARefusedVersionIsNotFetchedAgainButANewerOneIs) {
  const Cluster current = cluster(3, {1, 2});
  EXPECT_EQ(decide({current, nullptr, 5}, std::vector{seen(5, 10), seen(5, 10)}).action,
            Action::stay);
  EXPECT_EQ(decide({current, nullptr, 5}, std::vector{seen(6, 10), seen(5, 10)}).action,
            Action::fetch_newer);
}

TEST(Decide, PendingChangeWaitsUntilEverySurvivorReachedItsJoiners) {
  const Cluster current = cluster(3, {1, 2});
  const Cluster pending = cluster(4, {1, 2, 9});  // 9 joins
  EXPECT_EQ(decide({current, &pending, 0}, std::vector{seen(4, 0, 4), seen(4, 0, 0)}).action,
            Action::wait_for_joiners);
  EXPECT_EQ(decide({current, &pending, 0}, std::vector{seen(4, 0, 4), seen(4, 0, 4)}).action,
            Action::switch_to_pending);
}

TEST(Decide, PendingChangeIgnoresLeaversAndIsSupersededByANewerVersion) {
  const Cluster current = cluster(3, {1, 2});
  const Cluster pending = cluster(4, {1, 9});  // 2 leaves, 9 joins: only 1 must be ready
  EXPECT_EQ(decide({current, &pending, 0}, std::vector{seen(4, 0, 4), seen(4, 0, 0)}).action,
            Action::switch_to_pending);
  EXPECT_EQ(decide({current, &pending, 0}, std::vector{seen(4, 0, 4), seen(5, 77, 0)}),
            (BoundaryDecision{Action::fetch_newer, 1, 77}));
}

TEST(JudgeNewer, OverMaxWorkersIsRefused) {
  ClusterSettings s;
  s.max_workers = 2;
  const auto v = judge_newer(cluster(4, {1, 2, 3}), s, cluster(3, {1, 2}));
  EXPECT_EQ(v.action, NewerVerdict::Action::refuse);
  EXPECT_EQ(v.reason, "3 workers exceed max_workers 2");
}

TEST(JudgeNewer, AMistypedMaxWorkersBoundsNothingInsteadOfThrowing) {
  const Cluster target = [] {
    Cluster c = cluster(4, {1, 2, 3});
    c.settings = {{"max_workers", "2"}};
    return c;
  }();
  const auto parsed = parse_cluster_settings(target.settings);
  ASSERT_EQ(parsed.errors.size(), 1u);
  EXPECT_EQ(judge_newer(target, parsed.typed, cluster(3, {1, 2, 3})).action,
            NewerVerdict::Action::switch_now);
}

TEST(JudgeNewer, SameWorkersAreASettingsChangeAndJoinersAreWaitedFor) {
  const Cluster current = cluster(3, {1, 2});
  const auto same = judge_newer(cluster(4, {1, 2}), {}, current);
  EXPECT_EQ(same.kind, "settings");
  EXPECT_EQ(same.action, NewerVerdict::Action::switch_now);
  const auto shrink = judge_newer(cluster(4, {1}), {}, current);
  EXPECT_EQ(shrink.kind, "resize");
  EXPECT_EQ(shrink.action, NewerVerdict::Action::switch_now);
  const auto grow = judge_newer(cluster(4, {1, 2, 5}), {}, current);
  EXPECT_EQ(grow.kind, "resize");
  EXPECT_EQ(grow.action, NewerVerdict::Action::wait_for_joiners);
}

TEST(Record, PacksAndUnpacksAndAveragesMetricsInRankOrder) {
  const RecordLayout layout{2, 2};
  std::vector<std::int64_t> all(2 * layout.words(), -1);
  pack(BoundaryRecord{5, 9, 100, 4}, std::vector{1.0, 10.0}, layout,
       std::span(all).subspan(0, layout.words()));
  pack(BoundaryRecord{6, 9, 0, 0}, std::vector{3.0, 20.0}, layout,
       std::span(all).subspan(layout.words(), layout.words()));
  EXPECT_EQ(all[layout.monitor_at()], -1);  // the monitors' words are not touched
  const auto records = unpack(all, layout);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].version_seen, 5u);
  EXPECT_EQ(records[0].doc_bytes, 100u);
  EXPECT_EQ(records[0].ready_version, 4u);
  EXPECT_EQ(records[1].version_seen, 6u);
  EXPECT_EQ(average_metrics(all, layout), (std::vector{2.0, 15.0}));
}

}  // namespace
}  // namespace kf::detail
