// SPDX-License-Identifier: Apache-2.0
// kf::Session::end_step(): the step boundary as pack -> exchange -> decide -> apply. The rules
// are pure (session/boundary_rules.hpp); this file packs this worker's record, runs the control
// collectives, commits the step and carries the decision out.
#include <unistd.h>

#include <bit>
#include <cmath>

#include <nlohmann/json.hpp>

#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/metrics.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/training_mode.hpp"
#include "session/boundary_rules.hpp"
#include "session/service_link.hpp"
#include "session/support.hpp"

namespace kf {

using detail::BoundaryDecision;
using detail::contains;
using detail::is_peer_failure;
using detail::NewerVerdict;
using detail::now_us;
using detail::RecordLayout;
using SteadyClock = std::chrono::steady_clock;

// This worker's record: the newest version its watch holds (and that document), its commits, the
// pending version whose joiners it has reached, the monitors' words and the metrics.
std::vector<std::int64_t> Session::pack_record(const RecordLayout& layout,
                                               SteadyClock::time_point now,
                                               std::string* newest_json,
                                               std::int64_t* newest_seen_us) {
  detail::BoundaryRecord rec;
  rec.version_seen = peer_->version();
  rec.commits = *commits_;
  rec.steps = *steps_;
  if (link_ && link_->version() > peer_->version()) {
    auto newest = link_->latest();
    rec.version_seen = newest.cluster.version;
    rec.doc_bytes = newest.json.size();
    *newest_json = std::move(newest.json);
    *newest_seen_us = newest.seen_us;
  }
  if (pending_ && invited_version_ == pending_->version && invites_delivered()) {
    rec.ready_version = pending_->version;
  } else if (pending_ && invited_version_ != pending_->version &&
             contains(*pending_, peer_->endpoint())) {
    if (joiners_given_up()) {
      drop_unreachable_joiners();  // a newer version without them arrives at a later boundary
    } else {
      invite_joiners(*pending_, peer_->cluster(), false);  // a failed invitation: try again
    }
  }
  std::vector<std::int64_t> words(layout.words(), 0);
  detail::pack(rec, metric_values_, layout, words);
  if (monitor_) {
    report_.step_time = std::chrono::duration<double>(now - step_began_).count();
    StepMonitor::pack(
        report_, std::span<std::int64_t>(words).subspan(layout.monitor_at(), layout.monitor_words));
  }
  return words;
}

// Every worker finished the step: count and commit it, average the metrics, feed the monitors,
// export, and run the after_step policies.
void Session::commit_step(std::span<const std::int64_t> all, const RecordLayout& layout,
                          SteadyClock::time_point began) {
  // The job's step, the same on every worker: rank 0's (with boundaries on change the workers'
  // own counts differ).
  job_step_ = detail::unpack(all.subspan(0, layout.words()), layout)[0].steps + 1;
  ++*steps_;
  progress_at_ = SteadyClock::now();
  changes_since_progress_ = 0;
  if (*steps_ % options_.commit_every == 0) {
    ++*commits_;
    state_.commit();
  }
  after_commit();
  const auto means = detail::average_metrics(all, layout);
  for (std::size_t i = 0; i < metric_names_.size(); ++i) metrics_[metric_names_[i]] = means[i];
  std::fill(metric_values_.begin(), metric_values_.end(), 0.0);
  if (steps_total_ != nullptr) count_step(SteadyClock::now());  // no clock read without metrics
  if (monitor_) {
    if (samples_total_ != nullptr && report_.samples > 0 && std::isfinite(report_.samples)) {
      samples_total_->inc(report_.samples);
    }
    update_speeds(all, layout.words(), layout.monitor_at());
    track_stragglers(all, layout.words(), layout.monitor_at());
    if (auto said =
            monitor_->update(all, layout.words(), layout.monitor_at(), peer_->size(), metrics_)) {
      KF_LOG(info, "monitor", "{} (rank {}): {}", peer_->endpoint().str(), peer_->rank(), *said);
    }
    report_ = StepReport{};
    samples_reported_ = false;
  }
  step_began_ = began;
  if (registry_) export_metrics();
  if (link_ && peer_->rank() == 0) post_summary();
  if (policies_ != nullptr && !policies_->empty()) {
    apply(policies_->run(PolicyHook::after_step, policy_inputs()), "after_step");
  }
}

// An orphan (its agent died) whose config service is gone for good: nothing could adopt it or
// change its job, and on a GPU cluster it would hold its GPU for ever (SessionOptions::agent_pid).
void Session::check_control_plane() const {
  if (!link_ || !options_.agent_pid) return;
  const auto down = link_->down_for();
  if (down < options_.service_timeout || ::getppid() == *options_.agent_pid) return;
  throw Error(make_error_code(errc::service_unavailable),
              "the agent that started this worker (pid " + std::to_string(*options_.agent_pid) +
                  ") is gone and the config service " + link_->url() +
                  " has been unreachable for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(down).count()) +
                  " s (KF_SERVICE_TIMEOUT_MS " + std::to_string(options_.service_timeout.count()) +
                  "): no agent can adopt this worker; it stops");
}

// Failures and changes that keep coming with no step committed in between (the cluster churns
// faster than it can form, a worker that keeps failing at once): stop, saying so, rather than
// loop for ever (SessionOptions::no_progress_timeout).
void Session::count_change_without_progress() {
  ++changes_since_progress_;
  if (options_.no_progress_timeout.count() == 0) return;
  const auto idle = SteadyClock::now() - progress_at_;
  if (idle <= options_.no_progress_timeout) return;
  throw Error(
      make_error_code(errc::no_progress),
      "no step committed for " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(idle).count()) +
          " ms while the membership changed " + std::to_string(changes_since_progress_) +
          " times (KF_NO_PROGRESS_TIMEOUT_MS " +
          std::to_string(options_.no_progress_timeout.count()) + "): the job stops");
}

