// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/cluster_watch.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "kf/runtime/config_client.hpp"

namespace kf {

namespace {
constexpr std::chrono::milliseconds kFirstBackoff{50};
}  // namespace

class ClusterWatch::Runner {
 public:
  Runner(ClusterWatchOptions options, ClusterWatchHandlers handlers)
      : options_(std::move(options)),
        handlers_(std::move(handlers)),
        client_(options_.url, options_.token, ConfigClientOptions{options_.request_deadline}) {
    thread_ = std::thread([this] { run(); });
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    client_.cancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  bool stopping() {
    std::lock_guard lock(mutex_);
    return stop_;
  }

  // Waits `period` unless stopped first. Returns false when stopped.
  bool pause(std::chrono::milliseconds period) {
    std::unique_lock lock(mutex_);
    return !changed_.wait_for(lock, period, [&] { return stop_; });
  }

  // One call: the start, a plain read after a failure, or a long-poll.
  Cluster next(bool started, bool failed, std::uint64_t after) {
    if (!started) {
      return options_.start ? options_.start(client_) : client_.watch(after, options_.poll);
    }
    return failed ? client_.get_cluster() : client_.watch(after, options_.poll);
  }

  void run() noexcept {
    std::uint64_t after = options_.after_version;
    bool started = false;
    bool failed = false;
    auto backoff = kFirstBackoff;
    while (!stopping()) {
      try {
        Cluster c = next(started, failed, after);
        if (handlers_.on_reached) handlers_.on_reached();
        failed = false;
        backoff = kFirstBackoff;
        const bool report = (!started && options_.start) || c.version > after;
        started = true;
        if (report) {
          after = std::max(after, c.version);
          handlers_.on_cluster(c);
        }
        continue;
      } catch (const Error& e) {
        if (e.code() == errc::cancelled) return;
        if (!handlers_.on_error(e)) return;
      } catch (const std::exception& e) {
        if (!handlers_.on_error(Error(make_error_code(errc::protocol_error), e.what()))) return;
      }
      failed = true;
      if (!pause(backoff)) return;
      backoff = std::min(backoff * 2, options_.max_backoff);
    }
  }

  const ClusterWatchOptions options_;
  const ClusterWatchHandlers handlers_;
  ConfigClient client_;  // used by thread_ only, except cancel()
  std::mutex mutex_;     // guards stop_
  std::condition_variable changed_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything it uses
};

ClusterWatch::ClusterWatch(ClusterWatchOptions options, ClusterWatchHandlers handlers)
    : runner_(std::make_unique<Runner>(std::move(options), std::move(handlers))) {}

ClusterWatch::~ClusterWatch() { stop(); }

void ClusterWatch::stop() noexcept {
  if (runner_) runner_->stop();
}

}  // namespace kf
