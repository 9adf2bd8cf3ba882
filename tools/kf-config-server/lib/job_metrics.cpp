// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/job_metrics.hpp"

#include <cmath>
#include <stdexcept>

#include "config.hpp"
#include "kf/monitor/metrics.hpp"
#include "kf/monitor/prometheus_text.hpp"

namespace kf::config_server {

namespace {

// The host of a worker's "host:port", or "" when the event names none (or an unparsable one:
// the service checks workers when events are posted, so only an old state file could hold one).
std::string host_of_worker(const nlohmann::json& event) {
  const auto w = event.find("worker");
  if (w == event.end() || !w->is_string()) return {};
  try {
    return Endpoint::parse(w->get<std::string>()).host;
  } catch (const std::invalid_argument&) {
    return {};
  }
}

std::string string_field(const nlohmann::json& event, const char* key) {
  const auto f = event.find(key);
  return f != event.end() && f->is_string() ? f->get<std::string>() : std::string();
}

}  // namespace

std::optional<std::string> host_of_detail(std::string_view detail) {
  constexpr std::string_view kPrefix = "host ";
  if (!detail.starts_with(kPrefix)) return std::nullopt;
  detail.remove_prefix(kPrefix.size());
  const auto colon = detail.find(": ");
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  return std::string(detail.substr(0, colon));
}

std::optional<double> learning_rate_of(const nlohmann::json& settings) {
  if (!settings.is_object()) return std::nullopt;
  const auto lr = settings.find("lr");
  if (lr == settings.end() || !lr->is_number()) return std::nullopt;
  const double v = lr->get<double>();
  if (!std::isfinite(v) || !(v > 0.0)) return std::nullopt;
  return v;
}

void JobMetrics::count(const nlohmann::json& event) {
  const std::string type = string_field(event, "type");
  if (type.empty()) return;
  ++by_type_[type];
  const std::string worker = string_field(event, "worker");
  const auto bump = [&](std::string_view kind) { ++by_kind_[std::string(kind)]; };
  if (type == "joined") {
    bump("join");
    failed_.erase(worker);
    if (const std::string host = host_of_worker(event); !host.empty()) noticed_.erase(host);
  } else if (type == "left") {
    bump("leave");
  } else if (type == "failed") {
    if (worker.empty() || failed_.insert(worker).second) bump("fail");
  } else if (type == "revoked") {
    const std::string host = host_of_worker(event);
    bump(!host.empty() && noticed_.count(host) != 0 ? "preempt" : "revoke");
  } else if (type == "notice" || type == "draining") {
    if (const auto host = host_of_detail(string_field(event, "detail"))) noticed_.insert(*host);
  }
}

std::uint64_t JobMetrics::events(const std::string& type) const {
  const auto it = by_type_.find(type);
  return it == by_type_.end() ? 0 : it->second;
}

std::uint64_t JobMetrics::membership(std::string_view kind) const {
  const auto it = by_kind_.find(kind);
  return it == by_kind_.end() ? 0 : it->second;
}

std::string JobMetrics::render(const Cluster& cluster, std::optional<double> base_lr,
                               std::size_t agents) const {
  // A fresh registry per scrape: a few dozen series, read once a scrape interval.
  monitor::MetricsRegistry r;
  r.gauge("kf_build_info", "kf's version, as the label (the value is 1)", {{"version", KF_VERSION}})
      .set(1.0);
  r.gauge("kf_config_version", "the cluster document's version").set(double(cluster.version));
  r.gauge("kf_config_workers", "workers in the cluster document").set(double(cluster.size()));
  r.gauge("kf_config_spares", "hot spares in the cluster document")
      .set(double(cluster.spares.size()));
  r.gauge("kf_config_agents", "kfrun agents holding a live lease").set(double(agents));
  if (const auto lr = learning_rate_of(cluster.settings)) {
    r.gauge("kf_config_learning_rate", "the settings' lr").set(*lr);
    if (base_lr) {
      r.gauge("kf_config_learning_rate_scale",
              "the settings' lr over the first lr the job's settings had")
          .set(*lr / *base_lr);
    }
  }
  for (const auto& [type, n] : by_type_) {
    r.counter("kf_config_events_total", "events in the audit trail, by type", {{"type", type}})
        .inc(double(n));
  }
  for (const auto kind : kMembershipKinds) {
    r.counter("kf_config_membership_events_total",
              "membership changes by kind: join, leave, fail, revoke, preempt",
              {{"kind", std::string(kind)}})
        .inc(double(membership(kind)));
  }
  return monitor::to_prometheus_text(r);
}

}  // namespace kf::config_server
