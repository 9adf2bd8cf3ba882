// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/nnls.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

namespace kf::monitor {
namespace {

using Column = std::vector<double>;

void check_design(const DesignRows& a, const char* who) {
  if (a.empty()) throw std::invalid_argument(std::string(who) + ": the design has no rows");
  const std::size_t n = a.front().size();
  if (n == 0) throw std::invalid_argument(std::string(who) + ": the design has no columns");
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != n) {
      throw std::invalid_argument(std::string(who) + ": row " + std::to_string(i) + " has " +
                                  std::to_string(a[i].size()) + " columns, row 0 has " +
                                  std::to_string(n));
    }
    for (double v : a[i]) {
      if (!std::isfinite(v)) {
        throw std::invalid_argument(std::string(who) + ": row " + std::to_string(i) +
                                    " has a value that is not finite");
      }
    }
  }
}

void check_vector(std::span<const double> v, std::size_t expected, const char* who,
                  const char* what) {
  if (v.size() != expected) {
    throw std::invalid_argument(std::string(who) + ": " + what + " has " +
                                std::to_string(v.size()) + " entries, expected " +
                                std::to_string(expected));
  }
  for (double e : v) {
    if (!std::isfinite(e)) {
      throw std::invalid_argument(std::string(who) + ": " + what +
                                  " has a value that is not finite");
    }
  }
}

/// The design's columns divided by their norms; a zero column stays zero with scale 0.
struct ScaledColumns {
  std::vector<Column> columns;
  std::vector<double> norms;
};

ScaledColumns scale_columns(const DesignRows& a) {
  const std::size_t m = a.size();
  const std::size_t n = a.front().size();
  ScaledColumns s;
  s.columns.assign(n, Column(m, 0.0));
  s.norms.assign(n, 0.0);
  for (std::size_t j = 0; j < n; ++j) {
    double sq = 0.0;
    for (std::size_t i = 0; i < m; ++i) sq += a[i][j] * a[i][j];
    s.norms[j] = std::sqrt(sq);
    for (std::size_t i = 0; i < m; ++i) {
      s.columns[j][i] = s.norms[j] > 0.0 ? a[i][j] / s.norms[j] : 0.0;
    }
  }
  return s;
}

/// The least-squares solution over the unit-norm columns `cols[set[0..k)]` by Householder QR.
/// Returns nullopt and the position in `set` of the first column that is linearly dependent on
/// the ones before it.
struct SubproblemResult {
  std::optional<std::vector<double>> z;
  std::size_t dependent_at = 0;
};

SubproblemResult solve_subproblem(const std::vector<Column>& cols,
                                  const std::vector<std::size_t>& set, std::span<const double> y,
                                  double rank_tolerance) {
  const std::size_t m = y.size();
  const std::size_t k = set.size();
  std::vector<Column> r(k);  // the columns, reduced in place to R (column-major)
  for (std::size_t c = 0; c < k; ++c) r[c] = cols[set[c]];
  std::vector<double> qty(y.begin(), y.end());
  for (std::size_t c = 0; c < k; ++c) {
    double sq = 0.0;
    for (std::size_t i = c; i < m; ++i) sq += r[c][i] * r[c][i];
    const double alpha_norm = std::sqrt(sq);
    // Reflections preserve the column's norm (1): what is left below the diagonal is its part
    // orthogonal to the earlier columns.
    if (c >= m || alpha_norm <= rank_tolerance) return {std::nullopt, c};
    // v = x − α·e1 with α = −sign(x0)·‖x‖ (no cancellation); H = I − 2vvᵀ/vᵀv.
    const double alpha = r[c][c] > 0.0 ? -alpha_norm : alpha_norm;
    Column v(r[c].begin() + static_cast<std::ptrdiff_t>(c), r[c].end());
    v[0] -= alpha;
    double vv = 0.0;
    for (double e : v) vv += e * e;
    auto reflect = [&](Column& target) {
      double dot = 0.0;
      for (std::size_t i = c; i < m; ++i) dot += v[i - c] * target[i];
      const double f = 2.0 * dot / vv;
      for (std::size_t i = c; i < m; ++i) target[i] -= f * v[i - c];
    };
    for (std::size_t d = c + 1; d < k; ++d) reflect(r[d]);
    reflect(qty);
    r[c][c] = alpha;
    for (std::size_t i = c + 1; i < m; ++i) r[c][i] = 0.0;
  }
  std::vector<double> z(k, 0.0);
  for (std::size_t c = k; c-- > 0;) {
    double s = qty[c];
    for (std::size_t d = c + 1; d < k; ++d) s -= r[d][c] * z[d];
    z[c] = s / r[c][c];
  }
  return {std::move(z), 0};
}

/// Bᵀ(y − Bx) over the scaled columns.
std::vector<double> gradient(const std::vector<Column>& cols, std::span<const double> x,
                             std::span<const double> y) {
  const std::size_t m = y.size();
  std::vector<double> resid(y.begin(), y.end());
  for (std::size_t j = 0; j < cols.size(); ++j) {
    if (x[j] == 0.0) continue;
    for (std::size_t i = 0; i < m; ++i) resid[i] -= cols[j][i] * x[j];
  }
  std::vector<double> w(cols.size(), 0.0);
  for (std::size_t j = 0; j < cols.size(); ++j) {
    for (std::size_t i = 0; i < m; ++i) w[j] += cols[j][i] * resid[i];
  }
  return w;
}

/// The state of the active-set iteration over the scaled columns.
class LawsonHanson {
 public:
  LawsonHanson(const ScaledColumns& s, std::span<const double> y, const NnlsOptions& o)
      : s_(s), y_(y), o_(o), x_(s.norms.size(), 0.0), in_passive_(s.norms.size(), false) {}

