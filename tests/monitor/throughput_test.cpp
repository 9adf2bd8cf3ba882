// SPDX-License-Identifier: Apache-2.0
// The known answers KAT-THR-1..7, plus the window's warm-up, eviction and input
// checks. Known answers given rounded are checked to their last digit.
#include "kf/monitor/throughput.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

namespace kf::monitor {
namespace {

void expect_printed(double actual, double printed, int decimals) {
  EXPECT_LE(std::abs(actual - printed), 0.5 * std::pow(10.0, -decimals) * (1 + 1e-9))
      << "actual " << actual << " printed " << printed;
}

void expect_rel(double actual, double expected, double rel = 1e-12) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

const std::vector<double> kTimes{0.50, 0.52, 0.48, 0.55, 0.45};

ThroughputWindow window_without_warmup(std::size_t steps = 100) {
  return ThroughputWindow({.window_steps = steps, .warmup_steps = 0});
}

TEST(ThroughputKat, Thr1WindowIsTotalSamplesOverTotalTime) {
  ThroughputWindow w = window_without_warmup();
  double mean_of_rates = 0.0;
  for (double t : kTimes) {
    EXPECT_TRUE(w.record({256.0, 32.0, Seconds(t)}));
    mean_of_rates += 256.0 / t / kTimes.size();
  }
  expect_rel(w.job_samples_per_second(), 512.0);
  expect_rel(w.worker_samples_per_second(), 64.0);  // K = 8
  expect_printed(mean_of_rates, 514.396892, 6);     // the wrong answer
  EXPECT_GT(std::abs(w.job_samples_per_second() - mean_of_rates), 2.0);

  ThroughputWindow w2 = window_without_warmup();
  for (double t : {0.1, 0.1, 0.4}) w2.record({64.0, 64.0, Seconds(t)});
  expect_rel(w2.job_samples_per_second(), 320.0);  // the mean of rates would say 480
}

TEST(ThroughputKat, Thr2StepTimeEma) {
  StepTimeEma ema(0.9);
  EXPECT_TRUE(std::isnan(ema.step_time().count()));
  const std::vector<double> expected{0.5, 0.510526316, 0.499261993, 0.514015702, 0.498383434};
  for (std::size_t i = 0; i < kTimes.size(); ++i) {
    EXPECT_TRUE(ema.record(Seconds(kTimes[i])));
    expect_printed(ema.step_time().count(), expected[i], 9);
  }
  expect_printed(ema.samples_per_second(256.0), 513.660733, 6);
  EXPECT_FALSE(ema.record(Seconds(0.0)));
  EXPECT_FALSE(ema.record(Seconds(std::nan(""))));
  expect_printed(ema.step_time().count(), 0.498383434, 9);
}

const std::map<int, double> kScaling{{4, 400.0}, {8, 720.0}, {12, 900.0}, {16, 960.0}};

TEST(ThroughputKat, Thr3ScalingEfficiencyPerAddedWorker) {
  expect_rel(scaling_efficiency(4, 400.0, 8, 720.0), 0.8);
  expect_rel(scaling_efficiency(8, 720.0, 12, 900.0), 0.5);
  expect_rel(scaling_efficiency(12, 900.0, 16, 960.0), 0.2);

  const ScaleOutDecision at_01 = scale_out_decision(kScaling, {.threshold = 0.1});
  ASSERT_EQ(at_01.pairs.size(), 3u);
  const double slope[] = {80, 45, 15}, per_worker[] = {100, 90, 75}, s[] = {0.8, 0.5, 0.2};
  for (std::size_t i = 0; i < 3; ++i) {
    expect_rel(at_01.pairs[i].slope, slope[i]);
    expect_rel(at_01.pairs[i].per_worker_before, per_worker[i]);
    expect_rel(at_01.pairs[i].efficiency, s[i]);
    EXPECT_TRUE(at_01.pairs[i].pass);
  }
  EXPECT_EQ(at_01.action, ScaleOutDecision::Action::add);
  EXPECT_EQ(at_01.target_workers, 20);  // every pair passes: 16 + spawn_size 4

  const ScaleOutDecision at_025 = scale_out_decision(kScaling, {.threshold = 0.25});
  EXPECT_TRUE(at_025.pairs[0].pass);
  EXPECT_TRUE(at_025.pairs[1].pass);
  EXPECT_FALSE(at_025.pairs[2].pass);
  EXPECT_EQ(at_025.action, ScaleOutDecision::Action::settle);
  EXPECT_EQ(at_025.target_workers, 12);
}

TEST(ThroughputKat, Thr3SinglePointAddsAndEqualityFails) {
  const ScaleOutDecision one = scale_out_decision({{4, 400.0}}, {.spawn_size = 2});
  EXPECT_EQ(one.action, ScaleOutDecision::Action::add);
  EXPECT_EQ(one.target_workers, 6);
  EXPECT_TRUE(one.pairs.empty());
  // "passes if s > threshold": s = 0.5 exactly at threshold 0.5 fails.
  const ScaleOutDecision equal = scale_out_decision({{8, 720.0}, {12, 900.0}}, {.threshold = 0.5});
  EXPECT_EQ(equal.action, ScaleOutDecision::Action::settle);
  EXPECT_EQ(equal.target_workers, 8);

  EXPECT_THROW(scale_out_decision({}), std::invalid_argument);
  EXPECT_THROW(scale_out_decision({{0, 1.0}}), std::invalid_argument);
  EXPECT_THROW(scale_out_decision({{4, -1.0}}), std::invalid_argument);
  EXPECT_THROW(scale_out_decision({{4, 1.0}}, {.spawn_size = 0}), std::invalid_argument);
}

TEST(ThroughputKat, Thr4CostAndUtility) {
  const ScaleOutCostModel model{.global_batch = 256.0,
                                .remaining_steps = 10000.0,
                                .price_per_worker_second = 1.0 / 3600,
                                .elapsed = Seconds(1000.0)};
  const auto utility = [](double t) { return 100.0 - 100.0 / 36000.0 * t; };

  const ScaleOutCostCheck a = check_scale_out_cost(model, {8, 720.0}, {12, 900.0}, utility);
  expect_printed(a.step_time_before.count(), 0.355556, 6);
  expect_printed(a.step_time_after.count(), 0.284444, 6);
  expect_printed(a.cost_before, 7.901235, 6);
  expect_printed(a.cost_after, 9.481481, 6);
  expect_printed(a.cost_after - a.cost_before, 1.580247, 6);
  expect_printed(a.completion_before.count(), 4555.5556, 4);
  expect_printed(a.completion_after.count(), 3844.4444, 4);
  expect_printed(a.utility_gain, 1.975309, 6);
  EXPECT_TRUE(a.pass);

  const ScaleOutCostCheck b = check_scale_out_cost(model, {12, 900.0}, {16, 960.0}, utility);
  expect_printed(b.cost_after - b.cost_before, 2.370370, 6);
  expect_printed(b.utility_gain, 0.493827, 6);
  EXPECT_FALSE(b.pass);
}

TEST(ThroughputKat, Thr5InterferenceVote) {
  EXPECT_TRUE(interference_vote(1.20, 0.90));  // 0.90 < 0.96
  EXPECT_FALSE(interference_vote(1.20, 0.97));
  EXPECT_TRUE(strict_majority(3, 5));
  EXPECT_FALSE(strict_majority(2, 5));
  EXPECT_FALSE(strict_majority(2, 4));
  EXPECT_TRUE(strict_majority(3, 4));
}

TEST(ThroughputKat, Thr6StragglerEwma) {
  StragglerScore score;
  EXPECT_FALSE(score.straggler());
  const std::vector<double> expected{1,          1,           0.95,         0.905,
                                     0.8645,     0.82805,     0.795245,     0.7657205,
                                     0.73914845, 0.715233605, 0.6937102445, 0.67433922005};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    score.observe(i < 2 ? 1.0 : 0.5);
    EXPECT_NEAR(score.value(), expected[i], 1e-12) << "observation " << i + 1;
    EXPECT_EQ(score.straggler(), i + 1 >= 7) << "observation " << i + 1;  // first flagged: 7
  }
}

TEST(ThroughputKat, StragglerFractionsUseTheMedian) {
  const std::vector<double> odd{100.0, 50.0, 200.0};
  const std::vector<double> f = median_fractions(odd);
  expect_rel(f[0], 1.0);
  expect_rel(f[1], 0.5);
  expect_rel(f[2], 2.0);
  const std::vector<double> even{100.0, 50.0, 300.0, 200.0};  // median (100 + 200)/2
  expect_rel(median_fractions(even)[1], 50.0 / 150.0);
  EXPECT_THROW(median_fractions({}), std::invalid_argument);
}

TEST(ThroughputKat, Thr7BusBandwidth) {
  const AllreduceBandwidth bw = allreduce_bandwidth(256.0 * 1024 * 1024, Seconds(0.050), 8);
  expect_printed(bw.algorithm_bytes_per_second / 1e9, 5.368709, 6);
  expect_printed(bw.bus_bytes_per_second / 1e9, 9.395241, 6);
  expect_rel(bw.algorithm_bytes_per_second, 5368709120.0);
  expect_rel(bw.bus_bytes_per_second, 9395240960.0);
}

TEST(ThroughputWindow, DiscardsWarmupStepsAfterEachRestart) {
  ThroughputWindow w({.window_steps = 10, .warmup_steps = 2});
  EXPECT_FALSE(w.record({100.0, 50.0, Seconds(10.0)}));  // warm-up: slow first steps
  EXPECT_FALSE(w.record({100.0, 50.0, Seconds(5.0)}));
  EXPECT_TRUE(std::isnan(w.job_samples_per_second()));
  EXPECT_TRUE(w.record({100.0, 50.0, Seconds(1.0)}));
  expect_rel(w.job_samples_per_second(), 100.0);
  w.restart();  // e.g. K changed
  EXPECT_EQ(w.steps(), 0u);
  EXPECT_FALSE(w.record({200.0, 50.0, Seconds(1.0)}));
  EXPECT_FALSE(w.record({200.0, 50.0, Seconds(1.0)}));
  EXPECT_TRUE(w.record({200.0, 50.0, Seconds(0.5)}));
  expect_rel(w.job_samples_per_second(), 400.0);
}

TEST(ThroughputWindow, KeepsTheLastWSteps) {
  ThroughputWindow w = window_without_warmup(2);
  w.record({100.0, 10.0, Seconds(10.0)});
  w.record({100.0, 10.0, Seconds(1.0)});
  w.record({100.0, 10.0, Seconds(1.0)});
  EXPECT_EQ(w.steps(), 2u);
  expect_rel(w.total_time().count(), 2.0);
  expect_rel(w.job_samples_per_second(), 100.0);
  expect_rel(w.worker_samples_per_second(), 10.0);
}

TEST(ThroughputWindow, RejectsBadSamples) {
  ThroughputWindow w = window_without_warmup();
  EXPECT_FALSE(w.record({100.0, 10.0, Seconds(0.0)}));
  EXPECT_FALSE(w.record({100.0, 10.0, Seconds(-1.0)}));
  EXPECT_FALSE(w.record({100.0, 10.0, Seconds(std::nan(""))}));
  EXPECT_FALSE(w.record({-1.0, 10.0, Seconds(1.0)}));
  EXPECT_FALSE(w.record({std::nan(""), 10.0, Seconds(1.0)}));
  EXPECT_EQ(w.steps(), 0u);
  EXPECT_THROW(ThroughputWindow({.window_steps = 0}), std::invalid_argument);
}

}  // namespace
}  // namespace kf::monitor
