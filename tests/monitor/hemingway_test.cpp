// SPDX-License-Identifier: Apache-2.0
// Hemingway's models: KAT-HEM-1 (Ernest's system model and its argmin),
// KAT-HEM-2 (the convergence model), KAT-HEM-3 (machines for a time budget) and KAT-HEM-4
// (machines for an error target), each value checked to the digits it is given to; then the
// general dictionary (bisection against the closed form), an elastic start offset, the gates
// and the input checks.
#include "kf/monitor/hemingway.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// |actual − printed| within half a unit of the printed value's last significant digit.
void expect_printed(double actual, double printed, int significant) {
  const double unit = std::pow(10.0, std::floor(std::log10(std::abs(printed))) - significant + 1);
  EXPECT_LE(std::abs(actual - printed), 0.5 * unit * (1 + 1e-9))
      << "actual " << actual << " printed " << printed;
}

const SystemModel kTheta{0.5, 40.0, 0.3, 0.02};
const std::vector<double> kLambda{2.0, 0.25, 50.0};

ConvergenceModel kat_convergence() {
  ConvergenceModel g;
  g.lambda = kLambda;
  return g;
}

CombinedModel kat_combined() {
  CombinedModel c;
  c.system = kTheta;
  c.convergence = kat_convergence();
  c.size = 1.0;
  c.min_machines = 1;
  c.max_machines = 64;
  return c;
}

std::vector<ConvergencePoint> hem2_points(const ConvergenceModel& g) {
  std::vector<ConvergencePoint> pts;
  for (double m : {1.0, 2.0, 4.0, 8.0}) {
    for (double i : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0}) pts.push_back({i, m, g.loss(i, m)});
  }
  return pts;
}

TEST(HemingwayKat, Hem1SystemModel) {
  const std::vector<double> ms{1, 2, 4, 8, 16, 32};
  const std::vector<double> f{40.52,       20.747944154, 10.995888308,
                              6.283832463, 4.151776617,  3.429720771};
  std::vector<SystemPoint> pts;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    EXPECT_NEAR(kTheta.iteration_time(ms[i]), f[i], 5e-10) << ms[i];
    pts.push_back({ms[i], 1.0, kTheta.iteration_time(ms[i])});
  }
  const SystemFit fit = fit_system_model(pts);
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  EXPECT_EQ(fit.configurations, 6U);
  EXPECT_NEAR(fit.model.theta0, 0.5, 1e-9);
  EXPECT_NEAR(fit.model.theta1, 40.0, 1e-9);
  EXPECT_NEAR(fit.model.theta2, 0.3, 1e-9);
  EXPECT_NEAR(fit.model.theta3, 0.02, 1e-9);

  CombinedModel c = kat_combined();
  c.system = fit.model;
  c.max_machines = 128;
  int best = 1;
  for (int m = 2; m <= 128; ++m) {
    if (c.system.iteration_time(m) < c.system.iteration_time(best)) best = m;
  }
  EXPECT_EQ(best, 38);
  EXPECT_NEAR(c.system.iteration_time(38), 3.403907, 5e-7);
}

TEST(HemingwayKat, Hem2ConvergenceModel) {
  const ConvergenceModel truth = kat_convergence();
  const ConvergenceFit fit = fit_convergence_model(hem2_points(truth));
  ASSERT_EQ(fit.status, FitStatus::ok) << to_string(fit.status);
  EXPECT_EQ(fit.distinct_points, 28U);
  ASSERT_EQ(fit.model.lambda.size(), 3U);
  EXPECT_NEAR(fit.model.lambda[0], 2.0, 1e-9);
  EXPECT_NEAR(fit.model.lambda[1], 0.25, 1e-9);
  EXPECT_NEAR(fit.model.lambda[2], 50.0, 1e-9);
  EXPECT_LT(fit.sse, 1e-20);
}

