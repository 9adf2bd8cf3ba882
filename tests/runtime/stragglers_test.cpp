// SPDX-License-Identifier: Apache-2.0
// The straggler scores (kf/runtime/stragglers.hpp) on steps of known speeds.
#include "kf/runtime/stragglers.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kf {
namespace {

// One boundary where worker i trained 100 samples at speeds[i] samples per second.
std::vector<StragglerSample> step_at(const std::vector<double>& speeds,
                                     const std::vector<std::string>& names = {}) {
  std::vector<StragglerSample> step;
  for (std::size_t i = 0; i < speeds.size(); ++i) {
    const std::string name = names.empty() ? "w" + std::to_string(i) : names[i];
    step.push_back({name, 100.0, 100.0 / speeds[i]});
  }
  return step;
}

TEST(Stragglers, AWorkerThreeTimesSlowerScoresAThirdAndTurnsSlowOnce) {
  StragglerTracker t;  // window 20, scored after 3, slow below 0.7, recovered above 0.85
  std::vector<StragglerChange> all;
  for (int b = 0; b < 2; ++b) {
    EXPECT_TRUE(t.update(step_at({300, 300, 300, 100})).empty());
    EXPECT_TRUE(t.scores().empty()) << "scored before its window held 3 boundaries";
  }
  for (int b = 0; b < 30; ++b) {
    for (auto& c : t.update(step_at({300, 300, 300, 100}))) all.push_back(c);
  }
  ASSERT_EQ(all.size(), 1U);
  EXPECT_EQ(all[0].score.worker, "w3");
  EXPECT_TRUE(all[0].slow);
  ASSERT_EQ(t.scores().size(), 4U);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(t.scores()[i].vs_fastest, 1.0);
    EXPECT_FALSE(t.scores()[i].slow);
  }
  EXPECT_DOUBLE_EQ(t.scores()[3].speed, 100.0);
  EXPECT_DOUBLE_EQ(t.scores()[3].vs_fastest, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(t.scores()[3].vs_own_best, 1.0);
  EXPECT_TRUE(t.scores()[3].slow);
  EXPECT_EQ(t.slow_count(), 1);
}

// Between the two thresholds a worker keeps what it was: no flapping around one line.
TEST(Stragglers, HysteresisKeepsAWorkerNearTheLineFromFlapping) {
  StragglerOptions o;
  o.window = 1;
  o.min_boundaries = 1;
  StragglerTracker t(o);
  int changes = 0;
  // 0.75 and 0.80 of the fastest: between slow_below and recover_above, never a change.
  for (int b = 0; b < 20; ++b) changes += static_cast<int>(t.update(step_at({100, 75})).size());
  for (int b = 0; b < 20; ++b) changes += static_cast<int>(t.update(step_at({100, 80})).size());
  EXPECT_EQ(changes, 0);
  auto c = t.update(step_at({100, 69}));
  ASSERT_EQ(c.size(), 1U);
  EXPECT_TRUE(c[0].slow);
  // Back up to 0.8: still slow until it passes 0.85.
  for (double v : {80.0, 75.0, 84.0, 72.0, 85.0}) {
    EXPECT_TRUE(t.update(step_at({100, v})).empty()) << v;
    EXPECT_TRUE(t.find("w1")->slow) << v;
  }
  c = t.update(step_at({100, 86}));
  ASSERT_EQ(c.size(), 1U);
  EXPECT_FALSE(c[0].slow);
  EXPECT_EQ(c[0].score.worker, "w1");
  EXPECT_DOUBLE_EQ(c[0].score.vs_fastest, 0.86);
}

// A job whose workers all slow down together has no straggler, but each one's score against its
// own best shows it (a fail-slow host).
TEST(Stragglers, ASlowdownOfEveryWorkerShowsAgainstItsOwnBest) {
  StragglerOptions o;
  o.window = 4;
  o.min_boundaries = 4;
  StragglerTracker t(o);
  for (int b = 0; b < 4; ++b) t.update(step_at({200, 200}));
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(t.update(step_at({100, 100})).empty());
  ASSERT_EQ(t.scores().size(), 2U);
  for (const auto& s : t.scores()) {
    EXPECT_DOUBLE_EQ(s.speed, 100.0) << "the window holds only the slow steps now";
    EXPECT_DOUBLE_EQ(s.vs_fastest, 1.0);
    EXPECT_DOUBLE_EQ(s.vs_own_best, 0.5);
    EXPECT_FALSE(s.slow);
  }
  // The window's speed is the ratio of its sums: 2 steps at 200 and 2 at 100 samples per second
  // take 0.5 + 0.5 + 1 + 1 s for 400 samples.
  for (int b = 0; b < 2; ++b) t.update(step_at({200, 200}));
  EXPECT_DOUBLE_EQ(t.scores()[0].speed, 400.0 / 3.0);
}

// Scores follow the worker's address, not its rank: a resize that renumbers the workers keeps
// their windows, and a worker that left is forgotten (one that comes back starts afresh).
TEST(Stragglers, WindowsFollowAddressesAcrossResizes) {
  StragglerOptions o;
  o.window = 5;
  o.min_boundaries = 3;
  StragglerTracker t(o);
  for (int b = 0; b < 5; ++b) t.update(step_at({300, 100, 300}, {"a", "b", "c"}));
  ASSERT_NE(t.find("b"), nullptr);
  EXPECT_TRUE(t.find("b")->slow);
  // "a" leaves; "b" is rank 0 now: still scored and slow, no change reported.
  EXPECT_TRUE(t.update(step_at({100, 300}, {"b", "c"})).empty());
  ASSERT_EQ(t.scores().size(), 2U);
  EXPECT_EQ(t.scores()[0].worker, "b");
  EXPECT_TRUE(t.scores()[0].slow);
  EXPECT_EQ(t.find("a"), nullptr);
  // "a" back: not scored until its new window holds 3 boundaries.
  t.update(step_at({300, 100, 300}, {"a", "b", "c"}));
  EXPECT_EQ(t.find("a"), nullptr);
}

// Steps without a compute time (a loop that does not call report_compute) add nothing: no
// score from them, and no division by zero.
TEST(Stragglers, StepsWithoutComputeTimeAreNotCounted) {
  StragglerOptions o;
  o.window = 3;
  o.min_boundaries = 1;
  StragglerTracker t(o);
  std::vector<StragglerSample> step{{"a", 100, 0}, {"b", 0, 0}};
  EXPECT_TRUE(t.update(step).empty());
  EXPECT_TRUE(t.scores().empty());
  step = {{"a", 100, 1}, {"b", 100, 0}};
  t.update(step);
  ASSERT_EQ(t.scores().size(), 1U);
  EXPECT_DOUBLE_EQ(t.scores()[0].vs_fastest, 1.0);
}

TEST(Stragglers, OptionsOutOfRangeAreNamed) {
  const auto refused = [](StragglerOptions o, const std::string& what) {
    try {
      StragglerTracker t(o);
      ADD_FAILURE() << what << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  StragglerOptions o;
  o.window = 0;
  refused(o, "window");
  o = {};
  o.min_boundaries = 21;
  refused(o, "min_boundaries");
  o = {};
  o.slow_below = 0;
  refused(o, "slow_below");
  o = {};
  o.recover_above = 0.5;
  refused(o, "recover_above");
}

}  // namespace
}  // namespace kf
