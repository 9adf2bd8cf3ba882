// SPDX-License-Identifier: Apache-2.0
// Optimus's models: KAT-OPT-L1..L4 for the loss model and the remaining epochs, KAT-OPT-S1..S3 for
// the speed model, its optimum and the two marginal rules, with the tolerances the known answers
// come with; then the gates (too few points, rank-deficient design, residual bound, no trend) and
// the input checks.
#include "kf/monitor/optimus.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void expect_rel(double actual, double expected, double rel) {
  EXPECT_LE(std::abs(actual - expected), rel * std::abs(expected))
      << "actual " << actual << " expected " << expected;
}

const LossModel kBeta{0.05, 1.0, 0.2};

std::vector<double> epochs_1_to_20() {
  std::vector<double> k;
  for (int i = 1; i <= 20; ++i) k.push_back(i);
  return k;
}

std::vector<double> curve(const LossModel& m, const std::vector<double>& k) {
  std::vector<double> l;
  for (double e : k) l.push_back(m.loss(e));
  return l;
}

// ---- loss model ----------------------------------------------------------------------------

TEST(OptimusKat, L1NoiseFreeCurveIsRecovered) {
  const auto k = epochs_1_to_20();
  const auto l = curve(kBeta, k);
  EXPECT_NEAR(l[0], 1.1523809524, 5e-11);
  EXPECT_NEAR(l[1], 1.1090909091, 5e-11);
  EXPECT_NEAR(l[19], 0.7, 1e-15);
  const LossFit fit = fit_loss_model(k, l);
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  expect_rel(fit.model.beta0, 0.05, 1e-7);
  expect_rel(fit.model.beta1, 1.0, 1e-7);
  expect_rel(fit.model.beta2, 0.2, 1e-7);
  EXPECT_LT(fit.sse, 1e-20);
  expect_rel(fit.c, 0.05, 1e-7);
}

TEST(OptimusKat, L2FixedPerturbation) {
  const auto k = epochs_1_to_20();
  auto l = curve(kBeta, k);
  for (std::size_t i = 0; i < l.size(); ++i) l[i] += 0.01 * ((i + 1) % 2 == 0 ? 1.0 : -1.0);
  EXPECT_NEAR(l[0], 1.1423809524, 5e-11);
  EXPECT_NEAR(l[19], 0.71, 1e-15);
  const LossFit fit = fit_loss_model(k, l);
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  EXPECT_LE(fit.sse, 1.982169086e-03 * (1 + 1e-6));
  expect_rel(fit.model.beta0, 0.049035001, 1e-4);
  expect_rel(fit.model.beta1, 0.998821034, 1e-4);
  expect_rel(fit.model.beta2, 0.195554714, 1e-4);
}

TEST(OptimusKat, L3ActiveBoundGivesZeroFloor) {
  const auto k = epochs_1_to_20();
  const auto l = curve({0.1, 0.5, 0.0}, k);
  const LossFit fit = fit_loss_model(k, l);
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  expect_rel(fit.model.beta0, 0.1, 1e-7);
  expect_rel(fit.model.beta1, 0.5, 1e-7);
  EXPECT_LE(std::abs(fit.model.beta2), 1e-9);
  EXPECT_LT(fit.sse, 1e-20);
}

TEST(OptimusKat, L4RemainingEpochs) {
  expect_rel(kBeta.epochs_to_target(0.30), 180.0, 1e-9);
  expect_rel(kBeta.epochs_to_target(0.25), 380.0, 1e-9);
  expect_rel(kBeta.epochs_to_target(0.21), 1980.0, 1e-9);
  EXPECT_EQ(kBeta.epochs_to_target(0.20), kInf);
  EXPECT_EQ(kBeta.epochs_to_target(0.10), kInf);
  EXPECT_EQ(kBeta.epochs_to_target(2.0), 0.0);  // already below at k = 0

  EXPECT_EQ(kBeta.epochs_to_convergence(1e-3), 121.0);
  EXPECT_NEAR(kBeta.loss(121) - kBeta.loss(122), 9.98901e-4, 5e-10);
  EXPECT_NEAR(kBeta.loss(120) - kBeta.loss(121), 1.01317e-3, 5e-9);
  EXPECT_EQ(kBeta.epochs_to_convergence(1e-4), 427.0);
  EXPECT_EQ(kBeta.epochs_to_convergence(1.0), 0.0);
  EXPECT_EQ(kBeta.epochs_to_convergence(0.0), kInf);

  expect_rel(remaining_epochs(kBeta.epochs_to_target(0.25), 20.0), 360.0, 1e-9);
  EXPECT_EQ(remaining_epochs(kBeta.epochs_to_target(0.25), 500.0), 0.0);
  EXPECT_EQ(remaining_epochs(kInf, 20.0), kInf);
}

