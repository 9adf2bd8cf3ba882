// SPDX-License-Identifier: Apache-2.0
// kf::Session's policies and settings: the inputs policies see, running a hook, adopting the
// settings of a cluster version, and applying a proposal on every worker at once.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "kf/common/log.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/session.hpp"
#include "session/free_port.hpp"
#include "session/service_link.hpp"
#include "session/support.hpp"

namespace kf {

PolicyInputs Session::policy_inputs() const {
  PolicyInputs in;
  in.step = on_change_ ? job_step_ : *steps_;
  in.epoch = epoch_;
  in.workers = peer_->size();
  in.version = peer_->version();
  in.settings = settings_;
  in.metrics = metrics_;
  for (const auto& s : stragglers_.scores()) {
    in.speeds.push_back({s.worker, s.vs_fastest, s.vs_own_best, s.slow});
  }
  return in;
}

Proposal Session::run_hook(PolicyHook hook, std::int64_t epoch) {
  if (epoch >= 0) epoch_ = epoch;
  if (policies_ == nullptr || policies_->empty()) return {};
  Proposal p = policies_->run(hook, policy_inputs());
  apply(p, to_string(hook));
  return p;
}

nlohmann::json Session::with_defaults(const nlohmann::json& settings) const {
  if (!settings.is_object() && !settings.is_null()) return settings;  // an error to report
  nlohmann::json out = settings.is_object() ? settings : nlohmann::json::object();
  if (options_.default_settings.is_object()) {
    for (const auto& [key, value] : options_.default_settings.items()) {
      if (!out.contains(key)) out[key] = value;
    }
  }
  return out;
}

ModeSpec Session::mode() const {
  const auto it = settings_.find("mode");
  if (it == settings_.end() || !it->is_string()) return {};
  try {
    return parse_mode(it->get<std::string>());
  } catch (const std::invalid_argument&) {
    return {};  // not reached: adopt_settings leaves out a bad mode
  }
}

CompressionSpec Session::compression() const {
  const auto it = settings_.find("compression");
  if (it == settings_.end() || !it->is_string()) return {};
  try {
    return parse_compression(it->get<std::string>());
  } catch (const std::invalid_argument&) {
    return {};
  }
}

// A setting of the wrong type is logged and left out: one bad write to the config service must
// not end the job (every worker reads the same document, so every worker leaves out the same).
void Session::adopt_settings(const nlohmann::json& settings) {
  // Settings a static job changed locally stay until a cluster version says otherwise.
  if (!link_ && !settings_.empty()) return;
  ParsedSettings parsed = parse_cluster_settings(with_defaults(settings));
  for (const auto& error : parsed.errors) {
    KF_LOG(err, "session", "{} (v{}): {}; ignoring it", peer_->endpoint().str(), peer_->version(),
           error);
  }
  settings_ = std::move(parsed.valid);
  mode_info_stale_ = true;
  if (parsed.typed.algorithm) peer_->set_default_algorithm(*parsed.typed.algorithm);
  // The modes with steps that meet nobody: the asynchronous ones, whose exchanges wait for no
  // other worker, and sma's steps between two averagings.
  const std::optional<ModeSpec>& m = parsed.typed.mode;
  const bool asynchronous =
      m && (m->mode == TrainingMode::pair_avg || m->mode == TrainingMode::async_ps);
  const bool averaging = m && m->mode == TrainingMode::sma && m->period > 1;
  if (parsed.typed.on_change && !asynchronous && !averaging && !on_change_refused_) {
    KF_LOG(warn, "session",
           "{} (v{}): settings \"boundaries\": \"on-change\" takes effect in the pair-avg, "
           "async-ps and sma (period above 1) modes only; this job's steps end at a boundary "
           "each",
           peer_->endpoint().str(), peer_->version());
  }
  on_change_refused_ = parsed.typed.on_change && !asynchronous && !averaging;
  on_change_ = parsed.typed.on_change && (asynchronous || averaging);
  averaging_boundaries_.reset();
  if (on_change_ && averaging) averaging_boundaries_ = *m;
}

namespace {

// Takes `revoke`'s workers out of `next` (those still in it), never its last one, and moves in a
// hot spare on another host for each where there is one; the events to post go to `events`.
void revoke_workers(Cluster& next, const std::vector<std::string>& revoke, const std::string& why,
                    std::vector<ConfigEvent>& events) {
  std::vector<std::string> hosts;
  std::size_t removed = 0;
  for (const auto& name : revoke) {
    const auto it = std::find_if(next.workers.begin(), next.workers.end(),
                                 [&](const WorkerSpec& w) { return w.endpoint.str() == name; });
    if (it == next.workers.end() || next.workers.size() + next.spares.size() <= 1) continue;
    hosts.push_back(it->endpoint.host);
    next.workers.erase(it);
    ++removed;
    events.push_back(ConfigEvent{0, {}, "revoked", name, why, std::nullopt});
  }
  // Spares on other hosts first (the revoked worker's host may be the slow part), then any.
  auto promoted = promote_spares(next, removed, hosts);
  for (const auto& w : promote_spares(next, removed - promoted.size())) promoted.push_back(w);
  for (const auto& w : promoted) {
    events.push_back(ConfigEvent{0,
                                 {},
                                 "promoted",
                                 w.endpoint.str(),
                                 "a hot spare, in place of a revoked worker (" + why + ")",
                                 std::nullopt});
  }
}

}  // namespace

// Applies a proposal on every worker at once. Every worker computed the same proposal from the
// same inputs; in an elastic job rank 0 alone writes it as one new cluster version (all changes
// together), which every worker then takes up at the same boundary. In a static job the
// settings change here, on every worker, at this boundary.
void Session::apply(const Proposal& proposal, const char* hook) {
  if (proposal.empty() || proposal.changes_nothing(peer_->size(), settings_)) return;
  count_decisions(proposal);
  decisions_.push_back(PolicyDecision{*steps_, hook, proposal});
  if (decisions_.size() > kMaxDecisions) decisions_.pop_front();
  std::string why;
  for (const auto& r : proposal.reasons) why += (why.empty() ? "" : "; ") + r;
  // Captures a copy: the elastic branch runs it later, on the poster thread.
  const auto edit_settings = [p = proposal](nlohmann::json& st) {
    if (p.batch_size) st["batch_size"] = *p.batch_size;
    if (p.learning_rate) st["lr"] = *p.learning_rate;
    if (p.algorithm) st["algorithm"] = *p.algorithm;
    if (p.mode) st["mode"] = *p.mode;
    if (p.compression) st["compression"] = *p.compression;
    if (p.balance) st["balance"] = *p.balance;
    if (p.stop) st["stop"] = true;
  };
  if (!link_) {
    if (proposal.workers && *proposal.workers != peer_->size()) {
      KF_LOG(warn, "session", "{}: a static job cannot resize ({})", peer_->endpoint().str(), why);
    }
    if (!proposal.revoke.empty()) {
      KF_LOG(warn, "session", "{}: a static job cannot revoke a worker ({})",
             peer_->endpoint().str(), why);
    }
    nlohmann::json st = settings_;
    edit_settings(st);
    // Leaving a mode whose models may differ: one model again, rank 0's, on every worker at
    // this boundary.
    if (peer_->size() > 1 && detail::modes_diverge(settings_) && !detail::modes_diverge(st)) {
      state_.sync(*peer_, 0);
    }
    settings_ = st;
    mode_info_stale_ = true;
    if (proposal.algorithm) peer_->set_default_algorithm(*parse_algorithm(*proposal.algorithm));
    KF_LOG(info, "session", "{} (rank {}) step {}: {} applied {}", peer_->endpoint().str(),
           peer_->rank(), *steps_, hook, why);
    return;
  }
  if (peer_->rank() != 0) return;
  // Rank 0 writes the change off the training thread: a slow or absent config service must not
  // stall the step (the change then simply comes later, or is proposed again).
  const Endpoint self = peer_->endpoint();
  const std::int64_t step = *steps_;
  detail::ServiceLink* watch = link_.get();
  link_->submit(proposal.to_json().dump(), [=](ConfigClient& client) {
    Cluster c = client.get_cluster();
    for (int attempt = 0; attempt < 20; ++attempt) {
      bool as_target = false;
      Cluster next = c;
      edit_settings(next.settings);
      const ClusterSettings typed = parse_cluster_settings(c.settings).typed;
      if (proposal.workers && typed.autoscale) {
        // The agents place the workers on the slots they offer (docs/autoscale.md): the
        // proposal becomes autoscale's target, within its bounds.
        const AutoscaleSettings bounds = autoscale_within_bounds(typed);
        std::int64_t want = *proposal.workers;
        want = std::max(want, bounds.min);
        if (bounds.max) want = std::min(want, *bounds.max);
        next.settings["autoscale"]["target"] = want;
        as_target = true;
      } else if (proposal.workers) {
        const auto want = static_cast<std::size_t>(*proposal.workers);
        if (want < next.workers.size()) next.workers.resize(want);
        int slot = 0;
        for (const auto& w : next.workers) {
          if (w.endpoint.host == self.host) slot = std::max(slot, w.slot + 1);
        }
        while (next.workers.size() < want) {
          const std::uint16_t port = detail::free_port(self.host, next);
          next.workers.push_back(WorkerSpec{Endpoint{self.host, port}, slot++});
        }
      }
      std::vector<ConfigEvent> events;
      revoke_workers(next, proposal.revoke, "policy: " + why, events);
      if (next.workers == c.workers && next.settings == c.settings) return;  // already there
      try {
        const Cluster stored = client.put_cluster(next);
        KF_LOG(info, "session", "{} (rank 0) step {}: {} wrote v{}: {}", self.str(), step, hook,
               stored.version, why);
        // A revoke alone is told by its own events.
        if (events.empty() || proposal.workers || next.settings != c.settings) {
          watch->post(proposal.workers && !as_target ? "resized" : "note", "",
                      "policy: " + why + (as_target ? " (as autoscale's target)" : ""),
                      stored.version);
        }
        for (const auto& e : events) watch->post(e.type, e.worker, e.detail, stored.version);
        return;
      } catch (const ConflictError& e) {
        c = e.current();
      }
    }
  });
}

}  // namespace kf
