// SPDX-License-Identifier: Apache-2.0
// The forward model of Pollux's throughput and goodput (KAT-GOODPUT):
// iteration time from fitted performance parameters, throughput M/T_iter, and
// goodput = throughput × efficiency(M). Fitting the parameters and searching batch sizes are
// the job of the policy that uses them; only the forward model lives here.
// Thread-safety: pure functions over value types.
#pragma once

namespace kf::monitor {

/// Pollux's performance parameters (seconds, seconds per sample, and γ ∈ [1, 10]).
struct PerfParams {
  double alpha_c = 0.0;  ///< per-micro-batch gradient time: α_c + β_c·m
  double beta_c = 0.0;
  double alpha_n = 0.0;  ///< sync time across nodes: α_n + β_n·max(K−2, 0)
  double beta_n = 0.0;
  double alpha_r = 0.0;  ///< sync time within one node: α_r + β_r·max(K−2, 0)
  double beta_r = 0.0;
  double gamma = 1.0;  ///< overlap of compute and sync: 1 none (sum), → ∞ full (max)
};

/// Where and how one step runs.
struct Placement {
  int nodes = 1;
  int replicas = 1;          ///< K
  double local_batch = 0.0;  ///< m: samples per micro-batch per replica
  int accum_steps = 0;       ///< q: extra accumulation micro-steps (q + 1 micro-batches a step)
};

/// M = K·m·(q + 1).
double global_batch(const Placement& placement) noexcept;
/// T_grad(m) = α_c + β_c·m.
double gradient_seconds(const PerfParams& params, double local_batch) noexcept;
/// T_sync: 0 for K = 1 (AdaptDL uses 1e-8), α_r + β_r·max(K−2, 0) on one node, otherwise
/// α_n + β_n·max(K−2, 0).
double sync_seconds(const PerfParams& params, int nodes, int replicas) noexcept;
/// T_iter = q·T_grad + (T_grad^γ + T_sync^γ)^(1/γ).
double iteration_seconds(const PerfParams& params, const Placement& placement) noexcept;
/// M / T_iter (samples/s).
double throughput(const PerfParams& params, const Placement& placement) noexcept;
/// THROUGHPUT × EFFICIENCY(M) with φ = noise_scale and M0 = base_batch.
double goodput(const PerfParams& params, const Placement& placement, double noise_scale,
               double base_batch) noexcept;

}  // namespace kf::monitor
