// SPDX-License-Identifier: Apache-2.0
// StepMonitor on hand-made control records: the GNS inputs it forms from the workers' reports
// (checked against the data-parallel estimator directly), skipped
// non-finite steps, one worker, the throughput window's restart, and the norm passes.
#include "kf/runtime/step_monitor.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kf/monitor/gns.hpp"

namespace kf {
namespace {

// Records of `reports.size()` workers, stride = kWords (no other fields).
std::vector<std::int64_t> records(const std::vector<StepReport>& reports) {
  std::vector<std::int64_t> all(reports.size() * StepMonitor::kWords);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    StepMonitor::pack(reports[r], std::span<std::int64_t>(all).subspan(r * StepMonitor::kWords,
                                                                       StepMonitor::kWords));
  }
  return all;
}

StepReport report(double local_sq, double global_sq, double time = 0.1) {
  StepReport r;
  r.step_time = time;
  r.samples = 16;
  r.local_sqnorm = local_sq;
  r.global_sqnorm = global_sq;
  r.local_batch = 16;
  r.micro_batches = 1;
  r.comm_time = 0.02;
  r.comm_bytes = 4000;
  return r;
}

TEST(StepMonitor, FormsTheDataParallelEstimateFromTheWorkersReports) {
  StepMonitor m(StepMonitorOptions{.base_batch = 32});
  std::map<std::string, double> metrics;
  const auto all = records({report(9.0, 4.0), report(7.0, 4.0)});
  EXPECT_FALSE(m.update(all, StepMonitor::kWords, 0, 2, metrics));
  // A = (9 + 7)/2 = 8, C = 4, n = 2, b = 16.
  const monitor::GnsPoint want = monitor::data_parallel_estimate(8.0, 4.0, 2, 16);
  EXPECT_DOUBLE_EQ(metrics.at("gns.step_sqr"), want.sqr);
  EXPECT_DOUBLE_EQ(metrics.at("gns.step_tr_sigma"), want.tr_sigma);
  EXPECT_EQ(metrics.at("gns.valid"), 0.0) << "one step is not enough for a decision";
  EXPECT_EQ(metrics.at("gns.skipped"), 0.0);
  EXPECT_DOUBLE_EQ(metrics.at("samples"), 32.0);
  EXPECT_DOUBLE_EQ(metrics.at("comm_bytes"), 4000.0);
  EXPECT_DOUBLE_EQ(metrics.at("algbw"), 4000.0 / 0.02);
  EXPECT_DOUBLE_EQ(metrics.at("step_time"), 0.1);
}

TEST(StepMonitor, CountsAccumulatedMicroBatchesAsGradients) {
  // 2 workers × 2 accumulated micro-batches: n = 4 gradients of b = 16 samples.
  StepMonitor m(StepMonitorOptions{.base_batch = 64});
  std::map<std::string, double> metrics;
  StepReport a = report(9.0 + 8.0, 3.0), b = report(7.0 + 6.0, 3.0);
  a.micro_batches = b.micro_batches = 2;
  a.samples = b.samples = 32;
  m.update(records({a, b}), StepMonitor::kWords, 0, 2, metrics);
  const monitor::GnsPoint want = monitor::data_parallel_estimate((17.0 + 13.0) / 4, 3.0, 4, 16);
  EXPECT_DOUBLE_EQ(metrics.at("gns.step_sqr"), want.sqr);
  EXPECT_DOUBLE_EQ(metrics.at("gns.step_tr_sigma"), want.tr_sigma);
  EXPECT_DOUBLE_EQ(metrics.at("samples"), 64.0);
}

TEST(StepMonitor, SkipsAStepWhoseGradientWasNotFiniteOnAnyWorker) {
  StepMonitor m(StepMonitorOptions{.base_batch = 32});
  std::map<std::string, double> metrics;
  m.update(records({report(9.0, 4.0), report(7.0, 4.0)}), StepMonitor::kWords, 0, 2, metrics);
  const double before = metrics.at("gns.sqr");
  StepReport bad = report(std::numeric_limits<double>::quiet_NaN(), 4.0);
  bad.nonfinite = 1;
  m.update(records({report(9.0, 4.0), bad}), StepMonitor::kWords, 0, 2, metrics);
  EXPECT_EQ(metrics.at("gns.skipped"), 1.0);
  EXPECT_EQ(metrics.count("gns.step_sqr"), 0u) << "no estimate from a skipped step";
  EXPECT_EQ(metrics.at("gns.sqr"), before) << "the averages did not move";
}

TEST(StepMonitor, SaysOnceThatOneWorkerGivesNoEstimate) {
  StepMonitor m;
  std::map<std::string, double> metrics;
  const auto all = records({report(9.0, 9.0)});
  const auto said = m.update(all, StepMonitor::kWords, 0, 1, metrics);
  ASSERT_TRUE(said);
  EXPECT_NE(said->find("one worker"), std::string::npos) << *said;
  EXPECT_FALSE(m.update(all, StepMonitor::kWords, 0, 1, metrics)) << "said once only";
  EXPECT_EQ(metrics.at("gns.valid"), 0.0);
  EXPECT_EQ(metrics.count("gns.sqr"), 0u);
}

TEST(StepMonitor, NoGradientReportMeansNoNoiseScale) {
  StepMonitor m;
  std::map<std::string, double> metrics{{"loss", 1.5}, {"gns.sqr", 3.0}};
  StepReport plain;
  plain.step_time = 0.5;
  plain.samples = 10;
  m.update(records({plain, plain}), StepMonitor::kWords, 0, 2, metrics);
  EXPECT_EQ(metrics.count("gns.sqr"), 0u) << "a stale value must not survive";
  EXPECT_EQ(metrics.at("loss"), 1.5) << "metrics it does not own stay";
  EXPECT_EQ(metrics.count("algbw"), 0u) << "no communication measured";
}

TEST(StepMonitor, ThroughputIsARatioOfSumsAndRestartsAfterAChange) {
  StepMonitor m(StepMonitorOptions{.window_steps = 10, .warmup_steps = 1});
  std::map<std::string, double> metrics;
  StepReport r;
  r.samples = 10;
  const double times[] = {9.0, 0.5, 1.5};  // the first is warm-up and discarded
  for (double t : times) {
    r.step_time = t;
    m.update(records({r, r}), StepMonitor::kWords, 0, 2, metrics);
  }
  // 2 × (20 samples) over 0.5 + 1.5 s (not the mean of 40 and 13.3 samples/s).
  EXPECT_DOUBLE_EQ(metrics.at("throughput"), 40.0 / 2.0);
  EXPECT_DOUBLE_EQ(metrics.at("throughput_per_worker"), 20.0 / 2.0);
  m.membership_changed();
  r.step_time = 100.0;  // warm-up of the new cluster: discarded
  m.update(records({r, r}), StepMonitor::kWords, 0, 2, metrics);
  EXPECT_EQ(metrics.count("throughput"), 0u) << "the old cluster's steps are gone";
  r.step_time = 2.0;
  m.update(records({r, r}), StepMonitor::kWords, 0, 2, metrics);
  EXPECT_DOUBLE_EQ(metrics.at("throughput"), 10.0);
}

TEST(SquaredNorm, MatchesALongDoubleSumAndScalesInTheSamePass) {
  std::vector<float> v(100003);
  long double want = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i)) * 3.0);
    want += static_cast<long double>(v[i]) * v[i];
  }
  EXPECT_NEAR(squared_norm(v), static_cast<double>(want), 1e-5 * static_cast<double>(want));
  EXPECT_EQ(squared_norm(v), squared_norm(v));
  const double scaled = scale_and_squared_norm(v, 0.5f);
  EXPECT_NEAR(scaled, static_cast<double>(want) / 4, 1e-5 * static_cast<double>(want));
  EXPECT_FLOAT_EQ(v[1000], static_cast<float>(std::sin(1.0) * 3.0) * 0.5f);
  EXPECT_EQ(squared_norm({}), 0.0);
  std::vector<float> out(v.size());
  const double copied = copy_scaled(v, out, 2.0f);
  EXPECT_EQ(copied, squared_norm(v)) << "the norm of the input, the same bits";
  EXPECT_EQ(out[1000], v[1000] * 2.0f);
}

}  // namespace
}  // namespace kf
