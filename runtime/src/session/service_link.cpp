// SPDX-License-Identifier: Apache-2.0
#include "session/service_link.hpp"

#include <utility>

#include "kf/common/log.hpp"
#include "session/support.hpp"

namespace kf::detail {

ServiceLink::ServiceLink(const std::string& url, const std::string& token, const Cluster& initial,
                         std::chrono::milliseconds poll)
    : url_(url), token_(token) {
  latest_.cluster = initial;
  latest_.json = initial.to_json().dump();
  latest_.seen_us = now_us();
  version_.store(initial.version, std::memory_order_release);
  ConfigClient probe(url, token);  // validates the URL now (throws std::invalid_argument)
  poster_ = std::thread([this] { post_loop(); });
  ClusterWatchOptions options;
  options.url = url;
  options.token = token;
  options.poll = poll;
  options.after_version = initial.version;
  ClusterWatchHandlers handlers;
  handlers.on_cluster = [this](const Cluster& c) { offer(c); };
  handlers.on_error = [this](const Error& e) { return on_error(e); };
  handlers.on_reached = [this] {
    down_since_us_.store(0, std::memory_order_relaxed);
    if (std::exchange(down_, false)) KF_LOG(info, "session", "config service {} is back", url_);
  };
  try {
    watch_ = std::make_unique<ClusterWatch>(std::move(options), std::move(handlers));
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    poster_.join();
    throw;
  }
}

ServiceLink::~ServiceLink() {
  watch_->stop();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  poster_.join();
}

std::chrono::milliseconds ServiceLink::down_for() const noexcept {
  const std::int64_t since = down_since_us_.load(std::memory_order_relaxed);
  if (since == 0) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now().time_since_epoch() - std::chrono::microseconds(since));
}

bool ServiceLink::on_error(const Error& e) {
  if (!std::exchange(down_, true)) {
    down_since_us_.store(std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count(),
                         std::memory_order_relaxed);
    KF_LOG(warn, "session", "config service {} unreachable ({}); training goes on with cluster v{}",
           url_, e.what(), version());
  }
  return true;  // training goes on; keep trying
}

ServiceLink::Snapshot ServiceLink::latest() const {
  std::lock_guard<std::mutex> lk(mu_);
  return latest_;
}

void ServiceLink::offer(const Cluster& c) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (c.version <= latest_.cluster.version) return;
    latest_ = Snapshot{c, c.to_json().dump(), now_us()};
    version_.store(c.version, std::memory_order_release);
  }
  newer_cv_.notify_all();
}

bool ServiceLink::wait_newer(std::uint64_t version, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  return newer_cv_.wait_for(lk, timeout, [&] { return latest_.cluster.version > version; });
}

void ServiceLink::post(std::string type, std::string worker, std::string detail,
                       std::uint64_t version) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back({std::move(type), std::move(worker), std::move(detail), version, {}, {}});
  }
  cv_.notify_all();
}

void ServiceLink::submit(std::string key, std::function<void(ConfigClient&)> work) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& e : events_) {
      if (e.work && e.key == key) return;
    }
    Event ev{};
    ev.key = std::move(key);
    ev.work = std::move(work);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

void ServiceLink::post_loop() {
  ConfigClient client(url_, token_);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !events_.empty(); });
    if (events_.empty()) return;  // stopping with nothing left to send
    Event ev = std::move(events_.front());
    events_.pop_front();
    lk.unlock();
    try {
      if (ev.work) {
        ev.work(client);
      } else {
        client.post_event(ev.type, ev.worker, ev.detail, ev.version);
      }
    } catch (const std::exception& e) {
      KF_LOG(warn, "session", "could not {} on {}: {}",
             ev.work ? "write a proposal" : "record event '" + ev.type + "'", url_, e.what());
    }
    lk.lock();
  }
}

}  // namespace kf::detail
