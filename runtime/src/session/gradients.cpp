// SPDX-License-Identifier: Apache-2.0
// kf::Session's gradient averaging: the allreduce of the gradient, the division by the worker
// count and, with the monitors on, the squared norms and communication they report.
#include <cmath>
#include <stdexcept>

#include "kf/runtime/session.hpp"

namespace kf {

using SteadyClock = std::chrono::steady_clock;

void Session::allreduce_gradients(std::span<float> grads, double local_batch) {
  const double local = monitor_ ? squared_norm(grads) : 0.0;
  const auto t0 = SteadyClock::now();
  peer_
      ->allreduce("kf.grads", buffer(grads.data(), grads.size()),
                  buffer(grads.data(), grads.size()))
      .wait();
  average_gradients(grads, local, t0, local_batch);
}

void Session::allreduce_gradients(std::span<const float> local, std::span<float> mean,
                                  double local_batch) {
  if (local.size() != mean.size()) {
    throw std::invalid_argument("Session::allreduce_gradients: local has " +
                                std::to_string(local.size()) + " values, mean " +
                                std::to_string(mean.size()));
  }
  const auto t0 = SteadyClock::now();
  Handle h = peer_->allreduce("kf.grads", buffer(local.data(), local.size()),
                              buffer(mean.data(), mean.size()));
  // The I/O thread reduces while this thread reads the same input for its norm.
  const double own = monitor_ ? squared_norm(local) : 0.0;
  h.wait();
  average_gradients(mean, own, t0, local_batch);
}

// The allreduced sum → the mean, and the step's reports (|ḡ|² in the same pass).
void Session::average_gradients(std::span<float> sum, double local_sqnorm,
                                std::chrono::steady_clock::time_point started, double local_batch) {
  const double comm = std::chrono::duration<double>(SteadyClock::now() - started).count();
  const float factor = 1.0f / static_cast<float>(peer_->size());
  if (!monitor_) {
    for (float& g : sum) g *= factor;
    return;
  }
  const double global = scale_and_squared_norm(sum, factor);  // ḡ and |ḡ|² in one pass
  report_comm(comm, static_cast<double>(sum.size_bytes()));
  report_gradients(local_sqnorm, global, local_batch, 1, std::isfinite(local_sqnorm));
}

}  // namespace kf
