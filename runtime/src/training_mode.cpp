// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/training_mode.hpp"

#include <stdexcept>

namespace kf {

ModePlan plan_step(const ModeSpec& mode, std::int64_t steps_done) {
  switch (mode.mode) {
    case TrainingMode::sync_sgd: return ModePlan{};
    case TrainingMode::sma: {
      if (steps_done < mode.post_local) return ModePlan{};
      ModePlan plan;
      plan.average_gradients = false;
      plan.average_parameters = (steps_done + 1) % mode.period == 0;
      return plan;
    }
    case TrainingMode::pair_avg: {
      ModePlan plan;
      plan.average_gradients = false;
      plan.average_with_pair = true;
      return plan;
    }
    case TrainingMode::async_ps: {
      ModePlan plan;
      plan.average_gradients = false;
      plan.exchange_with_server = true;
      return plan;
    }
  }
  throw std::invalid_argument("training mode " + std::to_string(static_cast<int>(mode.mode)) +
                              " is not one kf knows");
}

bool models_may_diverge(const ModeSpec& mode) noexcept {
  switch (mode.mode) {
    case TrainingMode::sync_sgd: return false;
    case TrainingMode::sma: return mode.period > 1;
    case TrainingMode::pair_avg:
    case TrainingMode::async_ps: return true;
  }
  return true;
}

void average_parameters(Peer& peer, const std::string& name, float* params, std::size_t n) {
  if (n == 0) return;
  const Buffer b = buffer(params, n);
  CollOptions o;
  o.op = ReduceOp::avg;
  peer.allreduce(name, b, b, o).wait();
}

}  // namespace kf
