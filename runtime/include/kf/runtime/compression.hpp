// SPDX-License-Identifier: Apache-2.0
// Gradient compression with error feedback: each worker sends a compressed form of its gradient
// (half precision, the largest or randomly chosen values, or a low-rank approximation), the
// workers average what they sent, and each keeps what it did not send (its residual) to add to
// its next gradient, so that nothing is lost, only delayed (docs/training-modes.md).
// The selection rules (top_k, random_k, count_for) are pure functions, tested on their own;
// GradientCompressor wires them to a kf::Peer's collectives.
// Thread-safety: the free functions are pure; a GradientCompressor is used by one thread at a
// time (one per gradient), and every worker calls average() for it in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kf/peer.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf {

/// One worker's compression of one flat float32 gradient of fixed length n, with its
/// error-feedback residual (what was not sent yet, added to the next step's gradient).
///
/// What average() sends, for acc = grad + residual:
///  - none: grad as is, through an allreduce of n floats (no residual).
///  - fp16, bf16: acc cast to the half type (round to nearest even; a finite value beyond the
///    type's range is sent as its largest finite value), through an allreduce in that type;
///    residual = acc - the cast value (exact in float), or 0 where acc is not finite.
///  - topk: the k = count_for(ratio, n) entries of acc largest in magnitude, as one allgather of
///    a record per worker: k uint32 indices, then k float32 values. residual = acc with the sent
///    entries set to 0.
///  - randomk: the entries of acc at random_k(n, k, seed, step), which every worker draws alike,
///    so that only the k values travel, through an allreduce of k floats: half of topk's bytes.
///    residual as for topk.
///  - powersgd (Vogels et al. 2019, one power iteration per step, warm-started): acc is viewed
///    as a rows x cols matrix M (row-major) and r = min(rank, rows, cols).
///      1. P = M Q (rows x r), Q the warm start (cols x r); allreduce P and divide by the size.
///      2. Orthonormalise P's columns (Gram-Schmidt in double, twice over; a column that is
///         dependent on the earlier ones becomes zero). Every worker holds the same P.
///      3. Q_own = M^T P (cols x r); allreduce it and divide by the size: Q.
///      4. The result is P Q^T. Each worker sent P Q_own^T in effect (the mean of those is the
///         result), so its residual is M - P Q_own^T: what its own matrix lost in the
///         projection onto P. The residual never holds another worker's gradient, and the
///         residuals of all workers add up to the same total as with the rule M - P Q^T.
///      5. Q becomes the next warm start; a column of Q that is all zero (a zero gradient) is
///         drawn afresh from (seed, step), so that the rank is never lost for good.
///
/// Momentum correction (topk and randomk, after set_momentum(m) with m > 0; Lin et al. 2018):
/// the compressor keeps this worker's velocity u and compresses it instead of the gradient:
/// u = m u + grad, acc = u + residual, and the caller's optimizer then runs without momentum.
/// Over the workers the velocities add up to momentum SGD's buffer, so without masking and
/// with every value sent (ratio 1) the updates are exactly momentum SGD's; with fewer, a value
/// held in the residual is no longer multiplied by the optimizer's momentum again when it is
/// finally sent. With masking (the default), the velocity of each value sent is then set to
/// zero, so that a value's momentum does not go on pushing after its accumulated update has
/// been applied (at ratio 1 that is plain SGD).
///
/// A failed collective leaves the residual and the warm start as they were before the call, so
/// that a step retried after a restore adds its gradient once. The spans that residual() and
/// warm_start() return stay valid, at the same address, for the compressor's lifetime (they can
/// be registered with kf::State).
class GradientCompressor {
 public:
  /// rows x cols = n gives PowerSGD's matrix shape (the other kinds ignore rows); rows = 0
  /// picks a near-square shape (the largest divisor of n that is at most sqrt(n)). seed: randomk's
  /// index stream and PowerSGD's initial Q (the same on every worker). Throws:
  /// std::invalid_argument naming what was wrong (n = 0; a ratio outside (0, 1]; a rank below 1;
  /// rows that do not divide n; n too large for uint32 indices), before allocating anything.
  GradientCompressor(CompressionSpec spec, std::size_t n, std::uint64_t seed = 0,
                     std::size_t rows = 0);

