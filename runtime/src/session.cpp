// SPDX-License-Identifier: Apache-2.0
// kf::Session: construction from options or from a worker's environment, joining the job, the
// step loop's entry points and the end of the job. The step-boundary protocol of docs/elastic.md is
// spread over units named for what they hold:
//   session/step_boundary.cpp  pack -> exchange -> decide -> apply at the end of each step
//   session/boundary_rules.cpp the pure rules of that decision (unit-tested without sockets)
//   session/membership.cpp     forming, switching to and recovering into a cluster
//   session/policies.cpp       policies, settings and proposals
//   session/metrics.cpp        registered metrics, monitor reports and their export
//   session/gradients.cpp      gradient averaging
//   session/service_link.cpp   the config service: the cluster watch and posted events
// Every decision is taken from data all workers hold (the gathered control records, a broadcast
// cluster document, the config service's answer to a compare-and-swap), so every worker takes the
// same one.
#include "kf/runtime/session.hpp"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "config/worker_config.hpp"
#include "kf/common/env.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/jsonl_writer.hpp"
#include "kf/monitor/metrics.hpp"
#include "kf/monitor/metrics_server.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/job_file.hpp"
#include "session/boundary_rules.hpp"
#include "session/invitation.hpp"
#include "session/service_link.hpp"
#include "session/spares.hpp"
#include "session/support.hpp"

namespace kf {

using detail::contains;
using detail::is_peer_failure;
using detail::now_us;
using SteadyClock = std::chrono::steady_clock;

// ---- ChangeRecord -----------------------------------------------------------------------------

std::string ChangeRecord::summary() const {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "v%llu -> v%llu (%d -> %d workers, %s): detect %.1f ms, agree %.1f ms, "
                "joiners ready %.1f ms (training went on), connect %.1f ms, sync %.1f ms "
                "(%zu bytes), resume %.1f ms; pause %.1f ms",
                static_cast<unsigned long long>(from_version),
                static_cast<unsigned long long>(to_version), from_size, to_size, kind.c_str(),
                ms(detected_us, boundary_us), ms(boundary_us, agreed_us), ms(agreed_us, switch_us),
                ms(switch_us > 0 ? switch_us : agreed_us, connected_us),
                ms(connected_us, synced_us), sync_bytes, ms(synced_us, resumed_us),
                ms(switch_us > 0 ? switch_us : boundary_us, synced_us));
  std::string s = buf;
  if (!detail.empty()) s += "; " + detail;
  return s;
}

const char* to_string(Session::Outcome o) noexcept {
  switch (o) {
    case Session::Outcome::committed: return "committed";
    case Session::Outcome::rolled_back: return "rolled_back";
    case Session::Outcome::left: return "left";
  }
  return "?";
}

// ---- Session ----------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Peer> peer, Cluster initial, State& state, SessionOptions options)
    : peer_(std::move(peer)),
      initial_(std::move(initial)),
      state_(state),
      options_(std::move(options)),
      commits_(&state.counter("kf.commits")),
      steps_(&state.counter("kf.steps")) {
  if (options_.commit_every < 1) throw std::invalid_argument("Session: commit_every must be >= 1");
  if (!peer_) throw std::invalid_argument("Session: no peer");
  if (peer_->size() != 0) throw std::invalid_argument("Session: the peer was already started");
  if (!contains(initial_, peer_->endpoint()) && !initial_.is_spare(peer_->endpoint())) {
    throw std::invalid_argument("Session: this worker (" + peer_->endpoint().str() +
                                ") is not in its initial cluster (version " +
                                std::to_string(initial_.version) + ")");
  }
  spare_pusher_ = std::make_unique<detail::SparePusher>(options_.spare_sync);
  agreement_ = std::make_unique<detail::BoundaryAgreement>();
  greeter_ = std::make_unique<detail::SpareGreeter>();
  if (options_.config_server) {
    if (options_.job_token.empty()) {
      throw std::invalid_argument("Session: a config service needs the job token");
    }
    link_ = std::make_unique<detail::ServiceLink>(*options_.config_server, options_.job_token,
                                                  initial_, options_.watch_poll);
  }
  if (options_.monitors) monitor_ = std::make_unique<StepMonitor>(options_.monitor);
  if (options_.metrics_every < 1)
    throw std::invalid_argument("Session: metrics_every must be >= 1");
  if (options_.metrics_port || options_.metrics_jsonl) {
    registry_ = std::make_unique<monitor::MetricsRegistry>();
    register_metrics();
  }
  if (options_.metrics_port) {
    metrics_server_ = std::make_unique<monitor::MetricsServer>(
        *registry_, monitor::MetricsServerOptions{options_.metrics_host, *options_.metrics_port});
    KF_LOG(info, "session", "{}: metrics on http://{}/metrics", peer_->endpoint().str(),
           metrics_server_->address());
  }
}

