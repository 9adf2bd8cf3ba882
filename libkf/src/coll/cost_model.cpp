// SPDX-License-Identifier: Apache-2.0
#include "kf/coll/cost_model.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kf/common/log.hpp"

namespace kf::coll {
namespace {

int floor_log2(int p) noexcept { return std::bit_width(static_cast<unsigned>(p)) - 1; }
int ceil_log2(int p) noexcept { return std::bit_width(static_cast<unsigned>(p) - 1u); }

// Adds the fold to a power of two when p is not one: the extra ranks send their vectors in
// (α + nβ + nγ) and get the result back (α + nβ).
CostCoefficients with_fold(CostCoefficients c, int p) noexcept {
  if (std::has_single_bit(static_cast<unsigned>(p))) return c;
  c.latency += 2.0;
  c.bandwidth += 2.0;
  c.reduction += 1.0;
  return c;
}

// Rabenseifner on p' = 2^⌊lg p⌋ ranks, folded.
CostCoefficients halving_doubling(int p) noexcept {
  const int pp = 1 << floor_log2(p);
  const double f = static_cast<double>(pp - 1) / pp;
  return with_fold({2.0 * floor_log2(p), 2.0 * f, f}, p);
}

CostCoefficients recursive_doubling(int p) noexcept {
  const double lg = floor_log2(p);
  return with_fold({lg, lg, lg}, p);
}

CostCoefficients allreduce_of(Algorithm a, int p) noexcept {
  switch (a) {
    case Algorithm::star: return allreduce_coefficients(AllreduceModel::star, p);
    case Algorithm::ring: return allreduce_coefficients(AllreduceModel::ring, p);
    case Algorithm::tree: return allreduce_coefficients(AllreduceModel::binomial_tree, p);
    case Algorithm::clique: return allreduce_coefficients(AllreduceModel::sharded_ps, p);
    case Algorithm::rhd: return allreduce_coefficients(AllreduceModel::halving_doubling, p);
    case Algorithm::hierarchical: return allreduce_coefficients(AllreduceModel::ring, p);
    case Algorithm::job_default:
    case Algorithm::auto_select: break;
  }
  KF_CHECK(false, "cost model: allreduce needs a concrete algorithm");
  return {};
}

// broadcast, allgather, reduce_scatter and gather, as listed at coefficients() in the header.
// q = p − 1, L = ⌈lg p⌉, f = (p−1)/p.
CostCoefficients block_op(CollOp op, Algorithm a, int p) noexcept {
  const double q = p - 1;
  const double L = ceil_log2(p);
  const double f = q / p;
  if (a == Algorithm::hierarchical) a = Algorithm::ring;  // what coll/plan runs
  if (a == Algorithm::rhd && !std::has_single_bit(static_cast<unsigned>(p)) &&
      (op == CollOp::allgather || op == CollOp::reduce_scatter)) {
    a = Algorithm::ring;  // what coll/plan runs instead
  }
  const bool star = a == Algorithm::star;
  const bool tree = a == Algorithm::tree;
  const bool linear = a == Algorithm::ring || a == Algorithm::clique;
  switch (op) {
    case CollOp::broadcast:
      if (star || linear) return {q, q, 0};
      return {L, L, 0};
    case CollOp::allgather:
      if (star) return {2 * q, f + q, 0};
      if (linear) return {q, f, 0};
      if (tree) return {2 * L, f + L, 0};
      return {L, f, 0};
    case CollOp::reduce_scatter:
      if (star) return {2 * q, q + f, q};
      if (linear) return {q, f, f};
      if (tree) return {L + q, L + f, L};
      return {L, f, f};
    case CollOp::gather:
      if (tree) return {L, f, 0};
      return {q, f, 0};
    case CollOp::allreduce:
    case CollOp::barrier:
    case CollOp::consensus: break;
  }
  KF_CHECK(false, "cost model: not a block collective");
  return {};
}

}  // namespace

CostCoefficients allreduce_coefficients(AllreduceModel model, int p) noexcept {
  KF_CHECK(p >= 1, "cost model: p must be at least 1, got " + std::to_string(p));
  if (p == 1) return {};
  const double q = p - 1;
  const double f = q / p;
  const double ceil_lg = ceil_log2(p);
  switch (model) {
    case AllreduceModel::ring:
    case AllreduceModel::sharded_ps: return {2 * q, 2 * f, f};
    case AllreduceModel::recursive_doubling: return recursive_doubling(p);
    case AllreduceModel::halving_doubling: return halving_doubling(p);
    case AllreduceModel::binomial_tree: return {2 * ceil_lg, 2 * ceil_lg, ceil_lg};
    case AllreduceModel::star: return {2 * q, 2 * q, q};
    case AllreduceModel::pipelined_tree: return {2 * ceil_lg, 2, 1};
  }
  KF_CHECK(false, "cost model: unknown allreduce model");
  return {};
}

CostCoefficients coefficients(CollOp op, Algorithm algorithm, int p) noexcept {
  KF_CHECK(p >= 1, "cost model: p must be at least 1, got " + std::to_string(p));
  const CostCoefficients all = allreduce_of(algorithm, p);  // also checks the algorithm
  switch (op) {
    case CollOp::allreduce:
    case CollOp::consensus: return all;
    case CollOp::barrier: return {all.latency, 0.0, 0.0};
    case CollOp::broadcast:
    case CollOp::allgather:
    case CollOp::reduce_scatter:
    case CollOp::gather: break;
  }
  return p == 1 ? CostCoefficients{} : block_op(op, algorithm, p);
}

double evaluate(const CostCoefficients& c, double bytes, const LinkParams& link) noexcept {
  return c.latency * link.alpha_s + c.bandwidth * bytes * link.beta_s_per_byte +
         c.reduction * bytes * link.gamma_s_per_byte;
}

double allreduce_seconds(AllreduceModel model, int p, std::size_t bytes,
                         const LinkParams& link) noexcept {
  return evaluate(allreduce_coefficients(model, p), static_cast<double>(bytes), link);
}

double predict_seconds(CollOp op, Algorithm algorithm, int p, std::size_t bytes,
                       const LinkParams& link) noexcept {
  const bool reducing = op == CollOp::allreduce || op == CollOp::barrier || op == CollOp::consensus;
  if (reducing && algorithm == Algorithm::rhd && bytes <= kRecursiveDoublingMaxBytes && p > 1) {
    // The plan runs recursive doubling here (with the same fold as halving-doubling).
    return evaluate(recursive_doubling(p), static_cast<double>(bytes), link);
  }
  return evaluate(coefficients(op, algorithm, p), static_cast<double>(bytes), link);
}

Algorithm choose(CollOp op, std::size_t bytes, int p, const LinkParams& link) noexcept {
  Algorithm best = kSelectableAlgorithms.front();
  double best_s = predict_seconds(op, best, p, bytes, link);
  for (const Algorithm a : kSelectableAlgorithms) {
    const double s = predict_seconds(op, a, p, bytes, link);
    if (s < best_s) {  // strict: the earlier algorithm keeps a tie
      best = a;
      best_s = s;
    }
  }
  return best;
}

double hierarchical_seconds(CollOp op, std::size_t bytes, const Topology& t,
                            const LinkParams& local, const LinkParams& cross) noexcept {
  KF_CHECK(t.hosts >= 1 && t.min_per_host >= 1 && t.min_per_host <= t.max_per_host,
           "cost model: a topology needs hosts >= 1 and 1 <= min_per_host <= max_per_host");
  const bool reducing = op == CollOp::allreduce || op == CollOp::barrier || op == CollOp::consensus;
  const LinkParams& flat_link = t.hosts > 1 ? cross : local;
  if (!reducing) {
    const int p = t.hosts * t.max_per_host;  // an upper bound: the model has no exact count
    return predict_seconds(op, Algorithm::ring, p, bytes, flat_link);
  }
  const double n = op == CollOp::barrier ? 0.0 : static_cast<double>(bytes);
  const double m = n / t.min_per_host;
  const double others = t.max_per_host - 1;
  const double in = others * (local.alpha_s + m * (local.beta_s_per_byte + local.gamma_s_per_byte));
  const double out = others * (local.alpha_s + m * local.beta_s_per_byte);
  double among = 0.0;
  if (t.hosts > 1) {
    const auto shard = static_cast<std::size_t>(m);
    among = shard <= kRecursiveDoublingMaxBytes
                ? evaluate(recursive_doubling(t.hosts), m, cross)
                : allreduce_seconds(AllreduceModel::ring, t.hosts, shard, cross);
  }
  return in + among + out;
}

Algorithm choose(CollOp op, std::size_t bytes, int p, const Topology& t, const LinkParams& local,
                 const LinkParams& cross) noexcept {
  if (t.hosts <= 1) return choose(op, bytes, p, local);
  const Algorithm flat = choose(op, bytes, p, cross);
  const bool reducing = op == CollOp::allreduce || op == CollOp::barrier || op == CollOp::consensus;
  if (!reducing || t.max_per_host <= 1) return flat;
  const double flat_s = predict_seconds(op, flat, p, bytes, cross);
  return hierarchical_seconds(op, bytes, t, local, cross) < flat_s ? Algorithm::hierarchical : flat;
}

std::optional<double> crossover_bytes(const CostCoefficients& a, const CostCoefficients& b,
                                      const LinkParams& link) noexcept {
  const double fixed_a = a.latency * link.alpha_s;
  const double fixed_b = b.latency * link.alpha_s;
  const double slope_a = a.bandwidth * link.beta_s_per_byte + a.reduction * link.gamma_s_per_byte;
  const double slope_b = b.bandwidth * link.beta_s_per_byte + b.reduction * link.gamma_s_per_byte;
  if (slope_a == slope_b) return std::nullopt;
  const double n = (fixed_b - fixed_a) / (slope_a - slope_b);
  if (!(n >= 0.0) || !std::isfinite(n)) return std::nullopt;
  return n;
}

namespace {

struct Line {
  double c0;
  double c1;
};

// Σ w²·(c0 + c1·n − T)², the weighted squared error of a candidate line.
double weighted_sse(std::span<const TimingSample> s, std::span<const double> w2, Line l) noexcept {
  double sum = 0.0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double r = l.c0 + l.c1 * static_cast<double>(s[i].bytes) - s[i].seconds;
    sum += w2[i] * r * r;
  }
  return sum;
}

// The unconstrained weighted least-squares line, from centred sums (stable where the normal
// equations are not: n spans many orders of magnitude). Returns nullopt for a single size.
std::optional<Line> least_squares(std::span<const TimingSample> s, std::span<const double> w2) {
  double sw = 0.0, swn = 0.0, swt = 0.0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    sw += w2[i];
    swn += w2[i] * static_cast<double>(s[i].bytes);
    swt += w2[i] * s[i].seconds;
  }
  const double mean_n = swn / sw;
  const double mean_t = swt / sw;
  double sxx = 0.0, sxy = 0.0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double dn = static_cast<double>(s[i].bytes) - mean_n;
    sxx += w2[i] * dn * dn;
    sxy += w2[i] * dn * (s[i].seconds - mean_t);
  }
  if (!(sxx > 0.0)) return std::nullopt;
  const double c1 = sxy / sxx;
  return Line{mean_t - c1 * mean_n, c1};
}

