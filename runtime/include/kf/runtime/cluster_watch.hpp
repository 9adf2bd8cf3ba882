// SPDX-License-Identifier: Apache-2.0
// kf::ClusterWatch: follows the cluster document of the config service in the background and
// reports every newer version, for kf::Session and for kfrun's agent alike. A thread of its own
// long-polls (ConfigClient::watch); a call that cannot reach the service is retried after a
// back-off that doubles up to max_backoff, and after a failure a plain read comes first, so that a
// service that is back is noticed at once. stop() cuts a long-poll in flight short
// (ConfigClient::cancel) and joins the thread: it returns within about one request's work, never
// after a whole long-poll.
// Ownership: the handlers are called on the watch's thread and must stay valid until stop()
// returns (the destructor calls it).
// Thread-safety: stop() from any thread; the handlers run on the watch's thread, one at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kf/cluster/cluster.hpp"
#include "kf/common/error.hpp"

namespace kf {

class ConfigClient;

struct ClusterWatchOptions {
  std::string url;                                   ///< http://HOST:PORT of the config service
  std::string token;                                 ///< the job token (for writes made by `start`)
  std::chrono::milliseconds request_deadline{5000};  ///< each ordinary request
  std::chrono::milliseconds poll{500};               ///< the longest wait of one long-poll
  std::chrono::milliseconds max_backoff{1000};       ///< longest pause between failed calls
  /// The version to watch after; ignored when `start` is given.
  std::uint64_t after_version = 0;
  /// Optional first work on the watch's thread, before it watches: its result is reported with
  /// on_cluster (whatever its version) and watched after. It may call the client freely; a
  /// kf::Error it throws goes to on_error like any other (errc::service_unavailable: `start` is
  /// run again after the back-off).
  std::function<Cluster(ConfigClient&)> start;
};

struct ClusterWatchHandlers {
  /// A version newer than the last one reported (or the result of `start`).
  std::function<void(const Cluster&)> on_cluster;
  /// A call failed. Return true to try again after the back-off, false to end the watch. Not
  /// called for the cancellation of stop().
  std::function<bool(const Error&)> on_error;
  /// A call reached the service (after failures: it is back). Optional.
  std::function<void()> on_reached;
};

class ClusterWatch {
 public:
  /// Starts the thread. Throws: std::invalid_argument naming a malformed URL.
  ClusterWatch(ClusterWatchOptions options, ClusterWatchHandlers handlers);
  /// Calls stop().
  ~ClusterWatch();
  ClusterWatch(const ClusterWatch&) = delete;
  ClusterWatch& operator=(const ClusterWatch&) = delete;

  /// Cancels the request in flight and the back-off, and joins the thread. noexcept; idempotent.
  void stop() noexcept;

 private:
  class Runner;
  std::unique_ptr<Runner> runner_;
};

}  // namespace kf
