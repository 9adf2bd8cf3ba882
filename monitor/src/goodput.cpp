// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/goodput.hpp"

#include <algorithm>
#include <cmath>

#include "kf/monitor/gns.hpp"

namespace kf::monitor {

double global_batch(const Placement& placement) noexcept {
  return placement.replicas * placement.local_batch * (placement.accum_steps + 1);
}

double gradient_seconds(const PerfParams& params, double local_batch) noexcept {
  return params.alpha_c + params.beta_c * local_batch;
}

double sync_seconds(const PerfParams& params, int nodes, int replicas) noexcept {
  if (replicas <= 1) return 0.0;
  const double retrogress = std::max(replicas - 2, 0);
  return nodes > 1 ? params.alpha_n + params.beta_n * retrogress
                   : params.alpha_r + params.beta_r * retrogress;
}

double iteration_seconds(const PerfParams& params, const Placement& placement) noexcept {
  const double grad = gradient_seconds(params, placement.local_batch);
  const double sync = sync_seconds(params, placement.nodes, placement.replicas);
  const double g = params.gamma;
  return placement.accum_steps * grad + std::pow(std::pow(grad, g) + std::pow(sync, g), 1.0 / g);
}

double throughput(const PerfParams& params, const Placement& placement) noexcept {
  return global_batch(placement) / iteration_seconds(params, placement);
}

double goodput(const PerfParams& params, const Placement& placement, double noise_scale,
               double base_batch) noexcept {
  return throughput(params, placement) *
         efficiency(noise_scale, base_batch, global_batch(placement));
}

}  // namespace kf::monitor
