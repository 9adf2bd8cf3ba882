// SPDX-License-Identifier: Apache-2.0
// The autoscaler of kfrun's watch mode (docs/autoscale.md): a thread of every agent that, when
// the job's settings hold `autoscale` and this agent leads (its host is the first of the live
// agents), places workers on the slots the agents offer and gives them up, by compare-and-swap
// on the cluster document, with a `placed` or `released` event per worker that says why. The
// decision is plan_autoscale's (autoscale.hpp); this class adds the timing:
//  - a change of the workers (of any cause) starts the cooldown; the autoscaler changes nothing
//    until it has passed, unless the job is below `min` or the target was changed (a policy or
//    a person asked for a count: that is done at once);
//  - a host that lost workers in a change the autoscaler did not write is avoided for a while
//    (its agent may be dead though its lease still runs), so that no worker is placed where
//    nobody starts it.
// Thread-safety: constructed, stopped and destroyed by one thread; its own thread does the rest.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/ports.hpp"

namespace kf::tools {

struct AutoscalerConfig {
  std::string url;    ///< the config service
  std::string token;  ///< the job token
  std::string host;   ///< this agent's host, as it is listed among the live agents
  PortRange ports;    ///< where the new workers' ports come from
  /// How often the offers are looked at when the document does not change.
  std::chrono::milliseconds period{500};
  /// How long a host that lost workers is avoided (the agents' lease: a dead agent's listing is
  /// gone by then).
  std::chrono::milliseconds avoid_for{10'000};
};

class Autoscaler {
 public:
  /// Starts the thread. `say` gets one line per decision or problem (from that thread).
  Autoscaler(AutoscalerConfig config, std::function<void(std::string)> say);
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;
  /// Calls stop() and joins the thread.
  ~Autoscaler();
  /// Asks the thread to stop and cuts short its request in flight; does not wait. A decision
  /// already written stays written.
  void stop() noexcept;

 private:
  void run();

  AutoscalerConfig config_;
  std::function<void(std::string)> say_;
  ConfigClient client_;
  std::mutex mutex_;  // with stopped_: the pause after a failed request
  std::condition_variable stopped_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kf::tools
