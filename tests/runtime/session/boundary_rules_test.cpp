// SPDX-License-Identifier: Apache-2.0
// The step boundary's rules over hand-made records: no sockets, no peers.
#include "session/boundary_rules.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
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
  pack(BoundaryRecord{5, 9, 100, 4, 33}, std::vector{1.0, 10.0}, layout,
       std::span(all).subspan(0, layout.words()));
  pack(BoundaryRecord{6, 9, 0, 0}, std::vector{3.0, 20.0}, layout,
       std::span(all).subspan(layout.words(), layout.words()));
  EXPECT_EQ(all[layout.monitor_at()], -1);  // the monitors' words are not touched
  const auto records = unpack(all, layout);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].version_seen, 5u);
  EXPECT_EQ(records[0].doc_bytes, 100u);
  EXPECT_EQ(records[0].steps, 33);
  EXPECT_EQ(records[0].ready_version, 4u);
  EXPECT_EQ(records[1].version_seen, 6u);
  EXPECT_EQ(average_metrics(all, layout), (std::vector{2.0, 15.0}));
}

// ---- BoundaryAgreement: boundaries on change ----

TEST(BoundaryAgreement, AReasonOfItsOwnTakesTheNextBoundaryAndAsksTheOthers) {
  BoundaryAgreement a;
  EXPECT_EQ(a.at_step_end(false), (BoundaryAgreement::Verdict{false, false, 0}));
  EXPECT_EQ(a.at_step_end(true), (BoundaryAgreement::Verdict{true, true, 1}));
  a.passed(1);
  EXPECT_EQ(a.at_step_end(false).take, false);
  EXPECT_EQ(a.at_step_end(true), (BoundaryAgreement::Verdict{true, true, 2}));
}

TEST(BoundaryAgreement, ARequestIsTakenWithoutAskingAgainAndAnOldOneIsNews) {
  BoundaryAgreement a;
  a.heard(1);
  EXPECT_EQ(a.at_step_end(false), (BoundaryAgreement::Verdict{true, false, 1}));
  EXPECT_EQ(a.at_step_end(true), (BoundaryAgreement::Verdict{true, false, 1}));
  a.passed(1);
  a.heard(1);  // a second worker asked for the same boundary: passed already
  EXPECT_EQ(a.at_step_end(false).take, false);
  a.restart();  // a new version numbers from 1 again
  EXPECT_EQ(a.passed_count(), 0u);
  EXPECT_EQ(a.at_step_end(false).take, false);
  EXPECT_EQ(a.at_step_end(true).index, 1u);
}

// A discrete-time model of workers under boundaries on change: each steps at its own pace (one
// of them 3x slower), news reaches each at its own time, every request takes its own delay, and
// the control collective of boundary k completes only once every worker of the version entered
// it. A worker that died stops; the workers in a collective with it fail and recover into the
// next version, and the others join that recovery at their next boundary, which their watch
// (a reason of their own) asks for.
class AgreementModel {
 public:
  struct Worker {
    BoundaryAgreement agreement;
    double step_time = 1;
    double step_ends = 1;
    bool own = false;  // a reason of its own, until its next boundary
    bool in_boundary = false;
    bool recovering = false;
    std::uint64_t version = 1;
    std::uint64_t at = 0;  // the boundary it is in
    bool dead = false;
    // (version, number) of each boundary passed, in order
    std::vector<std::pair<std::uint64_t, std::uint64_t>> passed;
  };

  AgreementModel(int n, std::uint64_t seed, double max_delay) : rng_(seed), max_delay_(max_delay) {
    workers_.resize(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      workers_[i].step_time = i == 1 ? 3.0 : 1.0 + 0.1 * static_cast<double>(i);
      workers_[i].step_ends = workers_[i].step_time;
    }
  }

  void news(int w, double at) { news_.push_back({at, w}); }
  /// Worker `w` dies at `at`; a request it sends from then on reaches only `reach` workers.
  void kill(int w, double at, int reach) {
    kill_ = w;
    kill_at_ = at;
    reach_ = reach;
  }
  const std::vector<Worker>& workers() const { return workers_; }
  int deadlocks() const { return deadlocks_; }

  void run(double until) {
    for (double t = 0; t <= until; t += 0.05) tick(t);
  }

 private:
  struct Message {
    double arrives;
    int to;
    std::uint64_t version, index;
  };

