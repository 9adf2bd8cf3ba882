// SPDX-License-Identifier: Apache-2.0
// The α–β–γ cost model of the collectives: predicted time of every
// (operation, algorithm) pair for p ranks and n bytes, the argmin choice behind
// Algorithm::auto_select, and the calibration of α and β from a timed size sweep.
// Every prediction is linear in (α, β, γ): T = latency·α + bandwidth·n·β + reduction·n·γ, so a
// formula is a CostCoefficients value and the link is a LinkParams value.
// Thread-safety: pure functions over value types.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kf/coll/types.hpp"

namespace kf::coll {

/// Hockney parameters of one link class, in seconds. Links are full-duplex, a rank sends one
/// message at a time, and there is no contention.
/// The defaults are rough loopback-TCP values for the development machines: a blocking loopback
/// half round trip of about 11 µs plus framing (α = 15 µs), about 2.5 GB/s through the kernel
/// (β), and a float sum at about 5 GB/s (γ). Calibrate real links with fit_alpha_beta.
/// An rhd allreduce (and barrier, consensus) of at most this many bytes runs recursive
/// doubling: lg p full exchanges instead of 2 lg p half-size ones. The executor and the model
/// use the same threshold.
inline constexpr std::size_t kRecursiveDoublingMaxBytes = 64 * 1024;

struct LinkParams {
  double alpha_s = 15e-6;                ///< latency per message
  double beta_s_per_byte = 1.0 / 2.5e9;  ///< transfer time per byte
  double gamma_s_per_byte = 1.0 / 5e9;   ///< reduction time per byte
};

/// The link `auto` assumes between workers that all share one host and kf's default transport
/// (shared-memory rings up to 1 MiB, single copy above): a message costs about a quarter of a
/// loopback TCP one. Measured with kf-bench on 2 cores, ring and recursive doubling cross at 32-64
/// KiB there (2 workers at 64 KiB: ring 19.5-19.8 µs, recursive doubling 22.0-22.4 µs; 4 workers at
/// 32 KiB: 41-42 against 47-52 µs), where over TCP recursive doubling still leads at 64 KiB (2
/// workers 35-36 against 42-43 µs), as the default LinkParams predict.
inline constexpr LinkParams kSameHostLink{4e-6, 1.0 / 5e9, 1.0 / 5e9};

/// T(n) = latency·α + bandwidth·n·β + reduction·n·γ. latency counts sequential messages;
/// bandwidth and reduction count the bytes, in units of n, on the critical path.
struct CostCoefficients {
  double latency = 0.0;
  double bandwidth = 0.0;
  double reduction = 0.0;
};

/// The textbook allreduce formulas [Thakur, Rabenseifner, Gropp 2005], including some no kf
/// Algorithm runs (recursive doubling, NCCL's pipelined tree), so that every KAT-AR number can be
/// reproduced. lg p is exact for a power of two; see allreduce_coefficients for other p.
enum class AllreduceModel : std::uint8_t {
  ring,                ///< 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ
  recursive_doubling,  ///< lg p·(α + nβ + nγ), plus the fold when p is not a power of two
  halving_doubling,  ///< Rabenseifner: 2·lg p·α + 2(p−1)/p·nβ + (p−1)/p·nγ, plus the fold
  binomial_tree,     ///< reduce + broadcast: 2·⌈lg p⌉·(α + nβ) + ⌈lg p⌉·nγ
  star,              ///< single root, its link serializes: 2(p−1)(α + nβ) + (p−1)·nγ
  sharded_ps,        ///< every rank owns 1/p (all-to-all reduce-scatter + allgather): as ring
  pipelined_tree,    ///< NCCL-style (double) binary tree: 2·⌈lg p⌉·α + 2·nβ + nγ
};

/// Coefficients of one allreduce formula for p ranks; all zero for p = 1.
/// recursive_doubling and halving_doubling on p that is not a power of two use the "fold"
/// variant: the r = p − p' extra ranks (p' = 2^⌊lg p⌋) first send their vectors to
/// partners (α + nβ + nγ), the p' ranks run the algorithm, and the result goes back (α + nβ).
/// Precondition (KF_CHECK): p ≥ 1.
CostCoefficients allreduce_coefficients(AllreduceModel model, int p) noexcept;

/// Coefficients of kf's own algorithm `algorithm` running `op` on p ranks; all zero for p = 1.
/// The formulas follow the shapes of coll/plan, one lane (pipelining across lanes is not
/// modelled), with L = ⌈lg p⌉, f = (p−1)/p and a single-port rank (its sends in one
/// step go one after another) [Thakur, Rabenseifner, Gropp 2005].
/// - allreduce, consensus: n is the buffer. star → star, ring → ring, clique → sharded_ps,
///   rhd → halving_doubling (folded), tree → binomial_tree. kf's tree is a binary tree (a parent
///   hears its two children one after the other); the binomial formula, with depth L and one
///   message per level, is its optimistic bound, and measured throughput corrects it.
/// - barrier: an allreduce of no payload: the allreduce latency term only; n is ignored.
/// - broadcast: n is the buffer. star, clique (the root sends to each) and ring (a chain):
///   (p−1)(α + nβ). tree and rhd (binomial): L(α + nβ).
/// - allgather: n is the assembled output (p blocks of n/p). ring, clique: (p−1)α + f·nβ.
///   rhd: lg p·α + f·nβ (recursive doubling; as ring when p is not a power of two).
///   tree: gather up, then everything down: 2Lα + (f + L)·nβ.
///   star: 2(p−1)α + (f + p−1)·nβ.
/// - reduce_scatter: n is each rank's input (each keeps n/p). ring, clique: (p−1)α + f·n(β + γ).
///   rhd: lg p·α + f·n(β + γ) (recursive halving; as ring when p is not a power of two).
///   tree: reduce to the root, which sends each rank its block: (L + p−1)α + (L + f)·nβ + L·nγ.
///   star: 2(p−1)α + (p−1 + f)·nβ + (p−1)·nγ.
/// - gather: n is the assembled output. tree: Lα + f·nβ. The others send straight to the root:
///   (p−1)α + f·nβ.
/// - hierarchical: without a host layout, every rank is a host of its own, where it runs ring
///   (hierarchical_seconds gives its time over a layout).
/// Precondition (KF_CHECK): p ≥ 1 and `algorithm` is concrete (not job_default or auto_select).
CostCoefficients coefficients(CollOp op, Algorithm algorithm, int p) noexcept;

/// latency·α + bandwidth·bytes·β + reduction·bytes·γ, in seconds.
double evaluate(const CostCoefficients& c, double bytes, const LinkParams& link) noexcept;

/// Predicted seconds of one allreduce model (see allreduce_coefficients).
double allreduce_seconds(AllreduceModel model, int p, std::size_t bytes,
                         const LinkParams& link) noexcept;

/// Predicted seconds of kf's `algorithm` running `op` (see coefficients).
double predict_seconds(CollOp op, Algorithm algorithm, int p, std::size_t bytes,
                       const LinkParams& link) noexcept;

/// The algorithms choose() considers, in the order that breaks ties: ring first (it is
/// topology-friendly, pipelines and handles any p), then rhd, clique, tree, star.
inline constexpr std::array<Algorithm, 5> kSelectableAlgorithms{
    Algorithm::ring, Algorithm::rhd, Algorithm::clique, Algorithm::tree, Algorithm::star};

/// The argmin of predict_seconds over kSelectableAlgorithms; the earliest wins a tie (so p = 1
/// gives ring). Never returns job_default or auto_select. Precondition (KF_CHECK): p ≥ 1.
Algorithm choose(CollOp op, std::size_t bytes, int p, const LinkParams& link) noexcept;

/// Where a job's workers run: `hosts` hosts, each with between `min_per_host` and
/// `max_per_host` workers.
struct Topology {
  int hosts = 1;
  int min_per_host = 1;
  int max_per_host = 1;
};

/// Predicted seconds of kf's hierarchical allreduce (also barrier and consensus) of n bytes over
/// `t`, with k = max_per_host, s = min_per_host (the shards), H = hosts and m = n/s:
///   (k−1)(α_l + m(β_l + γ))   each shard reduced at its owner, over the `local` link;
/// + the owners' allreduce of m among H over the `cross` link: ring, or recursive doubling
///   when m ≤ kRecursiveDoublingMaxBytes (as the plan runs it);
/// + (k−1)(α_l + mβ_l)         each owner sends its shard to the rest of its host.
/// Lanes (pipelining) are not modelled. Other operations run ring, over the cross link (or the
/// local one on a single host). Precondition (KF_CHECK): hosts ≥ 1, 1 ≤ min ≤ max per host.
double hierarchical_seconds(CollOp op, std::size_t bytes, const Topology& t,
                            const LinkParams& local, const LinkParams& cross) noexcept;

/// choose() for a job that spans hosts: every flat algorithm over the cross link (a flat
/// schedule waits for its slowest link) against hierarchical_seconds; a tie keeps the flat one.
/// p is the number of workers. On one host (t.hosts ≤ 1) it is choose(op, bytes, p, local).
Algorithm choose(CollOp op, std::size_t bytes, int p, const Topology& t, const LinkParams& local,
                 const LinkParams& cross) noexcept;

/// The size n ≥ 0 at which formulas a and b predict the same time, in bytes (not rounded);
/// nullopt when their slopes are equal or they cross only at n < 0. Below n*, the formula with
/// the smaller latency term is faster.
std::optional<double> crossover_bytes(const CostCoefficients& a, const CostCoefficients& b,
                                      const LinkParams& link) noexcept;

/// One timed run: `bytes` as the formula's n, `seconds` the measured time.
struct TimingSample {
  std::size_t bytes = 0;
  double seconds = 0.0;
};

enum class FitWeighting : std::uint8_t {
  uniform,       ///< minimize Σ (c0 + c1·n − T)²: the large sizes dominate
  inverse_time,  ///< minimize Σ ((c0 + c1·n − T)/T)²: relative error, so small sizes count
};

/// T(n) = intercept + slope·n.
struct LineFit {
  double intercept_s = 0.0;
  double slope_s_per_byte = 0.0;
};

/// Non-negative least squares fit of T(n) = c0 + c1·n (c0, c1 ≥ 0), solved exactly: the
/// unconstrained weighted least-squares line when both are non-negative, otherwise the better of
/// the two boundary fits (c0 = 0 or c1 = 0, each clamped at 0).
/// Throws: std::invalid_argument when there are fewer than two distinct sizes or a time is not
/// finite and positive.
LineFit fit_line_nonnegative(std::span<const TimingSample> samples, FitWeighting weighting);

struct CalibrationOptions {
  /// The formula of the algorithm that was timed, e.g. allreduce_coefficients(ring, 8).
  CostCoefficients coefficients;
  /// γ is not separable from β in one sweep: this known value is subtracted first and returned.
  double gamma_s_per_byte = 0.0;
  FitWeighting weighting = FitWeighting::inverse_time;
};

/// Calibrates α and β from a size sweep of one algorithm (KAT-AR-5): fits
/// T(n) − reduction·γ·n = c0 + c1·n with fit_line_nonnegative (weights from the measured T),
/// then α = c0/latency and β = c1/bandwidth.
/// Throws: std::invalid_argument as fit_line_nonnegative, or when the coefficients have no
/// positive latency or bandwidth term (p = 1).
LinkParams fit_alpha_beta(std::span<const TimingSample> samples, const CalibrationOptions& options);

}  // namespace kf::coll
