// SPDX-License-Identifier: Apache-2.0
// The GNS operator on exact arithmetic: the known answers KAT-GNS-D1..D4 (tolerance
// 1e-12 relative), and its guards: non-finite steps, read-out clamping,
// validity, parameter groups, loss scale, shape errors.
#include "kf/monitor/gns.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kRel = 1e-12;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void expect_rel(double actual, double expected, double rel = kRel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

using Vec = std::array<double, 3>;
// The local mean gradients of KAT-GNS-D1 (d = 3).
constexpr std::array<Vec, 4> kGrads{
    {{1.0, 2.0, 0.5}, {0.0, 1.5, 1.0}, {2.0, 1.0, -0.5}, {1.0, 1.5, 1.0}}};

double sqnorm(const Vec& v) { return v[0] * v[0] + v[1] * v[1] + v[2] * v[2]; }

Vec mean(std::span<const Vec> vs) {
  Vec m{0.0, 0.0, 0.0};
  for (const Vec& v : vs) {
    for (int i = 0; i < 3; ++i) m[i] += v[i] / static_cast<double>(vs.size());
  }
  return m;
}

// One optimizer step over the four D1 vectors: the sum of the local norms and C.
struct D1Norms {
  std::array<double, 1> local_sum{0.0};
  std::array<double, 1> global{0.0};
  D1Norms() {
    for (const Vec& g : kGrads) local_sum[0] += sqnorm(g);
    global[0] = sqnorm(mean(kGrads));
  }
};

GnsStep d1_step(const D1Norms& norms, std::int64_t workers, std::int64_t accumulation) {
  GnsStep step;
  step.local_sqnorm_sum = norms.local_sum;
  step.global_sqnorm = norms.global;
  step.workers = workers;
  step.accumulation_steps = accumulation;
  step.local_batch = 8.0;
  return step;
}

GnsOptions options_m0(double m0) {
  GnsOptions o;
  o.base_batch = m0;
  return o;
}

TEST(GnsKat, D1NormsAreTheDocumentsOnes) {
  expect_rel(sqnorm(kGrads[0]), 21.0 / 4);
  expect_rel(sqnorm(kGrads[1]), 13.0 / 4);
  expect_rel(sqnorm(kGrads[2]), 21.0 / 4);
  expect_rel(sqnorm(kGrads[3]), 17.0 / 4);
  const D1Norms n;
  expect_rel(n.local_sum[0] / 4, 9.0 / 2);  // A
  expect_rel(n.global[0], 7.0 / 2);         // C
}

TEST(GnsKat, D1DataParallelFormulas) {
  const GnsPoint p = data_parallel_estimate(4.5, 3.5, 4.0, 8.0);
  expect_rel(p.sqr, 19.0 / 6);
  expect_rel(p.tr_sigma, 32.0 / 3);
  // The two-batch estimators with B_s = b, B_b = n·b give the same numbers.
  const GnsPoint q = two_batch_estimate(4.5, 8.0, 3.5, 32.0);
  expect_rel(q.sqr, 19.0 / 6);
  expect_rel(q.tr_sigma, 32.0 / 3);
}

TEST(GnsKat, D1EstimatorAndDerivedQuantities) {
  GnsEstimator gns(options_m0(16.0));
  const D1Norms norms;
  const GnsStepResult r = gns.update(d1_step(norms, 4, 1));
  EXPECT_EQ(r.status, GnsStepStatus::accepted);
  EXPECT_FALSE(r.biased);
  expect_rel(r.point.sqr, 19.0 / 6);
  expect_rel(r.point.tr_sigma, 32.0 / 3);

  const GnsEstimate e = gns.estimate();
  expect_rel(e.raw.sqr, 19.0 / 6);
  expect_rel(e.raw.tr_sigma, 32.0 / 3);
  expect_rel(e.read.sqr, 19.0 / 6);
  expect_rel(e.read.tr_sigma, 32.0 / 3);
  expect_rel(e.b_simple, 64.0 / 19);
  expect_rel(e.raw.tr_sigma / e.base_batch, 2.0 / 3);  // AdaptDL's var = trΣ/M0
  expect_rel(e.gain(2.0), 23.0 / 21);
  expect_rel(e.efficiency(32.0), 23.0 / 42);
  expect_rel(e.efficiency(32.0), e.gain(2.0) / 2.0);
  EXPECT_EQ(e.steps, 1);
  expect_rel(e.base_steps, 2.0);  // S = 32/16
  EXPECT_FALSE(e.valid);          // one step is not enough for a decision
  EXPECT_FALSE(e.biased);
}

