// SPDX-License-Identifier: Apache-2.0
// The agent's listing as alive, with the slots it offers (kfrun --watch).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kf/runtime/config_client.hpp"

namespace kf::tools {

/// This host's agent is listed as alive, offering its slots, under a lease
/// (ConfigClient::announce_agent) that a thread of its own renews every third of its TTL: the
/// listing ends when the agent stops, and runs out when the agent dies. kf-member shows it, and
/// a job with `autoscale` places workers on the slots (docs/autoscale.md). A service that is
/// down is retried.
/// Thread-safety: constructed and destroyed by one thread; its own thread renews the lease.
class Liveness {
 public:
  static constexpr std::chrono::seconds kTtl{10};
  Liveness(const std::string& url, const std::string& token, std::string host, int slots)
      : client_(url, token, ConfigClientOptions{std::chrono::milliseconds(2000)}),
        host_(std::move(host)),
        slots_(slots) {
    thread_ = std::thread([this] { run(); });
  }
  ~Liveness() {
    retire();
    thread_.join();
  }
  /// Ends the listing now (its thread retires the lease) without waiting for it.
  void retire() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
  }
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

 private:
  void run();

  ConfigClient client_;
  std::string host_;
  int slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kf::tools
