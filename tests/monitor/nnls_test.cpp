// SPDX-License-Identifier: Apache-2.0
// Lawson–Hanson NNLS: KAT-OPT-S3 (a coefficient clamped at 0, with its
// KKT vector) and KAT-OPT-S1's design solved directly, then the KKT conditions on other data,
// degenerate designs (zero column, zero y, dependent columns, more columns than rows), the
// iteration cap, and the shape and non-finite checks.
#include "kf/monitor/nnls.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The unconstrained least-squares solution of a 3-column design, from the normal equations by
/// Cramer's rule (well enough conditioned for the KAT's small data).
std::vector<double> least_squares3(const DesignRows& a, const std::vector<double>& y) {
  double g[3][3] = {};
  double b[3] = {};
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (int r = 0; r < 3; ++r) {
      b[r] += a[i][r] * y[i];
      for (int c = 0; c < 3; ++c) g[r][c] += a[i][r] * a[i][c];
    }
  }
  auto det = [](const double m[3][3]) {
    return m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) -
           m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
           m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
  };
  const double d = det(g);
  std::vector<double> x(3);
  for (int c = 0; c < 3; ++c) {
    double m[3][3];
    for (int r = 0; r < 3; ++r) {
      for (int k = 0; k < 3; ++k) m[r][k] = k == c ? b[r] : g[r][k];
    }
    x[c] = det(m) / d;
  }
  return x;
}

/// The KKT conditions at the returned solution.
void expect_kkt(const NnlsResult& r, double tol) {
  ASSERT_EQ(r.x.size(), r.kkt.size());
  for (std::size_t j = 0; j < r.x.size(); ++j) {
    EXPECT_GE(r.x[j], 0.0) << j;
    if (r.x[j] > 0.0) {
      EXPECT_NEAR(r.kkt[j], 0.0, tol) << j;
    } else {
      EXPECT_LE(r.kkt[j], tol) << j;
    }
  }
}

DesignRows s3_design() {
  DesignRows a;
  for (double w : {1.0, 2.0, 3.0, 4.0, 6.0, 8.0}) a.push_back({1.0 / w, 1.0, w});
  return a;
}
const std::vector<double> kS3Times{2.10, 1.12, 0.80, 0.63, 0.47, 0.38};

TEST(NnlsKat, OptS3ClampsTheCoefficientThatLeastSquaresMakesNegative) {
  const DesignRows a = s3_design();
  const std::vector<double> ls = least_squares3(a, kS3Times);
  EXPECT_NEAR(ls[0], 1.948685259, 1e-8);
  EXPECT_NEAR(ls[1], 0.152324037, 1e-8);
  EXPECT_NEAR(ls[2], -0.001752988, 1e-8);
  EXPECT_NEAR(sum_squared_residuals(a, ls, kS3Times), 4.329349270e-05, 1e-12);

  const NnlsResult r = nnls(a, kS3Times);
  EXPECT_TRUE(r.converged);
  EXPECT_FALSE(r.rank_deficient);
  ASSERT_EQ(r.x.size(), 3U);
  EXPECT_NEAR(r.x[0], 1.960329489, 1e-8);
  EXPECT_NEAR(r.x[1], 0.140702910, 1e-8);
  EXPECT_EQ(r.x[2], 0.0);
  EXPECT_NEAR(r.residual_norm * r.residual_norm, 7.633168589e-05, 1e-8);
  EXPECT_NEAR(sum_squared_residuals(a, r.x, kS3Times), 7.633168589e-05, 1e-8);
  EXPECT_NEAR(r.kkt[0], 0.0, 1e-8);
  EXPECT_NEAR(r.kkt[1], 0.0, 1e-8);
  EXPECT_NEAR(r.kkt[2], -0.018846787, 1e-8);
}

TEST(NnlsKat, OptS1RecoversTheParameterServerModel) {
  const std::vector<double> theta{0.002, 0.05, 0.03, 0.01, 0.005};
  DesignRows a;
  std::vector<double> y;
  for (double p : {1.0, 2.0, 4.0}) {
    for (double w : {1.0, 2.0, 4.0, 8.0, 16.0}) {
      a.push_back({256.0 / w, 1.0, w / p, w, p});
      double t = 0.0;
      for (std::size_t j = 0; j < theta.size(); ++j) t += a.back()[j] * theta[j];
      y.push_back(t);
    }
  }
  EXPECT_NEAR(y[0], 0.607, 1e-12);       // t(1, 1)
  EXPECT_NEAR(y[5 + 2], 0.288, 1e-12);   // t(2, 4)
  EXPECT_NEAR(y[10 + 4], 0.382, 1e-12);  // t(4, 16)
  const NnlsResult r = nnls(a, y);
  ASSERT_TRUE(r.converged);
  for (std::size_t j = 0; j < theta.size(); ++j) EXPECT_NEAR(r.x[j], theta[j], 1e-9) << j;
  EXPECT_LT(r.residual_norm, 1e-12);
}

TEST(Nnls, PositiveSolutionEqualsLeastSquares) {
  // y = 2 + 3·u exactly plus a small alternating term: both coefficients stay positive.
  DesignRows a;
  std::vector<double> y;
  for (int i = 0; i < 8; ++i) {
    a.push_back({1.0, static_cast<double>(i), static_cast<double>(i * i)});
    y.push_back(2.0 + 3.0 * i + 0.5 * i * i + (i % 2 == 0 ? 0.01 : -0.01));
  }
  const NnlsResult r = nnls(a, y);
  const std::vector<double> ls = least_squares3(a, y);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(r.x[j], ls[j], 1e-9) << j;
  expect_kkt(r, 1e-9);
}