TEST(GnsKat, D2PerRankEstimatesKeepTheirSign) {
  const D1Norms norms;
  const double c = norms.global[0];
  const std::array<GnsPoint, 4> expected{
      {{35.0 / 12, 56.0 / 3}, {43.0 / 12, -8.0 / 3}, {35.0 / 12, 56.0 / 3}, {13.0 / 4, 8.0}}};
  const std::array<double, 4> ratio{6.4, -32.0 / 43, 6.4, 32.0 / 13};
  for (std::size_t rank = 0; rank < 4; ++rank) {
    const GnsPoint p = per_rank_estimate(sqnorm(kGrads[rank]), c, 4.0, 8.0);
    expect_rel(p.sqr, expected[rank].sqr);
    expect_rel(p.tr_sigma, expected[rank].tr_sigma);
    expect_rel(p.tr_sigma / p.sqr, ratio[rank]);
  }
  EXPECT_LT(per_rank_estimate(sqnorm(kGrads[1]), c, 4.0, 8.0).tr_sigma, 0.0);
}

TEST(GnsKat, D3AccumulationCountsMicroSteps) {
  const D1Norms norms;
  GnsEstimator gns(options_m0(16.0));
  const GnsStepResult r = gns.update(d1_step(norms, 2, 2));
  expect_rel(r.point.sqr, 19.0 / 6);
  expect_rel(r.point.tr_sigma, 32.0 / 3);
  expect_rel(gns.estimate().b_simple, 64.0 / 19);
  expect_rel(gns.estimate().base_steps, 2.0);

  // Counting only workers (n = 2) would give other numbers: (2.4) with A = 9, C = 3.5.
  GnsEstimator wrong(options_m0(16.0));
  const GnsStepResult w = wrong.update(d1_step(norms, 2, 1));
  expect_rel(w.point.sqr, 3.5 - (9.0 - 3.5));
  EXPECT_GT(std::abs(w.point.sqr - 19.0 / 6), 1.0);
}

// KAT-GNS-D4: one worker sees g₁, then g₂.
TEST(GnsKat, D4DifferenceEstimator) {
  GnsEstimator gns(options_m0(8.0));
  const std::array<double, 1> l1{sqnorm(kGrads[0])};
  const std::array<double, 1> l2{sqnorm(kGrads[1])};
  const std::array<Vec, 2> pair{kGrads[0], kGrads[1]};
  const std::array<double, 1> c12{sqnorm(mean(pair))};
  expect_rel(c12[0], 31.0 / 8);

  GnsStep step;
  step.local_batch = 8.0;
  step.local_sqnorm_sum = l1;
  step.global_sqnorm = l1;
  const GnsStepResult first = gns.update(step);
  EXPECT_EQ(first.status, GnsStepStatus::no_previous_step);
  EXPECT_TRUE(std::isnan(first.point.sqr));
  GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.valid);
  EXPECT_NE(e.reason.find("previous step"), std::string::npos) << e.reason;
  EXPECT_TRUE(std::isnan(e.b_simple));

  step.local_sqnorm_sum = l2;
  step.global_sqnorm = l2;
  step.pair_sqnorm = c12;
  const GnsStepResult second = gns.update(step);
  EXPECT_EQ(second.status, GnsStepStatus::accepted);
  EXPECT_TRUE(second.biased);
  expect_rel(second.point.sqr, 7.0 / 2);
  expect_rel(second.point.tr_sigma, 6.0);
  e = gns.estimate();
  EXPECT_TRUE(e.biased);
  expect_rel(e.raw.tr_sigma / e.base_batch, 3.0 / 4);  // AdaptDL var with M0 = 8
  expect_rel(e.base_steps, 2.0);                       // the factor's scale is 2·S = 2·8/8
}