namespace {
// The message that asks the other workers for a boundary on change: its 8-byte number.
constexpr std::string_view kAsk = "kf.ask";
}  // namespace

// Boundaries on change: whether this step ends at one (docs/elastic.md, "Boundaries on change";
// the rule is detail::BoundaryAgreement). This worker's own reasons: the loop asked, its watch
// holds a newer cluster, joiners wait, the version broke (a peer lost), or the interval is up.
// In steady state this takes no hand-off to the peer's I/O thread: the requests that came and
// the version's state are counters the I/O thread keeps.
bool Session::boundary_due() {
  // In sma every worker takes the same steps between two averagings, and the averaging meets
  // everyone anyway: its steps are the boundaries, no request needed (a lost peer fails the
  // averaging's collective; other news waits for it).
  if (averaging_boundaries_) {
    const ModePlan plan = plan_step(*averaging_boundaries_, *steps_);
    return plan.average_gradients || plan.average_parameters;
  }
  if (agreement_version_ != peer_->version()) {
    agreement_->restart();
    agreement_version_ = peer_->version();
  }
  // Requests are rare: look for them (a hand-off to the I/O thread per peer) only when one came.
  if (!watching_asks_) {
    peer_->watch_arrivals(std::string(kAsk));
    watching_asks_ = true;
    seen_asks_ = ~std::uint64_t{0};
  }
  const std::uint64_t arrived = peer_->watched_arrivals();
  std::int64_t index = 0;
  for (int r = 0; r < peer_->size() && arrived != seen_asks_; ++r) {
    if (r == peer_->rank()) continue;
    try {
      while (peer_->try_receive(r, kAsk, buffer(&index, 1))) {
        agreement_->heard(static_cast<std::uint64_t>(index));
      }
    } catch (const Error& e) {
      if (e.code() != make_error_code(errc::protocol_error)) throw;
      // Not a request's size (the peer dropped it): a boundary more is never wrong.
      KF_LOG(warn, "session", "{} (rank {}, v{}): a malformed boundary request from rank {}: {}",
             peer_->endpoint().str(), peer_->rank(), peer_->version(), r, e.what());
      agreement_->heard(agreement_->passed_count() + 1);
    }
  }
  seen_asks_ = arrived;
  std::erase_if(asking_, [](Asking& a) {
    if (!a.handle.ready()) return false;
    a.handle.wait_status();  // one to a lost peer failed: the boundary's collective says so
    return true;
  });
  const std::uint64_t newest = link_ ? link_->version() : 0;
  const bool own = boundary_wanted_ || pending_.has_value() ||
                   (newest > peer_->version() && newest > refused_version_) ||
                   SteadyClock::now() - last_boundary_at_ >= options_.boundary_interval ||
                   peer_->version_broken();
  const auto verdict = agreement_->at_step_end(own);
  if (!verdict.take) return false;
  next_boundary_ = verdict.index;
  if (verdict.ask_others) {
    for (int r = 0; r < peer_->size(); ++r) {
      if (r == peer_->rank()) continue;
      auto payload = std::make_unique<std::int64_t>(static_cast<std::int64_t>(verdict.index));
      Handle h = peer_->send(r, kAsk, buffer(payload.get(), 1));
      asking_.push_back(Asking{std::move(h), std::move(payload)});
    }
  }
  return true;
}

bool Session::boundary_ahead() {
  if (!on_change_) return true;
  if (!ahead_) ahead_ = boundary_due();
  return *ahead_;
}

// A step without a boundary: this worker's own, counted and committed by it alone; the monitors'
// report goes on adding up until the next boundary.
Session::Outcome Session::local_step(SteadyClock::time_point t0) {
  ++*steps_;
  progress_at_ = t0;
  changes_since_progress_ = 0;
  if (*steps_ % options_.commit_every == 0) {
    ++*commits_;
    state_.commit();
  }
  count_step(t0);
  after_commit();
  return Outcome::committed;
}