  /// Replaces grad (n floats, host memory) with the mean over every worker of `peer` of what
  /// each sent, compressed as the spec says, and keeps this worker's residual. `step` must be
  /// the same on every worker (randomk draws its indices from seed and step). Collective names
  /// start with `name`. Works for a single worker too. Returns the bytes this worker sent
  /// (payload only: values and indices): none n * 4, fp16 and bf16 n * 2, topk k * 8, randomk
  /// k * 4, powersgd (rows + cols) * r * 4.
  /// Throws: std::invalid_argument for a null grad; kf::Error from a collective
  /// (errc::protocol_error when a topk record holds an index >= n); after a throw grad is
  /// unspecified and the residual and warm start are unchanged.
  std::size_t average(Peer& peer, const std::string& name, float* grad, std::int64_t step);

  /// This worker's residual (n floats; zeros for none).
  std::span<float> residual() noexcept { return residual_; }

  /// Turns momentum correction on with momentum m in (0, 1), the velocity starting at `start`
  /// (n floats; empty: zeros), with or without masking, or off with m = 0 (the velocity is
  /// dropped). Throws:
  /// std::invalid_argument for m outside [0, 1), a start of another length, or m > 0 with a
  /// kind other than topk and randomk (the dense kinds send every value each step, so the
  /// optimizer's own momentum sees no burst).
  void set_momentum(double m, std::span<const float> start = {}, bool masking = true);
  double momentum() const noexcept { return momentum_; }
  bool masking() const noexcept { return masking_; }
  /// This worker's velocity (n floats while momentum correction is on; else empty).
  std::span<const float> velocity() const noexcept { return velocity_; }
  /// PowerSGD's warm-start matrix Q (cols x r, row-major), identical on every worker after each
  /// average(); empty for the other kinds. A joiner must receive it from a survivor (the caller
  /// registers it with kf::State).
  std::span<float> warm_start() noexcept { return q_; }

  const CompressionSpec& spec() const noexcept { return spec_; }
  std::size_t count() const noexcept { return n_; }  ///< n, the gradient's length
  /// PowerSGD's shape and effective rank r (rank clamped to min(rows, cols)); 0 for the others.
  std::size_t rows() const noexcept { return rows_; }
  std::size_t cols() const noexcept { return cols_; }
  std::size_t rank() const noexcept { return rank_; }

 private:
  std::size_t average_cast(Peer& peer, const std::string& name, float* grad, DType half);
  std::size_t average_topk(Peer& peer, const std::string& name, float* grad);
  std::size_t average_randomk(Peer& peer, const std::string& name, float* grad, std::int64_t step);
  std::size_t average_powersgd(Peer& peer, const std::string& name, float* grad, std::int64_t step);
  void accumulate(const float* grad);  // acc_ = grad (or the next velocity) + residual
  // The step succeeded: acc_ is the residual, the velocity advances (masked where `sent`).
  void commit(std::span<const std::uint32_t> sent);

  CompressionSpec spec_;
  std::size_t n_;
  std::uint64_t seed_;
  std::size_t k_ = 0;  // topk, randomk: values sent per step
  std::size_t rows_ = 0, cols_ = 0, rank_ = 0;
  std::vector<float> residual_;
  std::vector<float> q_;         // powersgd: the warm start
  std::vector<float> acc_;       // grad + residual, then the next residual until the step succeeds
  float momentum_ = 0;           // momentum correction's m; 0: off
  bool masking_ = false;         // the velocity of a value sent is zeroed
  std::vector<float> velocity_;  // while it is on: this worker's u
  std::vector<float> next_velocity_;  // u of this step until the step succeeds
};

namespace compression {

/// Indices of the k values of largest magnitude (ties: lower index first; NaN counts as larger
/// than any number, so that it is sent rather than hidden in a residual), sorted ascending.
/// Throws: std::invalid_argument when k > values.size() or values.size() does not fit uint32.
std::vector<std::uint32_t> top_k(std::span<const float> values, std::size_t k);

/// k distinct indices in [0, n) drawn uniformly from (seed, step), sorted ascending; the same
/// on every worker and every platform (a fixed generator, no std distribution).
/// Throws: std::invalid_argument when k > n or n does not fit uint32.
std::vector<std::uint32_t> random_k(std::size_t n, std::size_t k, std::uint64_t seed,
                                    std::int64_t step);

/// k for a ratio: max(1, round(ratio * n)), at most n.
/// Throws: std::invalid_argument when ratio is not in (0, 1].
std::size_t count_for(double ratio, std::size_t n);

}  // namespace compression
}  // namespace kf