TEST(GnsEstimator, DifferenceEstimatorUsesTwiceTheScaleForTheFactor) {
  // θ0 = 0.5, b = 8, M0 = 8: θ = 0.5^(2·8/8) = 0.25 per difference step. After the D4 step
  // (|G|²^ 3.5, trΣ^ 6) comes g₃ with |(g₂+g₃)/2|² = 2.625: |G|²^ 1, trΣ^ 26. Weights
  // 0.25·0.75 and 0.75 give 1.5 and 22.
  GnsOptions o = options_m0(8.0);
  o.theta_base = 0.5;
  GnsEstimator gns(o);
  GnsStep step;
  step.local_batch = 8.0;
  for (int t = 0; t < 3; ++t) {
    const std::array<double, 1> local{sqnorm(kGrads[t])};
    std::array<double, 1> pair{0.0};
    step.local_sqnorm_sum = local;
    step.global_sqnorm = local;
    if (t > 0) {
      const std::array<Vec, 2> two{kGrads[t - 1], kGrads[t]};
      pair[0] = sqnorm(mean(two));
      step.pair_sqnorm = pair;
    }
    gns.update(step);
  }
  const GnsEstimate e = gns.estimate();
  EXPECT_EQ(e.steps, 2);
  expect_rel(e.raw.sqr, 1.5);
  expect_rel(e.raw.tr_sigma, 22.0);
}

TEST(GnsEstimator, UnbiasedStepsAfterDifferenceStepsStartOver) {
  GnsEstimator gns(options_m0(16.0));
  GnsStep single;
  single.local_batch = 8.0;
  const std::array<double, 1> l1{sqnorm(kGrads[0])}, l2{sqnorm(kGrads[1])}, pair{31.0 / 8};
  single.local_sqnorm_sum = single.global_sqnorm = l1;
  gns.update(single);
  single.local_sqnorm_sum = single.global_sqnorm = l2;
  single.pair_sqnorm = pair;
  gns.update(single);
  ASSERT_TRUE(gns.estimate().biased);

  const D1Norms norms;
  gns.update(d1_step(norms, 4, 1));  // the job scaled out to 4 workers
  const GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.biased);
  EXPECT_EQ(e.steps, 1);
  expect_rel(e.raw.sqr, 19.0 / 6);
  expect_rel(e.raw.tr_sigma, 32.0 / 3);

  // Back to one worker: the previous gradient is from before the multi-worker step, so the
  // first single-worker step only records its norm.
  single.local_sqnorm_sum = single.global_sqnorm = l1;
  single.pair_sqnorm = pair;
  EXPECT_EQ(gns.update(single).status, GnsStepStatus::no_previous_step);
}

TEST(GnsEstimator, NonFiniteStepIsSkippedAndChangesNothing) {
  GnsEstimator gns(options_m0(16.0));
  const D1Norms norms;
  gns.update(d1_step(norms, 4, 1));
  const GnsEstimate before = gns.estimate();

  D1Norms bad = norms;
  bad.local_sum[0] = kNaN;
  GnsStepResult r = gns.update(d1_step(bad, 4, 1));
  EXPECT_EQ(r.status, GnsStepStatus::skipped_non_finite);
  EXPECT_TRUE(std::isnan(r.point.sqr));
  bad = norms;
  bad.global[0] = kInf;
  EXPECT_EQ(gns.update(d1_step(bad, 4, 1)).status, GnsStepStatus::skipped_non_finite);
  GnsStep flagged = d1_step(norms, 4, 1);
  flagged.finite = false;
  EXPECT_EQ(gns.update(flagged).status, GnsStepStatus::skipped_non_finite);
  GnsStep scale = d1_step(norms, 4, 1);
  scale.loss_scale = kInf;
  EXPECT_EQ(gns.update(scale).status, GnsStepStatus::skipped_non_finite);

  const GnsEstimate after = gns.estimate();
  EXPECT_EQ(after.raw.sqr, before.raw.sqr);
  EXPECT_EQ(after.raw.tr_sigma, before.raw.tr_sigma);
  EXPECT_EQ(after.steps, 1);
  EXPECT_EQ(after.base_steps, before.base_steps);
  EXPECT_EQ(after.last_step, GnsStepStatus::skipped_non_finite);
  EXPECT_NE(after.reason.find("non-finite"), std::string::npos) << after.reason;

  // A good step afterwards is averaged with the first one as if nothing had happened.
  gns.update(d1_step(norms, 4, 1));
  EXPECT_EQ(gns.estimate().steps, 2);
  expect_rel(gns.estimate().raw.sqr, 19.0 / 6);
  EXPECT_EQ(gns.estimate().last_step, GnsStepStatus::accepted);
}