  /// Runs to convergence or to the iteration cap; returns x over the scaled columns.
  void run(NnlsResult& out) {
    const std::size_t n = x_.size();
    std::vector<double> w = gradient(s_.columns, x_, y_);
    double scale = 1.0;
    for (double e : w) scale = std::max(scale, std::abs(e));  // x = 0 here: w = Bᵀy
    const double tol = o_.dual_tolerance * scale;
    const std::size_t cap = o_.iterations_per_column * n;
    std::vector<bool> refused(n, false);  // cleared whenever x moves
    for (;;) {
      const std::optional<std::size_t> t = entering(w, refused, tol);
      if (!t) break;
      if (out.iterations == cap) {
        out.converged = false;
        break;
      }
      ++out.iterations;
      std::vector<std::size_t> trial = passive_;
      trial.push_back(*t);
      SubproblemResult sub = solve_subproblem(s_.columns, trial, y_, o_.rank_tolerance);
      if (!sub.z || sub.z->back() <= 0.0) {
        // Dependent on the passive columns, or rounding made the gradient's sign lie (Lawson
        // and Hanson's safeguard): refuse the column until x moves.
        if (!sub.z) out.rank_deficient = true;
        refused[*t] = true;
        continue;
      }
      passive_ = std::move(trial);
      in_passive_[*t] = true;
      descend(std::move(*sub.z));
      std::fill(refused.begin(), refused.end(), false);
      w = gradient(s_.columns, x_, y_);
    }
  }

  const std::vector<double>& x() const { return x_; }

 private:
  std::optional<std::size_t> entering(const std::vector<double>& w,
                                      const std::vector<bool>& refused, double tol) const {
    std::optional<std::size_t> best;
    for (std::size_t j = 0; j < w.size(); ++j) {
      if (in_passive_[j] || refused[j] || s_.norms[j] == 0.0 || w[j] <= tol) continue;
      if (!best || w[j] > w[*best]) best = j;
    }
    return best;
  }

  // The inner loop: move from x towards the subproblem solution z, dropping the columns whose
  // coefficient reaches zero first, until z is strictly positive on the passive set.
  void descend(std::vector<double> z) {
    for (;;) {
      std::optional<std::size_t> blocking;
      double alpha = 1.0;
      for (std::size_t c = 0; c < passive_.size(); ++c) {
        if (z[c] > 0.0) continue;
        const double xj = x_[passive_[c]];
        const double step = xj / (xj - z[c]);
        if (!blocking || step < alpha) {
          alpha = step;
          blocking = c;
        }
      }
      if (!blocking) {
        for (std::size_t c = 0; c < passive_.size(); ++c) x_[passive_[c]] = z[c];
        return;
      }
      for (std::size_t c = 0; c < passive_.size(); ++c) {
        double& xj = x_[passive_[c]];
        xj += alpha * (z[c] - xj);
      }
      x_[passive_[*blocking]] = 0.0;
      std::vector<std::size_t> kept;
      for (std::size_t j : passive_) {
        if (x_[j] > 0.0) {
          kept.push_back(j);
        } else {
          x_[j] = 0.0;
          in_passive_[j] = false;
        }
      }
      passive_ = std::move(kept);
      if (passive_.empty()) return;
      // A subset of independent columns stays independent, so this solve succeeds.
      z = *solve_subproblem(s_.columns, passive_, y_, o_.rank_tolerance).z;
    }
  }

  const ScaledColumns& s_;
  std::span<const double> y_;
  const NnlsOptions& o_;
  std::vector<double> x_;
  std::vector<bool> in_passive_;
  std::vector<std::size_t> passive_;  // in the order the columns entered
};

}  // namespace

NnlsResult nnls(const DesignRows& a, std::span<const double> y, const NnlsOptions& options) {
  check_design(a, "nnls");
  check_vector(y, a.size(), "nnls", "y");
  const ScaledColumns s = scale_columns(a);
  NnlsResult out;
  LawsonHanson solver(s, y, options);
  solver.run(out);
  const std::size_t n = s.norms.size();
  out.x.assign(n, 0.0);
  for (std::size_t j = 0; j < n; ++j) {
    if (s.norms[j] > 0.0) out.x[j] = solver.x()[j] / s.norms[j];
  }
  std::vector<double> resid(y.begin(), y.end());
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (std::size_t j = 0; j < n; ++j) resid[i] -= a[i][j] * out.x[j];
  }
  out.kkt.assign(n, 0.0);
  double sq = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sq += resid[i] * resid[i];
    for (std::size_t j = 0; j < n; ++j) out.kkt[j] += a[i][j] * resid[i];
  }
  out.residual_norm = std::sqrt(sq);
  return out;
}

bool full_column_rank(const DesignRows& a, double rank_tolerance) {
  check_design(a, "full_column_rank");
  const ScaledColumns s = scale_columns(a);
  std::vector<std::size_t> all(s.norms.size());
  for (std::size_t j = 0; j < all.size(); ++j) {
    if (s.norms[j] == 0.0) return false;
    all[j] = j;
  }
  const std::vector<double> zeros(a.size(), 0.0);
  return solve_subproblem(s.columns, all, zeros, rank_tolerance).z.has_value();
}

double sum_squared_residuals(const DesignRows& a, std::span<const double> x,
                             std::span<const double> y) {
  if (y.size() != a.size()) {
    throw std::invalid_argument("sum_squared_residuals: y and the design differ in rows");
  }
  double sse = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != x.size()) {
      throw std::invalid_argument("sum_squared_residuals: x and the design differ in columns");
    }
    double r = y[i];
    for (std::size_t j = 0; j < x.size(); ++j) r -= a[i][j] * x[j];
    sse += r * r;
  }
  return sse;
}

}  // namespace kf::monitor