TEST(HemingwayKat, Hem3TimeBudget) {
  struct Row {
    double t;
    int m;
    double h, h1, h8, h32;
  };
  const std::vector<Row> rows{
      {10, 28, 9.22329, 830.052, 22.2568, 9.31121},
      {100, 17, 0.334407, 9.12105, 0.448786, 0.401787},
      {1000, 13, 0.0252446, 0.173264, 0.0271097, 0.0348854},
      {10000, 12, 0.00242101, 0.00993794, 0.00253328, 0.0034356},
  };
  const CombinedModel c = kat_combined();
  for (const Row& r : rows) {
    const MachineChoice best = best_machines_for_time(c, r.t);
    EXPECT_EQ(best.machines, r.m) << r.t;
    expect_printed(best.value, r.h, 6);
    expect_printed(c.loss_after(r.t, 1), r.h1, 6);
    expect_printed(c.loss_after(r.t, 8), r.h8, 6);
    expect_printed(c.loss_after(r.t, 32), r.h32, 6);
    EXPECT_DOUBLE_EQ(best.iterations, r.t / kTheta.iteration_time(r.m));
  }
}

TEST(HemingwayKat, Hem4ErrorTarget) {
  struct Row {
    double eps;
    int m;
    double i, t;
  };
  const std::vector<Row> rows{
      {1.0, 21, 11.571108, 43.254173},
      {0.1, 14, 62.943617, 278.768472},
      {0.01, 12, 509.807621, 2456.663681},
  };
  const CombinedModel c = kat_combined();
  for (const Row& r : rows) {
    const MachineChoice best = best_machines_for_target(c, r.eps);
    EXPECT_EQ(best.machines, r.m) << r.eps;
    EXPECT_NEAR(best.iterations, r.i, 5e-7);
    EXPECT_NEAR(best.value, r.t, 5e-7);
    EXPECT_NEAR(c.convergence.loss(best.iterations, r.m), r.eps, 1e-12 * r.eps + 1e-15);
  }
}

TEST(Hemingway, BisectionAgreesWithTheClosedForm) {
  // The same λ under a reordered dictionary goes through bisection.
  ConvergenceModel general;
  general.terms = {ConvergenceTerm::inv_i2, ConvergenceTerm::inv_i, ConvergenceTerm::m_over_i};
  general.lambda = {50.0, 2.0, 0.25};
  const ConvergenceModel closed = kat_convergence();
  for (double eps : {10.0, 1.0, 0.1, 0.01, 1e-4}) {
    for (double m : {1.0, 7.0, 64.0}) {
      const double a = closed.iterations_to(eps, m);
      const double b = general.iterations_to(eps, m);
      EXPECT_NEAR(b, a, 1e-10 * a) << eps << " " << m;
    }
  }
  // A floor: reachable only above it.
  ConvergenceModel floored;
  floored.terms = {ConvergenceTerm::constant, ConvergenceTerm::inv_sqrt_i};
  floored.lambda = {0.1, 1.0};
  EXPECT_NEAR(floored.iterations_to(0.2, 1.0), 100.0, 1e-9);  // 0.1 + 1/√i = 0.2
  EXPECT_EQ(floored.iterations_to(0.1, 1.0), kInf);
  EXPECT_EQ(floored.iterations_to(0.05, 1.0), kInf);
  EXPECT_EQ(closed.iterations_to(0.0, 1.0), kInf);
  EXPECT_EQ(closed.iterations_to(kNaN, 1.0), kInf);
  ConvergenceModel flat;
  flat.terms = {ConvergenceTerm::constant, ConvergenceTerm::inv_i};
  flat.lambda = {0.3, 0.0};
  EXPECT_EQ(flat.iterations_to(0.5, 1.0), 0.0);
  EXPECT_EQ(flat.iterations_to(0.2, 1.0), kInf);
}

TEST(Hemingway, StartOffsetCountsOnlyTheIterationsLeft) {
  CombinedModel c = kat_combined();
  c.start_iterations = 30.0;
  const double i_left = c.convergence.iterations_to(0.1, 14) - 30.0;
  EXPECT_NEAR(c.time_to(0.1, 14), i_left * kTheta.iteration_time(14), 1e-9);
  EXPECT_NEAR(c.loss_after(100.0, 8),
              c.convergence.loss(30.0 + 100.0 / kTheta.iteration_time(8), 8), 1e-15);
  c.start_iterations = 1e6;  // already there: no time needed anywhere, the smallest m wins
  const MachineChoice done = best_machines_for_target(c, 0.1);
  EXPECT_EQ(done.machines, 1);
  EXPECT_EQ(done.value, 0.0);
  c.start_iterations = 0.0;
  c.convergence.terms = {ConvergenceTerm::constant, ConvergenceTerm::inv_i};
  c.convergence.lambda = {1.0, 1.0};
  const MachineChoice never = best_machines_for_target(c, 0.5);
  EXPECT_EQ(never.machines, 0);
  EXPECT_EQ(never.value, kInf);
}

