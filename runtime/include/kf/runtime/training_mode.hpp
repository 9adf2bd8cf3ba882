// SPDX-License-Identifier: Apache-2.0
// What a worker does in a step under each training mode (docs/training-modes.md), for trainers
// that run their own update: the LibTorch adapter, or a program's own loop. The mode comes from
// the cluster settings ("mode"), so every worker reads the same one at the same step and a
// policy's switch takes effect on all of them at one step boundary.
//
//   const kf::ModePlan plan = kf::plan_step(session.mode(), session.steps());
//   if (plan.average_gradients) allreduce-average the gradients;
//   apply this worker's update;
//   if (plan.average_parameters) kf::average_parameters(session.peer(), "model", params, n);
//   if (plan.average_with_pair) pair_averager.exchange(params, session.steps());  // PairAverager
//   if (plan.exchange_with_server) server.step(params, params_before_update, session.steps());
//
// Thread-safety: free functions over value types; average_parameters as Peer's collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kf/peer.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf {

/// One step's collectives.
struct ModePlan {
  bool average_gradients = true;      ///< before the update: synchronous SGD
  bool average_parameters = false;    ///< after the update: model averaging
  bool average_with_pair = false;     ///< after the update: pair averaging (kf::PairAverager)
  bool exchange_with_server = false;  ///< after the update: async-ps (kf::ParameterServer)
};

/// The plan of the step that follows `steps_done` steps of the job.
///   sync-sgd: gradients, every step.
///   sma: gradients for the job's first post_local steps (synchronous SGD), then local updates
///        with the parameters averaged after every period-th step (step number steps_done + 1
///        divisible by period), so that period 1 averages after every step.
///   pair-avg: local updates, each followed by an exchange with one peer (PairAverager).
///   async-ps: local updates, each pushed to the parameter server (ParameterServer).
ModePlan plan_step(const ModeSpec& mode, std::int64_t steps_done);

/// Whether, in `mode`, the workers' models may differ at a step boundary (sma with a period
/// above 1 or a local phase to come, pair-avg, async-ps): such models are made one again
/// whenever the cluster changes or the mode switches (docs/training-modes.md, "Switching").
bool models_may_diverge(const ModeSpec& mode) noexcept;

/// Replaces `params` (n float32 values; host memory, or a CUDA buffer with `device`) with their
/// mean over every worker of `peer`: an allreduce of the sum, divided by the size on this
/// worker. Throws: kf::Error from the allreduce.
void average_parameters(Peer& peer, const std::string& name, float* params, std::size_t n);

}  // namespace kf