// The two boundary problems: through the origin (c0 = 0) and constant (c1 = 0), each clamped.
Line best_boundary(std::span<const TimingSample> s, std::span<const double> w2) noexcept {
  double snn = 0.0, snt = 0.0, sw = 0.0, swt = 0.0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double n = static_cast<double>(s[i].bytes);
    snn += w2[i] * n * n;
    snt += w2[i] * n * s[i].seconds;
    sw += w2[i];
    swt += w2[i] * s[i].seconds;
  }
  const Line origin{0.0, snn > 0.0 ? std::max(0.0, snt / snn) : 0.0};
  const Line constant{std::max(0.0, swt / sw), 0.0};
  return weighted_sse(s, w2, origin) <= weighted_sse(s, w2, constant) ? origin : constant;
}

// w² per sample, checking the times. Throws: std::invalid_argument.
std::vector<double> squared_weights(std::span<const TimingSample> s, FitWeighting weighting) {
  std::vector<double> w2(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const double t = s[i].seconds;
    if (!std::isfinite(t) || !(t > 0.0)) {
      throw std::invalid_argument("cost model fit: sample " + std::to_string(i) +
                                  " has a time that is not finite and positive");
    }
    w2[i] = weighting == FitWeighting::inverse_time ? 1.0 / (t * t) : 1.0;
  }
  return w2;
}

