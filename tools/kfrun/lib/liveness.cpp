// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/liveness.hpp"

#include <exception>

#include "kfrun/lib/signal_pipe.hpp"

namespace kf::tools {

void Liveness::run() {
  block_pipe_signals();  // the agent's loop takes them
  bool announced = false;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      if (announced) {
        client_.keep_agent_alive();
      } else {
        client_.announce_agent(host_, kTtl, slots_);
        announced = true;
      }
    } catch (const std::exception&) {
      // Unreachable for now: the next period tries again (the agent logs outages itself).
    }
    lock.lock();
    changed_.wait_for(lock, kTtl / 3, [this] { return stop_; });
  }
  lock.unlock();
  if (!announced) return;
  try {
    client_.retire_agent();
  } catch (const std::exception&) {
    // The lease runs out by itself.
  }
}

}  // namespace kf::tools