  std::vector<int> live() const {
    std::vector<int> out;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      if (!workers_[i].dead) out.push_back(static_cast<int>(i));
    }
    return out;
  }

  void tick(double t) {
    for (auto it = news_.begin(); it != news_.end();) {
      if (it->first <= t) {
        workers_[static_cast<std::size_t>(it->second)].own = true;
        it = news_.erase(it);
      } else {
        ++it;
      }
    }
    if (kill_ >= 0 && t >= kill_at_ && !workers_[static_cast<std::size_t>(kill_)].dead &&
        workers_[static_cast<std::size_t>(kill_)].in_boundary) {
      workers_[static_cast<std::size_t>(kill_)].dead = true;
      // Whoever waits in a collective with it fails at once; the rest hear of it from the watch.
      for (int w : live()) {
        auto& x = workers_[static_cast<std::size_t>(w)];
        if (x.in_boundary) {
          x.in_boundary = false;
          x.recovering = true;
        } else {
          news_.push_back({t + 2.0, w});
        }
      }
    }
    for (int w : live()) step_end(w, t);
    complete(t);
  }

  void step_end(int w, double t) {
    auto& x = workers_[static_cast<std::size_t>(w)];
    if (x.in_boundary || x.recovering || x.step_ends > t) return;
    for (auto it = mail_.begin(); it != mail_.end();) {
      if (it->to == w && it->arrives <= t) {
        if (it->version == x.version) x.agreement.heard(it->index);  // else: another version's
        it = mail_.erase(it);
      } else {
        ++it;
      }
    }
    const auto verdict = x.agreement.at_step_end(x.own);
    if (!verdict.take) {
      x.step_ends = t + x.step_time;
      return;
    }
    if (kill_ >= 0 && workers_[static_cast<std::size_t>(kill_)].dead) {
      x.recovering = true;  // its collective fails: the version has a dead member
      return;
    }
    if (verdict.ask_others) {
      int sent = 0;
      std::uniform_real_distribution<double> delay(0, max_delay_);
      for (int o : live()) {
        if (o == w) continue;
        if (w == kill_ && sent >= reach_) break;
        mail_.push_back({t + delay(rng_), o, x.version, verdict.index});
        ++sent;
      }
    }
    x.in_boundary = true;
    x.at = verdict.index;
  }

  void complete(double t) {
    const auto alive = live();
    // Every live worker recovering: they form the next version together.
    if (std::all_of(alive.begin(), alive.end(),
                    [&](int w) { return workers_[static_cast<std::size_t>(w)].recovering; })) {
      for (int w : alive) {
        auto& x = workers_[static_cast<std::size_t>(w)];
        x.recovering = false;
        ++x.version;
        x.agreement.restart();
        x.own = false;
        x.step_ends = t + x.step_time;
      }
      kill_ = -1;
      return;
    }
    // Workers waiting in boundaries of different numbers would wait for each other for ever.
    std::uint64_t first = 0;
    for (int w : alive) {
      const auto& x = workers_[static_cast<std::size_t>(w)];
      if (!x.in_boundary) continue;
      if (first == 0) first = x.at;
      if (x.at != first) ++deadlocks_;
    }
    if (!std::all_of(alive.begin(), alive.end(),
                     [&](int w) { return workers_[static_cast<std::size_t>(w)].in_boundary; })) {
      return;
    }
    for (int w : alive) {
      auto& x = workers_[static_cast<std::size_t>(w)];
      x.agreement.passed(x.at);
      x.passed.emplace_back(x.version, x.at);
      x.in_boundary = false;
      x.own = false;
      x.step_ends = t + x.step_time;
    }
  }

  std::mt19937_64 rng_;
  double max_delay_;
  std::vector<Worker> workers_;
  std::vector<std::pair<double, int>> news_;
  std::vector<Message> mail_;
  int kill_ = -1, reach_ = 0;
  double kill_at_ = 0;
  int deadlocks_ = 0;
};

TEST(BoundaryAgreement, EveryWorkerPassesTheSameBoundariesWhateverOrderTheNewsArrivesIn) {
  for (std::uint64_t seed = 1; seed <= 100; ++seed) {
    AgreementModel model(4, seed, 5.0);  // requests slower than a step, or faster
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> who(0, 3);
    std::uniform_real_distribution<double> when(0, 200);
    // Some news reaches one worker, some several at different times, some all.
    for (int i = 0; i < 12; ++i) model.news(who(rng), when(rng));
    const double t = when(rng);
    for (int w = 0; w < 4; ++w) model.news(w, t + 0.3 * w);
    model.run(260);
    ASSERT_EQ(model.deadlocks(), 0) << "seed " << seed;
    const auto& first = model.workers()[0].passed;
    EXPECT_FALSE(first.empty()) << "seed " << seed;
    for (const auto& x : model.workers()) {
      ASSERT_EQ(x.passed, first) << "seed " << seed;
      EXPECT_FALSE(x.own) << "news not acted on, seed " << seed;
      EXPECT_FALSE(x.in_boundary) << "seed " << seed;
    }
    for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].second, i + 1);
  }
}

TEST(BoundaryAgreement, AWorkerThatLearnsLateStillTakesTheAgreedBoundary) {
  // Only worker 2 has news; the slow worker 1 hears of it last, after every other one waits.
  AgreementModel model(4, 7, 20.0);
  model.news(2, 10);
  model.run(60);
  ASSERT_EQ(model.deadlocks(), 0);
  for (const auto& x : model.workers()) {
    EXPECT_EQ(x.passed, (std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 1}}));
  }
}

TEST(BoundaryAgreement, ALossDuringTheAgreementEndsTheVersionAndNumberingStartsAgain) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    for (int reach = 0; reach <= 3; ++reach) {
      // Worker 3 asks for a boundary, reaches `reach` of the others, and dies in it.
      AgreementModel model(5, seed, 3.0);
      model.news(3, 5);
      model.kill(3, 5, reach);
      model.news(0, 40);  // news in the next version
      model.news(4, 41);
      model.run(100);
      ASSERT_EQ(model.deadlocks(), 0) << "seed " << seed << " reach " << reach;
      const auto& ref = model.workers()[0];
      EXPECT_EQ(ref.version, 2u) << "seed " << seed << " reach " << reach;
      const auto next = std::find_if(ref.passed.begin(), ref.passed.end(),
                                     [](const auto& b) { return b.first == 2; });
      ASSERT_NE(next, ref.passed.end()) << "seed " << seed << " reach " << reach;
      EXPECT_EQ(next->second, 1u);  // the new version's first boundary is its number 1
      for (std::size_t w = 0; w < 5; ++w) {
        if (w == 3) continue;
        EXPECT_EQ(model.workers()[w].version, 2u);
        EXPECT_EQ(model.workers()[w].passed, ref.passed) << "seed " << seed << " w " << w;
      }
    }
  }
}

}  // namespace
}  // namespace kf::detail