TEST(OptimusLoss, WeightsAndScaleDoNotMoveAnExactFit) {
  const auto k = epochs_1_to_20();
  auto l = curve(kBeta, k);
  for (double& v : l) v *= 1000.0;  // the normalization maps β back
  std::vector<double> w;
  for (double e : k) w.push_back(e);
  const LossFit fit = fit_loss_model(k, l, w);
  ASSERT_EQ(fit.status, FitStatus::ok);
  expect_rel(fit.model.beta0, 0.05 / 1000.0, 1e-7);
  expect_rel(fit.model.beta1, 1.0 / 1000.0, 1e-7);
  expect_rel(fit.model.beta2, 200.0, 1e-7);
}

TEST(OptimusLoss, Gates) {
  // Fewer than 3 distinct k.
  EXPECT_EQ(fit_loss_model(std::vector<double>{1, 1, 2}, std::vector<double>{1, 1, 0.9}).status,
            FitStatus::too_few_points);
  EXPECT_EQ(fit_loss_model(std::vector<double>{}, std::vector<double>{}).status,
            FitStatus::too_few_points);
  // A rising loss has no decreasing trend.
  const auto k = epochs_1_to_20();
  std::vector<double> rising;
  for (double e : k) rising.push_back(1.0 + 0.01 * e);
  EXPECT_EQ(fit_loss_model(k, rising).status, FitStatus::no_trend);
  // Noisy data against a tight residual bound.
  auto l = curve(kBeta, k);
  for (std::size_t i = 0; i < l.size(); ++i) l[i] += (i % 2 == 0 ? 0.05 : -0.05);
  const LossFit loose = fit_loss_model(k, l, {}, {.max_relative_rms = 0.2});
  EXPECT_EQ(loose.status, FitStatus::ok);
  const LossFit tight = fit_loss_model(k, l, {}, {.max_relative_rms = 0.01});
  EXPECT_EQ(tight.status, FitStatus::residual_too_large);
  EXPECT_GT(tight.relative_rms, 0.01);
  EXPECT_EQ(tight.relative_rms, loose.relative_rms);
  // A step down at the first point is best fitted with c at the top of the grid.
  std::vector<double> cliff(k.size(), 0.5);
  cliff[0] = 0.5 + 1.0 / 101.0;
  std::vector<double> k0 = k;
  k0[0] = 0.0;
  EXPECT_EQ(fit_loss_model(k0, cliff).status, FitStatus::saturated);
}

TEST(OptimusLoss, RejectsBadInputs) {
  const std::vector<double> k{1, 2, 3};
  const std::vector<double> l{1.0, 0.9, 0.8};
  EXPECT_THROW(fit_loss_model(k, std::vector<double>{1.0, 0.9}), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(k, std::vector<double>{1.0, kNaN, 0.8}), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(std::vector<double>{1, kInf, 3}, l), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(std::vector<double>{-1, 2, 3}, l), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(k, l, std::vector<double>{1, 0, 1}), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(k, l, std::vector<double>{1, 1}), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(k, l, {}, {.c_min = 0.0}), std::invalid_argument);
  EXPECT_THROW(fit_loss_model(k, l, {}, {.grid_points = 2}), std::invalid_argument);
}

// ---- speed model ---------------------------------------------------------------------------

const SpeedModel kS2{0.004, 0.02, 0.0, 0.003, 0.0, false};