TEST(Hemingway, Gates) {
  std::vector<SystemPoint> three{{1, 1, 40.52}, {2, 1, 20.75}, {4, 1, 11.0}};
  EXPECT_EQ(fit_system_model(three).status, FitStatus::too_few_points);
  three.push_back(three[2]);
  EXPECT_EQ(fit_system_model(three).status, FitStatus::too_few_points);
  // Four data scales at one machine count: the features 1, ln m and m coincide up to scale.
  const std::vector<SystemPoint> one_m{{4, 1, 10}, {4, 2, 20}, {4, 3, 30}, {4, 4, 40}};
  EXPECT_EQ(fit_system_model(one_m).status, FitStatus::rank_deficient);

  // One machine count: 1/i and m/i are collinear.
  const ConvergenceModel truth = kat_convergence();
  std::vector<ConvergencePoint> one;
  for (const auto& p : hem2_points(truth)) {
    if (p.machines == 2.0) one.push_back(p);
  }
  EXPECT_EQ(fit_convergence_model(one).status, FitStatus::rank_deficient);
  std::vector<ConvergencePoint> two(one.begin(), one.begin() + 2);
  EXPECT_EQ(fit_convergence_model(two).status, FitStatus::too_few_points);

  auto noisy = hem2_points(truth);
  for (std::size_t i = 0; i < noisy.size(); ++i) noisy[i].loss *= i % 2 == 0 ? 1.3 : 0.7;
  EXPECT_EQ(fit_convergence_model(noisy, {.max_relative_rms = 0.05}).status,
            FitStatus::residual_too_large);
  EXPECT_EQ(fit_convergence_model(noisy, {.max_relative_rms = 1.0}).status, FitStatus::ok);
}

TEST(Hemingway, RejectsBadInputs) {
  for (double bad : {0.0, -2.0, kNaN, kInf}) {
    EXPECT_THROW(fit_system_model(std::vector<SystemPoint>{{bad, 1, 1}}), std::invalid_argument);
    EXPECT_THROW(fit_system_model(std::vector<SystemPoint>{{1, bad, 1}}), std::invalid_argument);
    EXPECT_THROW(fit_system_model(std::vector<SystemPoint>{{1, 1, bad}}), std::invalid_argument);
    EXPECT_THROW(fit_system_model(std::vector<SystemPoint>{{1, 1, 1, bad}}), std::invalid_argument);
    EXPECT_THROW(fit_convergence_model(std::vector<ConvergencePoint>{{bad, 1, 1}}),
                 std::invalid_argument);
    EXPECT_THROW(fit_convergence_model(std::vector<ConvergencePoint>{{1, bad, 1}}),
                 std::invalid_argument);
  }
  EXPECT_THROW(fit_convergence_model(std::vector<ConvergencePoint>{{1, 1, kNaN}}),
               std::invalid_argument);
  EXPECT_THROW(fit_convergence_model({}, {.terms = {}}), std::invalid_argument);
  EXPECT_THROW(
      fit_convergence_model({}, {.terms = {ConvergenceTerm::inv_i, ConvergenceTerm::inv_i}}),
      std::invalid_argument);
  CombinedModel c = kat_combined();
  EXPECT_THROW(best_machines_for_time(c, 0.0), std::invalid_argument);
  EXPECT_THROW(best_machines_for_time(c, kInf), std::invalid_argument);
  EXPECT_THROW(best_machines_for_target(c, kNaN), std::invalid_argument);
  c.min_machines = 0;
  EXPECT_THROW(best_machines_for_time(c, 10.0), std::invalid_argument);
  c.min_machines = 65;
  EXPECT_THROW(best_machines_for_target(c, 0.1), std::invalid_argument);
}

}  // namespace
}  // namespace kf::monitor
