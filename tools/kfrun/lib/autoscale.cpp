// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/autoscale.hpp"

#include <algorithm>
#include <limits>
#include <map>

namespace kf::tools {

namespace {

std::string count_of(std::size_t n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::optional<AutoscalePlan> plan_autoscale(const Cluster& current,
                                            const std::vector<AgentOffer>& offers,
                                            const AutoscaleSettings& settings,
                                            const std::set<std::string>& avoid,
                                            const PortChooser& ports) {
  constexpr auto kNoCap = std::numeric_limits<std::int64_t>::max();
  // The usable offers by host and each one's cap.
  std::map<std::string, std::int64_t> cap, slots, spares_on;
  for (const auto& w : current.spares) ++spares_on[w.endpoint.host];
  std::set<std::string> avoided;  // offered, but avoided
  for (const auto& o : offers) {
    if (o.slots >= 1 && avoid.contains(o.host)) avoided.insert(o.host);
    if (o.slots < 1 || avoid.contains(o.host)) continue;
    slots[o.host] = o.slots;
    cap[o.host] = std::min<std::int64_t>(std::max<std::int64_t>(o.slots - spares_on[o.host], 0),
                                         settings.per_host.value_or(kNoCap));
  }
  AutoscalePlan plan;
  plan.next = current;
  auto& workers = plan.next.workers;

  // Above a host's cap (per_host lowered, or workers added there by hand): the newest go.
  std::map<std::string, std::int64_t> on_host;
  for (const auto& w : workers) ++on_host[w.endpoint.host];
  for (auto it = workers.end(); it != workers.begin();) {
    --it;
    const auto c = cap.find(it->endpoint.host);
    if (c == cap.end() || on_host[it->endpoint.host] <= c->second || workers.size() <= 1) continue;
    --on_host[it->endpoint.host];
    plan.released.push_back(*it);
    it = workers.erase(it);
  }

  std::int64_t capacity = 0, fixed = 0;
  for (const auto& [host, c] : cap) capacity += c;
  for (const auto& [host, n] : on_host) {
    if (!cap.contains(host)) fixed += n;
  }
  std::int64_t want = settings.target.value_or(capacity + fixed);
  want = std::max(want, settings.min);
  if (settings.max) want = std::min(want, *settings.max);
  want = std::min(want, capacity + fixed);
  want = std::max<std::int64_t>(want, 1);
  const auto have = static_cast<std::int64_t>(workers.size());

  if (want > have) {
    // Hosts that run workers of the job first (collectives stay within fewer hosts), then the
    // others; by host within each group.
    std::vector<std::string> order;
    for (const auto& [host, c] : cap) {
      if (on_host[host] > 0) order.push_back(host);
    }
    for (const auto& [host, c] : cap) {
      if (on_host[host] == 0) order.push_back(host);
    }
    std::int64_t missing = want - have;
    for (const auto& host : order) {
      const std::int64_t n = std::min(missing, cap[host] - on_host[host]);
      if (n <= 0) continue;
      std::set<int> used_slots;
      std::vector<std::uint16_t> taken;
      for (const auto* list : {&workers, &plan.next.spares}) {
        for (const auto& w : *list) {
          if (w.endpoint.host != host) continue;
          used_slots.insert(w.slot);
          taken.push_back(w.endpoint.port);
        }
      }
      const std::vector<std::uint16_t> got = ports(host, static_cast<int>(n), taken);
      int slot = 0;
      for (const auto port : got) {
        while (used_slots.contains(slot)) ++slot;
        if (slot >= slots[host]) break;
        used_slots.insert(slot);
        workers.push_back(WorkerSpec{Endpoint{host, port}, slot});
        plan.placed.push_back(workers.back());
        ++on_host[host];
        --missing;
      }
      if (missing == 0) break;
    }
  } else {
    while (static_cast<std::int64_t>(workers.size()) > want) {
      plan.released.push_back(workers.back());
      workers.pop_back();
    }
  }
  if (plan.placed.empty() && plan.released.empty()) return std::nullopt;

  std::string target = settings.target ? std::to_string(*settings.target) : "all offered";
  plan.cause = "autoscale: target " + target + ", " +
               count_of(static_cast<std::size_t>(capacity), "slot") + " offered on " +
               count_of(cap.size(), "host");
  if (settings.per_host) plan.cause += " (per_host " + std::to_string(*settings.per_host) + ")";
  if (!avoided.empty()) {
    std::string hosts;
    for (const auto& h : avoided) hosts += (hosts.empty() ? "" : " ") + h;
    plan.cause += ", avoiding " + hosts + " (lost workers just now)";
  }
  plan.cause +=
      ": " + std::to_string(current.size()) + " -> " + std::to_string(workers.size()) + " workers";
  return plan;
}

std::optional<AutoscalePlan> plan_spares(const Cluster& current,
                                         const std::vector<AgentOffer>& offers, std::int64_t want,
                                         const std::set<std::string>& avoid,
                                         const PortChooser& ports, std::int64_t* short_by) {
  AutoscalePlan plan;
  plan.next = current;
  auto& spares = plan.next.spares;
  if (short_by != nullptr) *short_by = 0;
  while (static_cast<std::int64_t>(spares.size()) > want) {
    plan.released.push_back(spares.back());
    spares.pop_back();
  }
  std::int64_t missing = want - static_cast<std::int64_t>(spares.size());
  std::map<std::string, std::int64_t> workers_on;
  for (const auto& w : current.workers) ++workers_on[w.endpoint.host];
  // Hosts by how many workers of the job they run, then by name.
  std::vector<AgentOffer> order;
  for (const auto& o : offers) {
    if (o.slots >= 1 && !avoid.contains(o.host)) order.push_back(o);
  }
  std::sort(order.begin(), order.end(), [&](const AgentOffer& x, const AgentOffer& y) {
    return std::pair(workers_on[x.host], x.host) < std::pair(workers_on[y.host], y.host);
  });
  for (const auto& o : order) {
    if (missing <= 0) break;
    std::set<int> used_slots;
    std::vector<std::uint16_t> taken;
    for (const auto* list : {&plan.next.workers, &spares}) {
      for (const auto& w : *list) {
        if (w.endpoint.host != o.host) continue;
        used_slots.insert(w.slot);
        taken.push_back(w.endpoint.port);
      }
    }
    const std::int64_t free = o.slots - static_cast<std::int64_t>(used_slots.size());
    const std::int64_t n = std::min(missing, free);
    if (n <= 0) continue;
    const std::vector<std::uint16_t> got = ports(o.host, static_cast<int>(n), taken);
    int slot = 0;
    for (const auto port : got) {
      while (used_slots.contains(slot)) ++slot;
      if (slot >= o.slots) break;
      used_slots.insert(slot);
      spares.push_back(WorkerSpec{Endpoint{o.host, port}, slot});
      plan.placed.push_back(spares.back());
      --missing;
    }
  }
  if (short_by != nullptr) *short_by = std::max<std::int64_t>(missing, 0);
  if (plan.placed.empty() && plan.released.empty()) return std::nullopt;
  plan.cause = "spares: keeping " + count_of(static_cast<std::size_t>(want), "hot spare") + ": " +
               std::to_string(current.spares.size()) + " -> " + std::to_string(spares.size()) +
               (missing > 0 ? " (no free slot for " + std::to_string(missing) + " more)" : "");
  return plan;
}

}  // namespace kf::tools