TEST(GnsEstimator, NonFiniteFirstStepSaysSo) {
  GnsEstimator gns(options_m0(16.0));
  D1Norms bad;
  bad.local_sum[0] = kNaN;
  gns.update(d1_step(bad, 4, 1));
  const GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.valid);
  EXPECT_EQ(e.steps, 0);
  EXPECT_NE(e.reason.find("skipped: non-finite"), std::string::npos) << e.reason;
}

TEST(GnsEstimator, SkippedSingleWorkerStepKeepsThePreviousNorm) {
  GnsEstimator gns(options_m0(8.0));
  GnsStep step;
  step.local_batch = 8.0;
  const std::array<double, 1> l1{sqnorm(kGrads[0])}, l2{sqnorm(kGrads[1])}, pair{31.0 / 8};
  const std::array<double, 1> nan{kNaN};
  step.local_sqnorm_sum = step.global_sqnorm = l1;
  gns.update(step);
  step.local_sqnorm_sum = step.global_sqnorm = nan;
  step.pair_sqnorm = nan;
  EXPECT_EQ(gns.update(step).status, GnsStepStatus::skipped_non_finite);
  step.local_sqnorm_sum = step.global_sqnorm = l2;
  step.pair_sqnorm = pair;
  const GnsStepResult r = gns.update(step);
  EXPECT_EQ(r.status, GnsStepStatus::accepted);
  expect_rel(r.point.sqr, 7.0 / 2);
  expect_rel(r.point.tr_sigma, 6.0);
}

TEST(GnsEstimator, LocalNormsAreDividedByTheLossScaleSquared) {
  const D1Norms norms;
  D1Norms scaled = norms;
  scaled.local_sum[0] *= 1024.0 * 1024.0;
  GnsStep step = d1_step(scaled, 4, 1);
  step.loss_scale = 1024.0;
  GnsEstimator gns(options_m0(16.0));
  const GnsStepResult r = gns.update(step);
  expect_rel(r.point.sqr, 19.0 / 6);
  expect_rel(r.point.tr_sigma, 32.0 / 3);
}

TEST(GnsEstimator, ParameterGroupsAreAveragedSeparatelyAndAddUp) {
  // Group 0: the first two coordinates of the D1 vectors; group 1: the third.
  std::array<double, 2> local{0.0, 0.0};
  for (const Vec& g : kGrads) {
    local[0] += g[0] * g[0] + g[1] * g[1];
    local[1] += g[2] * g[2];
  }
  const Vec m = mean(kGrads);
  const std::array<double, 2> global{m[0] * m[0] + m[1] * m[1], m[2] * m[2]};
  GnsStep step;
  step.local_sqnorm_sum = local;
  step.global_sqnorm = global;
  step.workers = 4;
  step.local_batch = 8.0;
  GnsEstimator gns(options_m0(16.0));
  const GnsStepResult r = gns.update(step);
  expect_rel(r.point.sqr, 19.0 / 6);
  expect_rel(r.point.tr_sigma, 32.0 / 3);
  ASSERT_EQ(gns.groups(), 2u);
  // Group 1: A = (0.25 + 1 + 0.25 + 1)/4 = 0.625, C = 0.25, D = 0.375:
  // |G|²^ = 0.25 − 0.125 = 0.125, trΣ^ = 32·0.375/3 = 4.
  expect_rel(gns.group(1).sqr, 0.125);
  expect_rel(gns.group(1).tr_sigma, 4.0);
  expect_rel(gns.group(0).sqr, 19.0 / 6 - 0.125);
  expect_rel(gns.group(0).tr_sigma, 32.0 / 3 - 4.0);
  expect_rel(gns.estimate().b_simple, 64.0 / 19);
}