// Throws: std::invalid_argument when there are fewer than two distinct sizes.
LineFit fit_weighted(std::span<const TimingSample> s, std::span<const double> w2) {
  const auto ls = s.empty() ? std::nullopt : least_squares(s, w2);
  if (!ls) throw std::invalid_argument("cost model fit: time at least two distinct sizes");
  const Line l = (ls->c0 >= 0.0 && ls->c1 >= 0.0) ? *ls : best_boundary(s, w2);
  return {l.c0, l.c1};
}

}  // namespace

LineFit fit_line_nonnegative(std::span<const TimingSample> samples, FitWeighting weighting) {
  return fit_weighted(samples, squared_weights(samples, weighting));
}

LinkParams fit_alpha_beta(std::span<const TimingSample> samples,
                          const CalibrationOptions& options) {
  const CostCoefficients& c = options.coefficients;
  if (!(c.latency > 0.0) || !(c.bandwidth > 0.0)) {
    throw std::invalid_argument(
        "cost model fit: the coefficients need positive latency and bandwidth terms (p >= 2)");
  }
  // The weights come from the measured times; only the targets lose the known reduction time.
  const std::vector<double> w2 = squared_weights(samples, options.weighting);
  std::vector<TimingSample> targets(samples.begin(), samples.end());
  for (auto& s : targets) {
    s.seconds -= c.reduction * options.gamma_s_per_byte * static_cast<double>(s.bytes);
  }
  const LineFit fit = fit_weighted(targets, w2);
  return {fit.intercept_s / c.latency, fit.slope_s_per_byte / c.bandwidth,
          options.gamma_s_per_byte};
}

}  // namespace kf::coll
