// SPDX-License-Identifier: Apache-2.0
// The agent's listing as alive in etcd (kfrun --watch with an etcd:// service).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "kf/runtime/config_client.hpp"

namespace kf::tools {

/// With etcd, this host's agent is listed as alive under a lease (ConfigClient::announce_agent)
/// that a thread of its own renews every third of its TTL: the listing ends when the agent stops,
/// and runs out when the agent dies. kf-member shows it. A service that is down is retried.
/// Thread-safety: constructed and destroyed by one thread; its own thread renews the lease.
class Liveness {
 public:
  static constexpr std::chrono::seconds kTtl{10};
  Liveness(const std::string& url, const std::string& token, std::string host)
      : client_(url, token, ConfigClientOptions{std::chrono::milliseconds(2000)}),
        host_(std::move(host)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Liveness() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

 private:
  void run();

  ConfigClient client_;
  std::string host_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kf::tools