std::vector<SpeedPoint> s2_points() {
  std::vector<SpeedPoint> pts;
  for (double w : {1.0, 2.0, 4.0, 8.0, 16.0}) pts.push_back({w, 512.0, kS2.step_time(512.0, w)});
  return pts;
}

TEST(OptimusKat, S1ParameterServerModel) {
  const SpeedModel theta{0.002, 0.05, 0.03, 0.01, 0.005, true};
  std::vector<SpeedPoint> pts;
  for (double p : {1.0, 2.0, 4.0}) {
    for (double w : {1.0, 2.0, 4.0, 8.0, 16.0}) {
      pts.push_back({w, 256.0, theta.step_time(256.0, w, p), 1.0, p});
    }
  }
  EXPECT_NEAR(theta.step_time(256, 1, 1), 0.607, 1e-12);
  EXPECT_NEAR(theta.step_time(256, 4, 2), 0.288, 1e-12);
  EXPECT_NEAR(theta.step_time(256, 16, 4), 0.382, 1e-12);
  const SpeedFit fit = fit_speed_model(pts, {.parameter_server = true});
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  EXPECT_EQ(fit.configurations, 15U);
  EXPECT_NEAR(fit.model.theta0, 0.002, 1e-9);
  EXPECT_NEAR(fit.model.theta1, 0.05, 1e-9);
  EXPECT_NEAR(fit.model.theta2, 0.03, 1e-9);
  EXPECT_NEAR(fit.model.theta3, 0.01, 1e-9);
  EXPECT_NEAR(fit.model.theta4, 0.005, 1e-9);
  // Without servers in the key the 15 points are only 5 configurations of the allreduce form.
  EXPECT_EQ(fit_speed_model(pts).configurations, 5U);
}

TEST(OptimusKat, S2AllreduceModelAndItsOptimum) {
  const auto pts = s2_points();
  const std::vector<double> expected{2.071, 1.05, 0.544, 0.3, 0.196};
  for (std::size_t i = 0; i < pts.size(); ++i) EXPECT_NEAR(pts[i].step_time, expected[i], 1e-12);
  const SpeedFit fit = fit_speed_model(pts);
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  EXPECT_NEAR(fit.model.theta0, 0.004, 1e-9);
  EXPECT_NEAR(fit.model.theta1, 0.02, 1e-9);
  EXPECT_NEAR(fit.model.theta3, 0.003, 1e-9);
  EXPECT_EQ(fit.model.theta2, 0.0);
  EXPECT_EQ(fit.model.theta4, 0.0);

  const SpeedModel& m = fit.model;
  EXPECT_NEAR(m.continuous_optimum(512), 26.127891, 5e-7);
  EXPECT_EQ(fastest_workers(m, 512, {1, 64}), 26);
  EXPECT_NEAR(m.step_time(512, 26), 0.176769, 5e-7);
  EXPECT_NEAR(512.0 / m.step_time(512, 26), 2896.4317, 5e-5);
  EXPECT_NEAR(m.step_time(512, 25), 0.176920, 5e-7);
  EXPECT_NEAR(m.step_time(512, 27), 0.176852, 5e-7);
  EXPECT_EQ(fastest_workers(m, 512, {1, 20}), 20);  // the bound binds
  EXPECT_EQ(fastest_workers(m, 512, {30, 64}), 30);

  EXPECT_EQ(workers_by_speedup(m, 512, {1, 64}, 0.05), 12);
  EXPECT_EQ(workers_by_speedup(m, 512, {1, 64}, 0.02), 17);
  EXPECT_EQ(workers_by_marginal_gain(m, 512, {1, 64}, 10000.0, 60.0), 15);
  EXPECT_EQ(workers_by_marginal_gain(m, 512, {1, 10}, 10000.0, 60.0), 10);
  EXPECT_EQ(workers_by_marginal_gain(m, 512, {1, 64}, 0.0, 60.0), 1);    // nothing left to do
  EXPECT_EQ(workers_by_marginal_gain(m, 512, {1, 64}, kInf, 60.0), 26);  // up to the fastest
}

