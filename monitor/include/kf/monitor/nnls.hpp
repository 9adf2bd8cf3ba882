// SPDX-License-Identifier: Apache-2.0
// Non-negative least squares: minimize ‖Ax − y‖₂ subject to x ≥ 0 with Lawson and Hanson's
// active-set method, for the small dense fits of the performance models (the Optimus and Hemingway
// models: a few columns, tens of rows). Every passive-set subproblem is solved with Householder QR,
// never the normal equations, because the model features differ by orders of magnitude (M/w next to
// w). Columns are scaled to unit norm before solving.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace kf::monitor {

/// A design matrix as its rows: rows[i][j] is feature j of observation i.
using DesignRows = std::vector<std::vector<double>>;

struct NnlsOptions {
  /// Dual (KKT) tolerance factor: a column may enter while its scaled gradient exceeds
  /// dual_tolerance·max(1, max|Aᵀy|) (1e-12).
  double dual_tolerance = 1e-12;
  /// A column whose part orthogonal to the passive columns is below rank_tolerance × its norm
  /// is linearly dependent on them and never enters (the design is rank-deficient there).
  double rank_tolerance = 1e-10;
  /// Outer iterations allowed per column (3n in all).
  std::size_t iterations_per_column = 3;
};

struct NnlsResult {
  std::vector<double> x;       ///< the solution, x ≥ 0
  double residual_norm = 0.0;  ///< ‖Ax − y‖₂
  std::vector<double> kkt;     ///< Aᵀ(y − Ax): 0 where x_j > 0, ≤ 0 (to tolerance) where 0
  std::size_t iterations = 0;  ///< outer iterations (columns that entered the passive set)
  bool converged = true;       ///< false when the iteration cap stopped it
  /// A column was refused for linear dependence on the passive ones (in exact arithmetic such a
  /// column has a zero gradient and never tries to enter; rounding can make it try).
  bool rank_deficient = false;
};

/// Solves min ‖Ax − y‖₂ s.t. x ≥ 0 (Lawson–Hanson). A zero column gets x_j = 0; y = 0 gives
/// x = 0; more columns than rows or dependent columns are handled by refusing dependent columns
/// (rank_deficient reports it).
/// Throws: std::invalid_argument when there are no rows or no columns, the rows differ in
/// length, y's length is not the number of rows, or any input is NaN or infinite.
NnlsResult nnls(const DesignRows& a, std::span<const double> y, const NnlsOptions& options = {});

/// Whether the columns of `a` are linearly independent (Householder QR with the relative
/// tolerance of NnlsOptions::rank_tolerance on unit-norm columns). A zero column is dependent.
/// Throws: std::invalid_argument as nnls() for the shape and non-finite values of `a`.
bool full_column_rank(const DesignRows& a, double rank_tolerance = 1e-10);

/// Σ (y_i − (Ax)_i)², summed in row order.
/// Throws: std::invalid_argument when the shapes do not match.
double sum_squared_residuals(const DesignRows& a, std::span<const double> x,
                             std::span<const double> y);

}  // namespace kf::monitor