Session::Outcome Session::end_step() {
  check_control_plane();
  const auto t0 = SteadyClock::now();
  const bool due = !on_change_ || (ahead_ ? *ahead_ : boundary_due());
  ahead_.reset();
  if (!due) {
    last_check_us_ = std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count();
    return local_step(t0);
  }
  const std::int64_t boundary_us = now_us();
  ++boundary_;
  const RecordLayout layout{monitor_ ? StepMonitor::kWords : 0, metric_values_.size()};
  // 1. pack
  std::string newest_json;
  std::int64_t newest_seen_us = 0;
  const auto mine = pack_record(layout, t0, &newest_json, &newest_seen_us);
  // 2. exchange
  std::vector<std::int64_t> all(static_cast<std::size_t>(peer_->size()) * layout.words());
  try {
    peer_->allgather("kf.ctl", buffer(mine.data(), mine.size()), buffer(all.data(), all.size()))
        .wait();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  const auto checked = SteadyClock::now();
  if (boundaries_version_ != peer_->version()) {
    boundaries_version_ = peer_->version();
    boundaries_in_version_ = 0;
  }
  ++boundaries_in_version_;
  if (on_change_) agreement_->passed(next_boundary_);
  boundary_wanted_ = false;
  last_boundary_at_ = checked;
  commit_step(all, layout, t0);
  const auto committed = SteadyClock::now();
  // 3. decide
  const auto records = detail::unpack(all, layout);
  const auto decision = detail::decide(
      detail::BoundaryView{peer_->cluster(), pending_ ? &*pending_ : nullptr, refused_version_},
      records);
  // 4. apply
  switch (decision.action) {
    case BoundaryDecision::Action::stay:
      last_check_us_ =
          std::chrono::duration<double, std::micro>(SteadyClock::now() - committed + (checked - t0))
              .count();
      return Outcome::committed;
    case BoundaryDecision::Action::wait_for_joiners: return Outcome::committed;
    case BoundaryDecision::Action::switch_to_pending: {
      Cluster target = std::move(*pending_);
      ChangeRecord rec = std::move(*pending_record_);
      rec.switch_us = boundary_us;
      pending_.reset();
      pending_record_.reset();
      return switch_to(target, std::move(rec));
    }
    case BoundaryDecision::Action::fetch_newer: break;
  }
  return take_newer(decision.root, decision.doc_bytes, newest_json, newest_seen_us, boundary_us);
}

// A newer cluster: the worker that holds it sends it to all, so everyone decides on the same
// document whatever its own watch has seen by now; then judge_newer() says what to do with it.
Session::Outcome Session::take_newer(int root, std::size_t doc_bytes, const std::string& own_json,
                                     std::int64_t seen_us, std::int64_t boundary_us) {
  const std::uint64_t current = peer_->version();
  std::string doc(doc_bytes, '\0');
  if (root == peer_->rank()) doc = own_json;
  CollOptions o;
  o.root = root;
  try {
    peer_
        ->broadcast("kf.ctl/doc", buffer(reinterpret_cast<std::uint8_t*>(doc.data()), doc.size()),
                    o)
        .wait();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  Cluster target = Cluster::from_json(parse_json(doc));
  if (link_) link_->offer(target);
  const ParsedSettings settings = parse_cluster_settings(target.settings);
  const NewerVerdict verdict = detail::judge_newer(target, settings.typed, peer_->cluster());
  if (verdict.action == NewerVerdict::Action::refuse) {
    if (refused_version_ != target.version) {
      KF_LOG(err, "session", "{} (rank {}, v{}): ignoring v{}: {}", peer_->endpoint().str(),
             peer_->rank(), current, target.version, verdict.reason);
    }
    refused_version_ = target.version;
    return Outcome::committed;
  }
  ChangeRecord rec;
  rec.kind = verdict.kind;
  rec.from_version = current;
  rec.from_size = peer_->size();
  rec.to_version = target.version;
  rec.to_size = target.size();
  rec.commit = *commits_;
  rec.detected_us = seen_us > 0 ? seen_us : boundary_us;
  rec.boundary_us = boundary_us;
  rec.agreed_us = now_us();
  pending_.reset();
  pending_record_.reset();
  if (verdict.action == NewerVerdict::Action::switch_now) return switch_to(target, std::move(rec));
  // Joiners first have to be reachable: invite them now and switch at the first boundary where
  // every survivor has reached every joiner, so that nobody waits here for a process to start.
  if (contains(target, peer_->endpoint())) invite_joiners(target, peer_->cluster(), false);
  KF_LOG(info, "session", "{} (rank {}, v{}): v{} adds workers; switching once they are reachable",
         peer_->endpoint().str(), peer_->rank(), current, target.version);
  pending_ = std::move(target);
  pending_record_ = std::move(rec);
  return Outcome::committed;
}

}  // namespace kf