TEST(OptimusKat, S3ClampedCoefficientThroughTheSpeedFit) {
  // t = θ0/w + θ1 + θ3·w is the allreduce form with M = 1.
  const std::vector<double> ws{1, 2, 3, 4, 6, 8};
  const std::vector<double> ts{2.10, 1.12, 0.80, 0.63, 0.47, 0.38};
  std::vector<SpeedPoint> pts;
  for (std::size_t i = 0; i < ws.size(); ++i) pts.push_back({ws[i], 1.0, ts[i]});
  const SpeedFit fit = fit_speed_model(pts);
  ASSERT_EQ(fit.status, FitStatus::ok);
  EXPECT_NEAR(fit.model.theta0, 1.960329489, 1e-8);
  EXPECT_NEAR(fit.model.theta1, 0.140702910, 1e-8);
  EXPECT_EQ(fit.model.theta3, 0.0);
  EXPECT_NEAR(fit.sse, 7.633168589e-05, 1e-8);
  EXPECT_EQ(fit.model.continuous_optimum(1.0), kInf);
}

TEST(OptimusSpeed, Gates) {
  auto pts = s2_points();
  pts.resize(2);
  EXPECT_EQ(fit_speed_model(pts).status, FitStatus::too_few_points);
  pts.push_back(pts[0]);  // a repeated configuration adds no information
  EXPECT_EQ(fit_speed_model(pts).status, FitStatus::too_few_points);
  EXPECT_EQ(fit_speed_model({}).status, FitStatus::too_few_points);
  // Three batches at one worker count: the constant and the w column are collinear.
  const std::vector<SpeedPoint> one_w{{2, 64, 0.5}, {2, 128, 0.8}, {2, 256, 1.4}};
  EXPECT_EQ(fit_speed_model(one_w).status, FitStatus::rank_deficient);
  // Noise against a residual bound.
  auto noisy = s2_points();
  for (std::size_t i = 0; i < noisy.size(); ++i) noisy[i].step_time *= i % 2 == 0 ? 1.2 : 0.8;
  EXPECT_EQ(fit_speed_model(noisy, {.max_relative_rms = 0.01}).status,
            FitStatus::residual_too_large);
  EXPECT_EQ(fit_speed_model(noisy, {.max_relative_rms = 1.0}).status, FitStatus::ok);
}

TEST(OptimusSpeed, WeightsFavourWellMeasuredPoints) {
  auto pts = s2_points();
  pts.push_back({32.0, 512.0, 10.0, 1e-9});  // an outlier measured over (almost) nothing
  const SpeedFit fit = fit_speed_model(pts);
  ASSERT_EQ(fit.status, FitStatus::ok);
  EXPECT_NEAR(fit.model.theta0, 0.004, 1e-4);
  EXPECT_NEAR(fit.model.theta3, 0.003, 1e-4);
}

TEST(OptimusSpeed, RejectsBadInputs) {
  for (int field = 0; field < 5; ++field) {
    for (double bad : {0.0, -1.0, kNaN, kInf}) {
      auto pts = s2_points();
      double* v[] = {&pts[1].workers, &pts[1].global_batch, &pts[1].step_time, &pts[1].weight,
                     &pts[1].servers};
      *v[field] = bad;
      EXPECT_THROW(fit_speed_model(pts), std::invalid_argument) << field << " " << bad;
    }
  }
  EXPECT_THROW(fastest_workers(kS2, 512, {0, 4}), std::invalid_argument);
  EXPECT_THROW(fastest_workers(kS2, 512, {5, 4}), std::invalid_argument);
  EXPECT_THROW(workers_by_speedup(kS2, 512, {0, 4}, 0.05), std::invalid_argument);
  EXPECT_THROW(workers_by_marginal_gain(kS2, 512, {1, 4}, -1.0, 60.0), std::invalid_argument);
  EXPECT_THROW(workers_by_marginal_gain(kS2, 512, {1, 4}, kNaN, 60.0), std::invalid_argument);
}

}  // namespace
}  // namespace kf::monitor