TEST(Nnls, SatisfiesKktWhenSeveralBoundsAreActive) {
  // y decreases in every feature: the best non-negative fit uses only the constant.
  DesignRows a;
  std::vector<double> y;
  for (int i = 1; i <= 10; ++i) {
    const double u = i;
    a.push_back({1.0, u, u * u, std::sqrt(u)});
    y.push_back(10.0 - 0.5 * u + 0.1 * std::sin(u));
  }
  const NnlsResult r = nnls(a, y);
  EXPECT_TRUE(r.converged);
  expect_kkt(r, 1e-9);
  EXPECT_GT(r.x[0], 0.0);
  EXPECT_EQ(r.x[1], 0.0);
  EXPECT_EQ(r.x[2], 0.0);
}

TEST(Nnls, ZeroTargetGivesZero) {
  const NnlsResult r = nnls(s3_design(), std::vector<double>(6, 0.0));
  for (double v : r.x) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(r.residual_norm, 0.0);
  EXPECT_EQ(r.iterations, 0U);
}

TEST(Nnls, AllNegativeCorrelationGivesZero) {
  const NnlsResult r = nnls({{1.0}, {2.0}, {3.0}}, std::vector<double>{-1.0, -2.0, -3.0});
  EXPECT_EQ(r.x[0], 0.0);
  EXPECT_NEAR(r.kkt[0], -14.0, 1e-12);
  EXPECT_NEAR(r.residual_norm, std::sqrt(14.0), 1e-12);
}

TEST(Nnls, ZeroColumnGetsZeroCoefficient) {
  DesignRows a;
  std::vector<double> y;
  for (double u : {1.0, 2.0, 3.0, 4.0}) {
    a.push_back({1.0, 0.0, u});
    y.push_back(1.0 + 2.0 * u);
  }
  const NnlsResult r = nnls(a, y);
  EXPECT_NEAR(r.x[0], 1.0, 1e-12);
  EXPECT_EQ(r.x[1], 0.0);
  EXPECT_NEAR(r.x[2], 2.0, 1e-12);
  EXPECT_FALSE(full_column_rank(a));
}

TEST(Nnls, DuplicateColumnStaysOut) {
  // Columns 0 and 1 are equal: once one is passive the residual is orthogonal to the other, whose
  // gradient is then 0, so it never enters; the fit is still exact.
  DesignRows a;
  std::vector<double> y;
  for (double u : {1.0, 2.0, 3.0, 4.0, 5.0}) {
    a.push_back({u, u, 1.0});
    y.push_back(3.0 * u + 1.0);
  }
  EXPECT_FALSE(full_column_rank(a));
  const NnlsResult r = nnls(a, y);
  EXPECT_TRUE(r.converged);
  EXPECT_TRUE(r.x[0] == 0.0 || r.x[1] == 0.0);
  EXPECT_NEAR(r.x[0] + r.x[1], 3.0, 1e-10);
  EXPECT_NEAR(r.x[2], 1.0, 1e-10);
  EXPECT_LT(r.residual_norm, 1e-10);
}

TEST(Nnls, MoreColumnsThanRows) {
  const DesignRows a{{1.0, 2.0, 3.0}, {1.0, 1.0, 1.0}};
  const std::vector<double> y{6.0, 3.0};
  EXPECT_FALSE(full_column_rank(a));
  const NnlsResult r = nnls(a, y);
  EXPECT_TRUE(r.converged);
  EXPECT_LT(r.residual_norm, 1e-12);
  expect_kkt(r, 1e-10);
  int positive = 0;
  for (double v : r.x) positive += v > 0.0 ? 1 : 0;
  EXPECT_LE(positive, 2);  // a basic solution: at most rank(A) columns are used
}

TEST(Nnls, IterationCapIsReported) {
  const NnlsResult r = nnls(s3_design(), kS3Times, {.iterations_per_column = 0});
  EXPECT_FALSE(r.converged);
  for (double v : r.x) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(r.iterations, 0U);
}

TEST(Nnls, RejectsBadShapesAndValues) {
  const std::vector<double> y3{1.0, 2.0, 3.0};
  EXPECT_THROW(nnls({}, std::vector<double>{}), std::invalid_argument);
  EXPECT_THROW(nnls({{}, {}, {}}, y3), std::invalid_argument);
  EXPECT_THROW(nnls({{1.0, 2.0}, {1.0}, {1.0, 3.0}}, y3), std::invalid_argument);
  EXPECT_THROW(nnls({{1.0}, {2.0}}, y3), std::invalid_argument);
  EXPECT_THROW(nnls({{1.0}, {kNaN}, {3.0}}, y3), std::invalid_argument);
  EXPECT_THROW(nnls({{1.0}, {2.0}, {3.0}}, std::vector<double>{1.0, kNaN, 3.0}),
               std::invalid_argument);
  EXPECT_THROW(nnls({{1.0}, {std::numeric_limits<double>::infinity()}, {3.0}}, y3),
               std::invalid_argument);
  EXPECT_THROW(full_column_rank({}), std::invalid_argument);
  EXPECT_THROW(
      sum_squared_residuals({{1.0}}, std::vector<double>{1.0, 2.0}, std::vector<double>{1.0}),
      std::invalid_argument);
  try {
    nnls({{1.0, 2.0}, {1.0}}, std::vector<double>{1.0, 2.0});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "nnls: row 1 has 1 columns, row 0 has 2");
  }
}

}  // namespace
}  // namespace kf::monitor