TEST(GnsEstimator, ReadOutClampsOnlyOnRead) {
  // n = 2, b = 1: A = 10, C = 1 give |G|²^ = 1 − 9 = −8 and trΣ^ = 18.
  GnsEstimator gns(options_m0(4.0));
  const std::array<double, 1> local{20.0}, global{1.0};
  GnsStep step;
  step.local_sqnorm_sum = local;
  step.global_sqnorm = global;
  step.workers = 2;
  step.local_batch = 1.0;
  const GnsStepResult r = gns.update(step);
  expect_rel(r.point.sqr, -8.0);  // returned unchanged, and averaged unchanged
  expect_rel(r.point.tr_sigma, 18.0);
  GnsEstimate e = gns.estimate();
  expect_rel(e.raw.sqr, -8.0);
  EXPECT_EQ(e.read.sqr, 0.0);
  EXPECT_EQ(e.b_simple, kInf);
  EXPECT_EQ(e.efficiency(4096.0), 1.0);
  expect_rel(e.gain(16.0), 16.0);  // noise dominated: r → S

  // A = 1, C = 2: trΣ^ = −2 is floored at 1e-6·M0 on read; |G|²^ = 2 + 1 = 3.
  GnsEstimator neg(options_m0(4.0));
  const std::array<double, 1> local2{2.0}, global2{2.0};
  step.local_sqnorm_sum = local2;
  step.global_sqnorm = global2;
  neg.update(step);
  e = neg.estimate();
  expect_rel(e.raw.tr_sigma, -2.0);
  expect_rel(e.raw.sqr, 3.0);
  expect_rel(e.read.tr_sigma, 4e-6);
  expect_rel(e.b_simple, 4e-6 / 3.0);
}

TEST(GnsEstimator, EstimateBeforeAnyStepIsNotValid) {
  GnsEstimator gns(options_m0(16.0));
  const GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.valid);
  EXPECT_EQ(e.reason, "no step accepted yet");
  EXPECT_TRUE(std::isnan(e.raw.sqr));
  EXPECT_TRUE(std::isnan(e.b_simple));
  EXPECT_EQ(e.steps, 0);
}

GnsStep d1_step_with_batch(const D1Norms& norms, double b) {
  GnsStep s = d1_step(norms, 4, 1);
  s.local_batch = b;
  return s;
}

TEST(GnsEstimator, ValidAfterOneOverOneMinusThetaBaseSteps) {
  // θ0 = 0.999, M = M0 = 32: valid from the 1000th step on.
  GnsEstimator gns(options_m0(32.0));
  const D1Norms norms;
  for (int t = 1; t < 1000; ++t) gns.update(d1_step_with_batch(norms, 8.0));
  GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.valid);
  EXPECT_NE(e.reason.find("base-equivalent"), std::string::npos) << e.reason;
  EXPECT_GT(e.effective_steps, 20.0);
  gns.update(d1_step_with_batch(norms, 8.0));
  e = gns.estimate();
  EXPECT_TRUE(e.valid) << e.reason;
  EXPECT_TRUE(e.reason.empty());
  expect_rel(e.base_steps, 1000.0);
  expect_rel(e.b_simple, 64.0 / 19, 1e-9);  // the average of a constant

  // With M = 2·M0 each step counts twice: valid after 500 steps.
  GnsEstimator fast(options_m0(16.0));
  for (int t = 1; t < 500; ++t) fast.update(d1_step_with_batch(norms, 8.0));
  EXPECT_FALSE(fast.estimate().valid);
  fast.update(d1_step_with_batch(norms, 8.0));
  EXPECT_TRUE(fast.estimate().valid) << fast.estimate().reason;
}

