// SPDX-License-Identifier: Apache-2.0
// How a job trains, as the cluster settings "mode" and "compression" spell it
// (docs/training-modes.md): the training mode with its parameters, and the compression of what
// the mode sends. Both are text so that a policy, a job file, kf-member and the config service
// all speak the same language; every parser error names the text and what was wrong.
// Thread-safety: value types and free functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kf {

enum class TrainingMode {
  sync_sgd,  ///< gradients averaged by allreduce every step
  sma,       ///< synchronous model averaging: local steps, models averaged every `period` steps
  pair_avg,  ///< each step, the model averaged with one peer's last published copy
  async_ps,  ///< parameter server over the star shape, staleness bounded
};

/// A training mode and its parameters. Parameters of other modes keep their defaults.
struct ModeSpec {
  TrainingMode mode = TrainingMode::sync_sgd;
  int period = 1;               ///< sma: steps between model averages (1: every step)
  std::int64_t post_local = 0;  ///< sma: synchronous SGD for the job's first post_local steps
  std::uint64_t seed = 0;       ///< pair-avg: seed of the schedule that picks each step's peer
  int max_staleness = 4;        ///< async-ps: steps the server's view in a worker's model may lag
  int soft_sync = 1;            ///< async-ps: the server applies the mean of each c updates as one
  bool scale_lr = true;         ///< async-ps: each update divided by its staleness τ (λ/τ)

  /// The canonical text: parse_mode(str()) == *this. Parameters at their defaults are left out.
  std::string str() const;
  bool operator==(const ModeSpec&) const = default;
};

/// "sync-sgd", "sma", "sma:period=4", "sma:period=8,post_local=1000", "pair-avg:seed=7",
/// "async-ps:max_staleness=4,soft_sync=2,scale_lr=0". Throws: std::invalid_argument naming the text
/// and the unknown mode, the unknown or repeated parameter, or the value out of range.
ModeSpec parse_mode(std::string_view text);

/// The names of the modes, as parse_mode takes them.
std::string_view to_string(TrainingMode mode) noexcept;

enum class Compression {
  none,
  fp16,      ///< values cast to IEEE half precision
  bf16,      ///< values cast to bfloat16
  topk,      ///< the largest `ratio` of the values by magnitude, with their indices
  randomk,   ///< `ratio` of the values at indices every worker draws from the same seed
  powersgd,  ///< a rank-`rank` approximation of each gradient matrix
};

struct CompressionSpec {
  Compression kind = Compression::none;
  double ratio = 0;  ///< topk, randomk: the fraction of values sent, in (0, 1]
  int rank = 0;      ///< powersgd: the approximation's rank, >= 1

  /// "none", "fp16", "bf16", "topk:0.01", "randomk:0.05", "powersgd:4".
  std::string str() const;
  bool operator==(const CompressionSpec&) const = default;
};

/// Throws: std::invalid_argument naming the text and what was wrong.
CompressionSpec parse_compression(std::string_view text);

}  // namespace kf
