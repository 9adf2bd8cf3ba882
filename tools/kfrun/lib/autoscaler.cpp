// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/autoscaler.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "kf/runtime/cluster_settings.hpp"
#include "kfrun/lib/autoscale.hpp"
#include "kfrun/lib/signal_pipe.hpp"

namespace kf::tools {

namespace {

using Clock = std::chrono::steady_clock;

std::map<std::string, int> count_by_host(const Cluster& c) {
  std::map<std::string, int> n;
  for (const auto& w : c.workers) ++n[w.endpoint.host];
  return n;
}

}  // namespace

Autoscaler::Autoscaler(AutoscalerConfig config, std::function<void(std::string)> say)
    : config_(std::move(config)),
      say_(std::move(say)),
      client_(config_.url, config_.token, ConfigClientOptions{std::chrono::milliseconds(2000)}) {
  thread_ = std::thread([this] { run(); });
}

Autoscaler::~Autoscaler() {
  stop();
  thread_.join();
}

void Autoscaler::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stopped_.notify_all();
  client_.cancel();
}

void Autoscaler::run() {
  block_pipe_signals();                  // the agent's loop takes them
  std::optional<Cluster> seen;           // the newest document
  std::optional<std::uint64_t> written;  // the version this autoscaler wrote last
  Clock::time_point changed_at = Clock::time_point::min();  // the workers last changed
  std::optional<std::optional<std::int64_t>> target_seen;   // the target as last seen
  std::map<std::string, Clock::time_point> avoid_until;
  bool said_down = false;
  std::int64_t spares_short = 0;  // spares without a free slot, as last said
  const PortChooser ports = [this](const std::string& host, int count,
                                   const std::vector<std::uint16_t>& taken) {
    return pick_ports_for(host, config_.ports, count, taken).ports;
  };
  while (!stop_) {
    try {
      Cluster c = seen ? client_.watch(seen->version, config_.period) : client_.get_cluster();
      said_down = false;
      const auto now = Clock::now();
      if (seen && c.version != seen->version && c.workers != seen->workers) {
        changed_at = now;
        if (c.version != written) {
          // Hosts that lost workers by someone else's change (a failure, a revoke, a notice).
          const auto before = count_by_host(*seen), after = count_by_host(c);
          for (const auto& [host, n] : before) {
            const auto it = after.find(host);
            if (it == after.end() || it->second < n) avoid_until[host] = now + config_.avoid_for;
          }
        }
      }
      seen = c;
      std::erase_if(avoid_until, [&](const auto& e) { return e.second <= now; });
      const ParsedSettings parsed = parse_cluster_settings(c.settings);
      const bool spares = parsed.typed.spares > 0 || !c.spares.empty();
      if (c.version == 0 || c.workers.empty() || (!parsed.typed.autoscale && !spares) ||
          parsed.typed.finished || parsed.typed.stop || parsed.typed.suspended) {
        continue;
      }
      const std::vector<AgentOffer> offers = client_.live_agents();
      const auto leader = std::min_element(
          offers.begin(), offers.end(),
          [](const AgentOffer& x, const AgentOffer& y) { return x.host < y.host; });
      if (leader == offers.end() || leader->host != config_.host) continue;
      std::set<std::string> avoid;
      for (const auto& [host, until] : avoid_until) avoid.insert(host);
      // Spares first, at once (no cooldown: they hold no place in the job's collectives), then
      // the workers, on the slots the spares leave.
      std::int64_t short_by = 0;
      const auto spare_plan = plan_spares(c, offers, parsed.typed.spares, avoid, ports, &short_by);
      if (short_by != spares_short) {
        spares_short = short_by;
        if (short_by > 0) {
          say_("spares: " + std::to_string(parsed.typed.spares) + " wanted, but no free slot " +
               "offered for " + std::to_string(short_by) +
               " of them (offer more with kfrun --slots, or lower spares)");
        }
      }
      std::optional<AutoscalePlan> plan;
      if (parsed.typed.autoscale) {
        const AutoscaleSettings a = autoscale_within_bounds(parsed.typed);
        const bool target_changed = target_seen && *target_seen != a.target;
        target_seen = a.target;
        plan = plan_autoscale(spare_plan ? spare_plan->next : c, offers, a, avoid, ports);
        const bool below_min = static_cast<std::int64_t>(c.size()) < a.min;
        const auto cooldown = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(a.cooldown_s));
        if (plan && !below_min && !target_changed && changed_at != Clock::time_point::min() &&
            now - changed_at < cooldown) {
          plan.reset();
        }
      }
      if (!plan && !spare_plan) continue;
      const Cluster& next = plan ? plan->next : spare_plan->next;
      Cluster stored;
      try {
        stored = client_.put_cluster(next, &c);
      } catch (const ConflictError&) {
        // Someone changed the document meanwhile: the watch hands it over at once, and it is
        // judged like any other change (the cooldown, the hosts that lost workers) first.
        continue;
      }
      written = stored.version;
      if (plan) changed_at = Clock::now();
      seen = stored;
      for (const std::optional<AutoscalePlan>* p : {&spare_plan, &std::as_const(plan)}) {
        if (!*p) continue;
        say_((*p)->cause + " (v" + std::to_string(stored.version) + ")");
        for (const auto& w : (*p)->placed) {
          client_.post_event("placed", w.endpoint.str(), (*p)->cause, stored.version);
        }
        for (const auto& w : (*p)->released) {
          client_.post_event("released", w.endpoint.str(), (*p)->cause, stored.version);
        }
      }
    } catch (const std::exception& e) {
      if (stop_) break;
      if (!said_down) say_(std::string("autoscale: ") + e.what() + "; trying again");
      said_down = true;
      // A pause before the next try, cut short by stop().
      std::unique_lock lock(mutex_);
      stopped_.wait_for(lock, config_.period, [this] { return stop_.load(); });
      seen.reset();
    }
  }
}

}  // namespace kf::tools