std::unique_ptr<Session> Session::from_environment(State& state,
                                                   const nlohmann::json& default_settings) {
  const Env e = Env::from_environment();
  std::optional<JobFile> job;
  if (e.job_file) job = load_job_file(*e.job_file);
  detail::WorkerConfig config = detail::resolve_worker_config(e, job);
  config.session.default_settings = default_settings;
  for (const auto& error : config.settings_errors) {
    KF_LOG(err, "session", "{} (v{}): {}; ignoring it", e.self.str(), e.cluster.version, error);
  }
  auto peer = std::make_unique<Peer>(config.peer);
  auto session = std::make_unique<Session>(std::move(peer), std::move(config.cluster), state,
                                           std::move(config.session));
  if (job && !job->policies.empty()) {
    // The job file's policies, made from the built-ins and the plugins it names, run by the
    // session itself.
    PolicyRegistry registry;
    register_builtin_policies(registry);
    for (const auto& plugin : job->plugins) registry.load_plugin(plugin);
    auto runner = std::make_unique<PolicyRunner>();
    for (const auto& spec : job->policies) {
      try {
        runner->add(registry.make(spec.name, spec.params));
      } catch (const std::invalid_argument& err) {
        throw JobFileError(job->source, spec.line, "policies", err.what());
      }
    }
    session->owned_policies_ = std::move(runner);
    session->set_policies(session->owned_policies_.get());
  }
  return session;
}

Session::~Session() {
  // A request in flight reads its index until its frames are written.
  for (auto& a : asking_) a.handle.wait_status();
}

std::uint16_t Session::metrics_port() const noexcept {
  return metrics_server_ ? metrics_server_->port() : 0;
}

int Session::rank() const noexcept { return peer_->rank(); }
int Session::size() const noexcept { return peer_->size(); }
std::uint64_t Session::version() const noexcept { return peer_->version(); }

bool Session::join() {
  if (joined_) return true;
  const Endpoint self = peer_->endpoint();
  const auto deadline = SteadyClock::now() + options_.join_timeout;
  ChangeRecord rec;
  rec.kind = "join";
  rec.detected_us = rec.boundary_us = now_us();
  std::string last_error;
  detail::SnapshotAssembler snapshots;  // a spare's commits from rank 0
  bool was_spare = false;
  for (;;) {
    Cluster newest = initial_;
    if (link_ && link_->version() > newest.version) newest = link_->latest().cluster;
    const bool spare = !contains(newest, self) && newest.is_spare(self);
    if (!contains(newest, self) && !spare) {
      KF_LOG(info, "session", "{}: removed from the cluster (v{}) before it joined", self.str(),
             newest.version);
      return false;
    }
    if (spare && !was_spare) {
      KF_LOG(info, "session", "{}: a hot spare of v{}; waiting to be moved in", self.str(),
             newest.version);
    }
    if (spare) greeter_->greet(*peer_, newest.workers);
    was_spare = was_spare || spare;
    const ClusterSettings typed = parse_cluster_settings(newest.settings).typed;
    if (typed.finished) {
      KF_LOG(info, "session", "{}: the job finished (v{}) before this worker joined", self.str(),
             newest.version);
      return false;
    }
    if (typed.suspended) {
      KF_LOG(info, "session", "{}: the job is suspended (v{}); not joining", self.str(),
             newest.version);
      return false;
    }
    // The first worker of a cluster nobody has formed yet forms it. (Survivors of a running job
    // always come first in a cluster: kf-member appends joiners.)
    if (!spare && *newest.rank_of(self) == 0 && newest.version > attempted_version_) {
      try {
        if (options_.checkpoint_path && !state_.has_commit() &&
            std::filesystem::exists(*options_.checkpoint_path)) {
          state_.load(*options_.checkpoint_path);
          KF_LOG(info, "session", "{}: loaded checkpoint {} ({} commits)", self.str(),
                 *options_.checkpoint_path, *commits_);
        }
        rec.agreed_us = now_us();
        rec.to_version = newest.version;
        rec.to_size = newest.size();
        if (form(newest, nullptr, /*fresh=*/true, rec)) {
          finish_change(rec);
          return true;
        }
      } catch (const Error& e) {
        if (!is_peer_failure(e.code()) || !link_) throw;
        last_error = e.what();
        KF_LOG(warn, "session", "{}: forming cluster v{} failed: {}", self.str(), newest.version,
               e.what());
      }
    }
    const auto left = deadline - SteadyClock::now();
    // A spare waits as long as it is one; join_timeout counts for a worker invited to join.
    if (left <= SteadyClock::duration::zero() && !spare) {
      throw Error(make_error_code(errc::timeout),
                  "Session::join: " + self.str() + " was not invited into the job within " +
                      std::to_string(options_.join_timeout.count()) + " ms" +
                      (last_error.empty() ? "" : " (last failure: " + last_error + ")"));
    }
    auto inv =
        peer_->wait_invitation(spare ? std::chrono::milliseconds(100)
                                     : std::min<std::chrono::milliseconds>(
                                           std::chrono::milliseconds(100),
                                           std::chrono::ceil<std::chrono::milliseconds>(left)));
    if (!inv) continue;
    if (detail::is_spare_piece(inv->payload)) {
      take_spare_piece(snapshots, *inv);
      continue;
    }
    if (detail::is_spare_hello(inv->payload)) continue;
    Cluster target;
    try {
      target = detail::decode_invitation(inv->payload).cluster;
    } catch (const std::invalid_argument& e) {
      KF_LOG(warn, "session", "{}: ignored a malformed invitation from {}: {}", self.str(),
             inv->from.str(), e.what());
      continue;
    }
    if (target.version <= attempted_version_ || !contains(target, self)) continue;
    if (link_) link_->offer(target);
    rec.agreed_us = now_us();
    rec.to_version = target.version;
    rec.to_size = target.size();
    if (was_spare) {
      // Its wait as a spare is no part of the change: the change begins with the invitation.
      rec.detected_us = rec.boundary_us = rec.agreed_us;
      rec.detail = "a hot spare moved in, holding commit " + std::to_string(*commits_);
    }
    try {
      if (form(target, nullptr, /*fresh=*/false, rec)) {
        finish_change(rec);  // what rank 0 still sends it is dropped at its boundaries
        return true;
      }
    } catch (const Error& e) {
      if (!is_peer_failure(e.code())) throw;
      last_error = e.what();
      KF_LOG(warn, "session", "{}: joining cluster v{} failed: {}", self.str(), target.version,
             e.what());
    }
  }
}

