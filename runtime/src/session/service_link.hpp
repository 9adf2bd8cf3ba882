// SPDX-License-Identifier: Apache-2.0
// kf::Session's link to the config service: a ClusterWatch keeps the newest cluster document, so
// that the step boundary reads it without a network round trip, and a poster thread sends audit
// events and rank 0's proposals off the training thread (a slow or absent service must not stall
// a step). Thread-safety: every method from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/cluster_watch.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::detail {

class ServiceLink {
 public:
  struct Snapshot {
    Cluster cluster;
    std::string json;
    std::int64_t seen_us = 0;  ///< when this worker learnt it (wall clock, us)
  };

  /// Starts watching after `initial`; `poll` is the longest wait of one long-poll.
  /// Throws: std::invalid_argument naming a malformed URL.
  ServiceLink(const std::string& url, const std::string& token, const Cluster& initial,
              std::chrono::milliseconds poll);
  /// Stops the watch (cutting its long-poll short) and sends what is queued, then stops.
  ~ServiceLink();
  ServiceLink(const ServiceLink&) = delete;
  ServiceLink& operator=(const ServiceLink&) = delete;

  std::uint64_t version() const noexcept { return version_.load(std::memory_order_acquire); }
  Snapshot latest() const;

  /// Takes a document this worker learnt otherwise (from a compare-and-swap answer).
  void offer(const Cluster& c);

  /// Waits up to `timeout` for a document newer than `version` (from the watch or offer());
  /// returns whether one came. Returns at once when one is already there.
  bool wait_newer(std::uint64_t version, std::chrono::milliseconds timeout) const;

  /// Queues an audit event; the poster thread sends it (best effort, logged on failure).
  void post(std::string type, std::string worker, std::string detail, std::uint64_t version);

  /// Queues a write to the config service for the poster thread, unless one with the same key
  /// is still queued (a proposal made again at the next step while the first is on its way).
  /// Work that fails is logged; the policy proposes again while it still wants the change.
  void submit(std::string key, std::function<void(ConfigClient&)> work);

  const std::string& url() const noexcept { return url_; }

  /// How long the watch has failed to reach the service, zero while it reaches it.
  std::chrono::milliseconds down_for() const noexcept;
  const std::string& token() const noexcept { return token_; }

 private:
  struct Event {
    std::string type, worker, detail;
    std::uint64_t version = 0;
    std::string key;                          // for submitted work: its identity
    std::function<void(ConfigClient&)> work;  // submitted work instead of an event
  };

  bool on_error(const Error& e);
  void post_loop();

  const std::string url_;
  const std::string token_;
  mutable std::mutex mu_;                     // guards latest_, events_, stop_
  std::condition_variable cv_;                // events_ or stop_ changed
  mutable std::condition_variable newer_cv_;  // latest_ changed
  bool stop_ = false;
  Snapshot latest_;
  std::atomic<std::uint64_t> version_{0};
  std::deque<Event> events_;
  bool down_ = false;                           // used by the watch's thread only
  std::atomic<std::int64_t> down_since_us_{0};  // steady clock; 0 while the service answers
  std::thread poster_;
  std::unique_ptr<ClusterWatch> watch_;  // last: its thread uses the members above
};

}  // namespace kf::detail