TEST(GnsEstimator, NotValidWhileTheEffectiveCountIsSmall) {
  // θ0 = 0.9 at S = 1 averages about (1+θ)/(1−θ) = 19 steps: never n_eff ≥ 20.
  GnsOptions o = options_m0(32.0);
  o.theta_base = 0.9;
  GnsEstimator gns(o);
  const D1Norms norms;
  for (int t = 0; t < 300; ++t) gns.update(d1_step_with_batch(norms, 8.0));
  GnsEstimate e = gns.estimate();
  EXPECT_FALSE(e.valid);
  EXPECT_NEAR(e.effective_steps, 19.0, 1e-9);
  EXPECT_NE(e.reason.find("n_eff"), std::string::npos) << e.reason;

  o.min_effective_steps = 18.0;
  GnsEstimator lower(o);
  for (int t = 0; t < 300; ++t) lower.update(d1_step_with_batch(norms, 8.0));
  EXPECT_TRUE(lower.estimate().valid) << lower.estimate().reason;
}

TEST(GnsEstimator, PlainMeanSmoothing) {
  GnsOptions o = options_m0(32.0);
  o.smoothing = GnsSmoothing::mean;
  GnsEstimator gns(o);
  const std::array<double, 1> g{3.5};
  const std::array<double, 3> sums{18.0, 20.0, 15.0};  // A = 4.5, 5, 3.75
  double sqr = 0.0, tr = 0.0;
  for (double s : sums) {
    const std::array<double, 1> local{s};
    GnsStep step;
    step.local_sqnorm_sum = local;
    step.global_sqnorm = g;
    step.workers = 4;
    step.local_batch = 8.0;
    const GnsPoint p = gns.update(step).point;
    sqr += p.sqr;
    tr += p.tr_sigma;
  }
  const GnsEstimate e = gns.estimate();
  expect_rel(e.raw.sqr, sqr / 3);
  expect_rel(e.raw.tr_sigma, tr / 3);
  expect_rel(e.effective_steps, 3.0);
}

TEST(GnsEstimator, RejectsBadOptionsAndShapes) {
  EXPECT_THROW((GnsEstimator(options_m0(0.0))), std::invalid_argument);
  GnsOptions o = options_m0(16.0);
  o.theta_base = 1.0;
  EXPECT_THROW((GnsEstimator(o)), std::invalid_argument);
  o.theta_base = 0.999;
  o.min_effective_steps = -1.0;
  EXPECT_THROW((GnsEstimator(o)), std::invalid_argument);

  GnsEstimator gns(options_m0(16.0));
  const D1Norms norms;
  GnsStep s = d1_step(norms, 0, 1);
  EXPECT_THROW(gns.update(s), std::invalid_argument);
  s = d1_step(norms, 4, 0);
  EXPECT_THROW(gns.update(s), std::invalid_argument);
  s = d1_step_with_batch(norms, 0.0);
  EXPECT_THROW(gns.update(s), std::invalid_argument);
  s = d1_step(norms, 4, 1);
  s.loss_scale = 0.0;
  EXPECT_THROW(gns.update(s), std::invalid_argument);
  s = d1_step(norms, 4, 1);
  s.global_sqnorm = {};
  EXPECT_THROW(gns.update(s), std::invalid_argument);
  s = d1_step(norms, 4, 1);
  s.pair_sqnorm = norms.global;  // only for n = 1
  EXPECT_THROW(gns.update(s), std::invalid_argument);

  gns.update(d1_step(norms, 4, 1));
  const std::array<double, 2> two{1.0, 2.0};
  s.local_sqnorm_sum = two;
  s.global_sqnorm = two;
  s.pair_sqnorm = {};
  EXPECT_THROW(gns.update(s), std::invalid_argument);  // the group count changed
  gns.reset();
  EXPECT_EQ(gns.update(s).status, GnsStepStatus::accepted);
  EXPECT_EQ(gns.groups(), 2u);
}

}  // namespace
}  // namespace kf::monitor