// A piece of a commit that rank 0 sends a spare: a whole commit goes into the state at once.
void Session::take_spare_piece(detail::SnapshotAssembler& snapshots, const Invitation& inv) {
  try {
    if (!snapshots.add(inv.from, inv.payload)) return;
    const std::int64_t commit = snapshots.commit();
    const bool first = !state_.has_commit();
    state_.restore_snapshot(snapshots.take());
    if (first) {
      KF_LOG(info, "session", "{}: a hot spare holding commit {} from {}; more follow",
             peer_->endpoint().str(), commit, inv.from.str());
    } else {
      KF_LOG(debug, "session", "{}: holds commit {} from {}", peer_->endpoint().str(), commit,
             inv.from.str());
    }
  } catch (const std::exception& e) {  // malformed, or another layout: the state is unchanged
    KF_LOG(warn, "session", "{}: ignored a commit from {}: {}", peer_->endpoint().str(),
           inv.from.str(), e.what());
  }
}

Session::Outcome Session::step(const std::function<void()>& body) {
  if (!joined_) throw std::logic_error("Session::step: call join() first");
  ahead_.reset();
  try {
    body();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  return end_step();
}

void Session::finish() {
  if (!link_ || peer_->rank() != 0) return;
  try {
    ConfigClient client(link_->url(), link_->token());
    Cluster c = client.get_cluster();
    for (int attempt = 0; attempt < 20; ++attempt) {
      c.settings["finished"] = true;
      try {
        client.put_cluster(c);
        KF_LOG(info, "session", "{}: job finished after {} commits", peer_->endpoint().str(),
               *commits_);
        return;
      } catch (const ConflictError& e) {
        c = e.current();
      }
    }
  } catch (const std::exception& e) {
    KF_LOG(warn, "session", "{}: could not mark the job finished: {}", peer_->endpoint().str(),
           e.what());
  }
}

void Session::after_commit() {
  if (resuming_) {
    ChangeRecord rec = std::move(*resuming_);
    resuming_.reset();
    rec.resumed_us = now_us();
    finish_change(std::move(rec));
  }
  if (options_.checkpoint_path && options_.checkpoint_every > 0 && peer_->rank() == 0 &&
      *steps_ % options_.commit_every == 0 && *commits_ % options_.checkpoint_every == 0) {
    state_.save(*options_.checkpoint_path);
  }
  if (peer_->rank() == 0 && *steps_ % options_.commit_every == 0) {
    spare_pusher_->push(*peer_, state_, peer_->cluster(), *commits_);
  }
  if (!peer_->cluster().spares.empty()) greeter_->greet(*peer_, peer_->cluster().spares);
  // A member has no use for invitations (a spare's greeting, a late copy of a joiner's).
  while (peer_->wait_invitation(std::chrono::milliseconds(0))) {
  }
}

void Session::finish_change(ChangeRecord rec) {
  if (rec.to_version == 0) rec.to_version = peer_->version();
  if (rec.to_size == 0) rec.to_size = peer_->size();
  KF_LOG(info, "session", "{} (rank {}): {}", peer_->endpoint().str(), peer_->rank(),
         rec.summary());
  count_change(rec);
  if (link_ && rec.kind == "join") {
    link_->post("joined", peer_->endpoint().str(), rec.summary(), rec.to_version);
  } else if (link_ && peer_->rank() == 0) {
    link_->post("resized", "", rec.summary(), rec.to_version);
  }
  changes_.push_back(std::move(rec));
}

}  // namespace kf
