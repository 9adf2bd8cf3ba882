// SPDX-License-Identifier: Apache-2.0
// kf::Session's membership changes (docs/elastic.md): forming a cluster (invite the joiners, agree
// on whose state is newest and sync it), switching to a newer one decided at a boundary, and
// recovering from a failure (roll back, remove the lost workers by compare-and-swap, form the
// successor).
#include <algorithm>
#include <thread>

#include <nlohmann/json.hpp>

#include "kf/common/log.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/session.hpp"
#include "session/invitation.hpp"
#include "session/service_link.hpp"
#include "session/support.hpp"

namespace kf {

using detail::contains;
using detail::is_peer_failure;
using detail::join_endpoints;
using detail::modes_diverge;
using detail::now_us;
using SteadyClock = std::chrono::steady_clock;

// How often a survivor waiting for the writer's document looks whether the writer is lost too.
constexpr std::chrono::milliseconds kWriterCheck{5};

namespace {

std::string join_specs(const std::vector<WorkerSpec>& specs) {
  std::string s;
  for (const auto& w : specs) s += (s.empty() ? "" : ", ") + w.endpoint.str();
  return s;
}

}  // namespace

// Moves the peer to `target`, invites its joiners, agrees with every member on whose state is
// newest and syncs it to those behind. Returns true on success; throws kf::Error on a failure.
bool Session::form(const Cluster& target, const Cluster* previous, bool fresh, ChangeRecord& rec) {
  attempted_version_ = std::max(attempted_version_, target.version);
  if (peer_->size() == 0 || peer_->version() < target.version) peer_->update(target);
  if (fresh ? peer_->rank() == 0 : previous != nullptr) {
    invite_joiners(target, fresh ? Cluster{} : *previous, fresh);
  }
  if (rec.kind == "recovery" && !invites_.empty() && !joiners_reached_in_time()) return false;
  for (auto& h : invites_) h.wait();  // a joiner that cannot be reached fails the formation
  // Agreement: whose state is newest? (-1: this worker holds none.)
  std::int64_t mine = state_.has_commit() ? *commits_ : -1;
  std::vector<std::int64_t> all(static_cast<std::size_t>(peer_->size()));
  peer_->allgather("kf.join", buffer(&mine, 1), buffer(all.data(), all.size())).wait();
  rec.connected_us = now_us();
  const auto newest = std::max_element(all.begin(), all.end());
  const int root = static_cast<int>(newest - all.begin());
  // A new job (nobody holds state) takes rank 0's initial values, as Horovod's broadcast of the
  // initial parameters does.
  const bool behind = *newest < 0 || std::any_of(all.begin(), all.end(),
                                                 [&](std::int64_t c) { return c != *newest; });
  // In a mode whose models may differ between workers (before or after this change), the
  // workers at the newest commit need not hold the same model: every worker takes the root's,
  // so that the job goes on with one model (docs/training-modes.md, "Switching").
  const bool diverged = peer_->size() > 1 &&
                        (modes_diverge(settings_) || modes_diverge(with_defaults(target.settings)));
  if (behind || diverged) {
    state_.sync(*peer_, root);
    rec.sync_bytes = state_.bytes();
  } else if (!state_.has_commit()) {
    state_.commit();
  }
  rec.synced_us = now_us();
  formed_ = target;
  invites_.clear();
  invited_version_ = 0;
  // The monitors' throughput window measured the old cluster; a half-measured step is dropped.
  if (monitor_) monitor_->membership_changed();
  report_ = StepReport{};
  samples_reported_ = false;
  step_began_ = SteadyClock::now();
  const bool resized = joined_;
  joined_ = true;
  progress_at_ = SteadyClock::now();  // a job that formed has progressed
  adopt_settings(peer_->cluster().settings);
  if (resized && policies_ != nullptr && !policies_->empty()) {
    apply(policies_->run(PolicyHook::on_membership_change, policy_inputs()),
          "on_membership_change");
  }
  return true;
}

void Session::invite_joiners(const Cluster& target, const Cluster& previous, bool fresh) {
  if (invited_version_ == target.version) return;
  invites_.clear();
  invitees_.clear();
  const std::string payload = detail::encode_invitation(target, fresh);
  for (const auto& w : target.workers) {
    if (w.endpoint == peer_->endpoint() || contains(previous, w.endpoint)) continue;
    invites_.push_back(peer_->invite(w.endpoint, payload));
    invitees_.push_back(w.endpoint);
  }
  invited_version_ = target.version;
}

// In a recovery, the survivors cannot train on while joiners come up, and an invitation to a
// joiner that died (or has not started listening) retries until the connect timeout. So the
// joiners get recovery_joiner_wait; those not reached by then are removed from the document
// (compare-and-swap, as for lost workers), and the survivors form the version without them.
bool Session::joiners_reached_in_time() {
  const auto deadline = SteadyClock::now() + options_.recovery_joiner_wait;
  const auto all_ready = [&] {
    return std::all_of(invites_.begin(), invites_.end(), [](const Handle& h) { return h.ready(); });
  };
  // The handles have no timed wait: poll, first often (a joiner that listens is reached within
  // a few hundred microseconds: a hot spare, a joiner that came up before the failure), then
  // every kWriterCheck.
  std::chrono::microseconds nap{50};
  while (!all_ready() && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, kWriterCheck);
  }
  std::vector<Endpoint> late;
  for (std::size_t i = 0; i < invites_.size(); ++i) {
    if (!invites_[i].ready() || invites_[i].wait_status()) late.push_back(invitees_[i]);
  }
  if (late.empty()) return true;
  KF_LOG(warn, "session",
         "{} (v{}): joiners {} not reached within {} ms of a recovery; forming without them",
         peer_->endpoint().str(), peer_->version(), join_endpoints(late),
         options_.recovery_joiner_wait.count());
  invites_.clear();
  invitees_.clear();
  invited_version_ = 0;
  // The next attempt forms what the service holds.
  remove_lost(late, /*edit_newer=*/true,
              "a joiner not reached within " +
                  std::to_string(options_.recovery_joiner_wait.count()) + " ms of a recovery");
  return false;
}

bool Session::invites_delivered() {
  bool failed = false;
  for (std::size_t i = 0; i < invites_.size(); ++i) {
    Handle& h = invites_[i];
    if (!h.ready()) return false;
    if (h.wait_status()) {
      if (invites_failing_since_us_ == 0) {
        KF_LOG(warn, "session", "{}", h.message());
        invites_failing_since_us_ = now_us();
      }
      if (std::find(unreachable_.begin(), unreachable_.end(), invitees_[i]) == unreachable_.end()) {
        unreachable_.push_back(invitees_[i]);
      }
      failed = true;
    }
  }
  if (failed) {
    invited_version_ = 0;  // try again at the next boundary
    return false;
  }
  invites_failing_since_us_ = 0;
  unreachable_.clear();
  return true;
}

bool Session::joiners_given_up() const {
  return invites_failing_since_us_ > 0 &&
         now_us() - invites_failing_since_us_ >
             std::chrono::duration_cast<std::chrono::microseconds>(options_.joiner_timeout).count();
}

// Joiners that stayed unreachable past joiner_timeout: out of the document (compare-and-swap,
// the same edit from every survivor), so that the next boundary moves on to a version without
// them.
void Session::drop_unreachable_joiners() {
  KF_LOG(warn, "session", "{} (rank {}, v{}): joiners {} unreachable for over {} ms; removing them",
         peer_->endpoint().str(), peer_->rank(), peer_->version(), join_endpoints(unreachable_),
         options_.joiner_timeout.count());
  remove_lost(unreachable_, /*edit_newer=*/true);  // the joiners are in a newer version
  invites_failing_since_us_ = 0;
  unreachable_.clear();
}

Session::Outcome Session::switch_to(const Cluster& target, ChangeRecord rec) {
  count_change_without_progress();
  if (parse_cluster_settings(target.settings).typed.suspended) return suspend(target, rec);
  const Cluster previous = peer_->cluster();
  if (!contains(target, peer_->endpoint())) {
    rec.kind = "left";
    KF_LOG(info, "session", "{} (rank {}, v{}): not a member of v{}; leaving after {} commits",
           peer_->endpoint().str(), peer_->rank(), previous.version, target.version, *commits_);
    if (link_) {
      link_->post("left", peer_->endpoint().str(), "left at commit " + std::to_string(*commits_),
                  target.version);
    }
    changes_.push_back(rec);
    invites_.clear();
    return Outcome::left;
  }
  try {
    bool joiners = false;
    for (const auto& w : target.workers) joiners = joiners || !contains(previous, w.endpoint);
    if (joiners) {
      form(target, &previous, false, rec);
    } else {
      peer_->update(target);
      rec.connected_us = now_us();
      // A shrink or a mode switch in a mode whose models may differ: one model again, that of
      // the worker with the most commits, the lowest rank of those (rank 0 where the workers
      // step together; with boundaries on change, the one furthest on). Every worker takes this
      // branch at this boundary.
      if (peer_->size() > 1 &&
          (modes_diverge(settings_) || modes_diverge(with_defaults(target.settings)))) {
        std::int64_t mine = *commits_;
        std::vector<std::int64_t> all(static_cast<std::size_t>(peer_->size()));
        peer_->allgather("kf.newest", buffer(&mine, 1), buffer(all.data(), all.size())).wait();
        const auto root = static_cast<int>(std::max_element(all.begin(), all.end()) - all.begin());
        state_.sync(*peer_, root);
        rec.sync_bytes = state_.bytes();
      }
      rec.synced_us = now_us();
      adopt_settings(target.settings);
      if (target.size() != previous.size() && policies_ != nullptr && !policies_->empty()) {
        apply(policies_->run(PolicyHook::on_membership_change, policy_inputs()),
              "on_membership_change");
      }
    }
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  resuming_ = rec;
  return Outcome::committed;
}

// Every worker reaches this boundary with the same target (the version is agreed), so they all
// leave at the same commit, and rank 0's checkpoint holds it.
Session::Outcome Session::suspend(const Cluster& target, ChangeRecord rec) {
  rec.kind = "suspended";
  const std::string self = peer_->endpoint().str();
  std::string kept = "no checkpoint (KF_CHECKPOINT is not set): the job resumes from its start";
  if (options_.checkpoint_path && peer_->rank() == 0) {
    try {
      state_.save(*options_.checkpoint_path);
      kept = "checkpoint " + *options_.checkpoint_path + " written";
    } catch (const std::exception& e) {
      kept = "the checkpoint could not be written (" + std::string(e.what()) +
             "): the job resumes from its previous checkpoint";
      KF_LOG(err, "session", "{} (rank 0, v{}): {}", self, peer_->version(), kept);
    }
  } else if (options_.checkpoint_path) {
    kept = "rank 0 writes checkpoint " + *options_.checkpoint_path;
  }
  KF_LOG(info, "session", "{} (rank {}, v{}): the job is suspended (v{}) at commit {}; {}; leaving",
         self, peer_->rank(), peer_->version(), target.version, *commits_, kept);
  if (link_ && peer_->rank() == 0) {
    link_->post("suspended", self, "at commit " + std::to_string(*commits_) + ", " + kept,
                target.version);
  }
  changes_.push_back(rec);
  invites_.clear();
  return Outcome::left;
}

Session::Outcome Session::recover(const std::exception& error) {
  const auto* kf_error = dynamic_cast<const Error*>(&error);
  if (!link_) {
    KF_LOG(err, "session",
           "{} (rank {}, v{}): {}; a static job (no config service) cannot "
           "recover",
           peer_->endpoint().str(), peer_->rank(), peer_->version(), error.what());
    if (kf_error) throw *kf_error;
    throw std::runtime_error(error.what());
  }
  count_change_without_progress();
  ChangeRecord rec;
  rec.kind = "recovery";
  rec.detail = error.what();
  rec.from_version = peer_->version();
  rec.from_size = peer_->size();
  rec.commit = *commits_;
  rec.detected_us = rec.boundary_us = now_us();
  KF_LOG(warn, "session", "{} (rank {}, v{}): step failed: {}; rolling back to commit {}",
         peer_->endpoint().str(), peer_->rank(), peer_->version(), error.what(), *commits_);
  pending_.reset();
  pending_record_.reset();
  invites_.clear();
  invitees_.clear();
  invited_version_ = 0;
  invites_failing_since_us_ = 0;
  unreachable_.clear();
  return form_after_failure(std::move(rec));
}

Session::Outcome Session::form_after_failure(ChangeRecord rec) {
  std::string last;
  for (int attempt = 0; attempt < options_.max_recovery_attempts; ++attempt) {
    if (state_.has_commit()) state_.restore();
    const auto lost = peer_->lost_peers();
    Cluster target = remove_lost(lost);
    if (!contains(target, peer_->endpoint())) {
      return switch_to(target, std::move(rec));  // removed by the others: leave
    }
    rec.agreed_us = now_us();
    rec.to_version = target.version;
    rec.to_size = target.size();
    if (!lost.empty() && rec.detail.find("lost:") == std::string::npos) {
      rec.detail += " (lost: " + join_endpoints(lost) + ")";
    }
    const Cluster previous = formed_;
    const auto min_workers = parse_cluster_settings(target.settings).typed.min_workers;
    if (min_workers && target.size() < *min_workers) {
      KF_LOG(warn, "session", "{}: {} workers left, fewer than min_workers {}; going on",
             peer_->endpoint().str(), target.size(), *min_workers);
    }
    try {
      if (!form(target, &previous, false, rec)) continue;  // joiners removed: form what is newest
      resuming_ = rec;
      return Outcome::rolled_back;
    } catch (const Error& e) {
      if (!is_peer_failure(e.code())) throw;
      last = e.what();
      KF_LOG(warn, "session", "{}: recovery into v{} failed: {}; trying again",
             peer_->endpoint().str(), target.version, e.what());
    }
  }
  throw Error(make_error_code(errc::peer_lost), "Session: gave up after " +
                                                    std::to_string(options_.max_recovery_attempts) +
                                                    " failed recoveries; last: " + last);
}

// Writes "the cluster without `lost`" to the config service by compare-and-swap, re-reading on a
// conflict, and returns the document to form next: the stored one, or a newer one, which is
// formed as it is (unless `edit_newer`): the survivors that wrote it handled the failure. When
// nothing is to be removed (a silent timeout, a peer that moved on), the version is still moved
// past the current one, so that the survivors form a version none of them has used. Waits for the
// service while it is unreachable, up to SessionOptions::service_timeout.
Cluster Session::remove_lost(const std::vector<Endpoint>& lost, bool edit_newer,
                             const std::string& why) {
  // One survivor writes, the first worker of the failed version that this worker does not know
  // to be lost; the others take its document from the watch, so that a failure costs the
  // service one write, not one per survivor (on etcd, writes that come at once queue for its
  // disk). Survivors that lost different peers may pick different writers: both write, and the
  // first write wins, as it does when the writer does not write within recovery_writer_wait. A
  // writer found lost meanwhile (failures that overlap) passes the task to the next survivor.
  std::vector<Endpoint> gone = lost;
  if (!edit_newer && !gone.empty()) {
    const auto deadline = SteadyClock::now() + options_.recovery_writer_wait;
    for (;;) {
      const auto& workers = peer_->cluster().workers;
      const auto writer = std::find_if(workers.begin(), workers.end(), [&](const WorkerSpec& w) {
        return std::find(gone.begin(), gone.end(), w.endpoint) == gone.end();
      });
      if (writer == workers.end() || writer->endpoint == peer_->endpoint()) break;
      const auto now = SteadyClock::now();
      if (now >= deadline) {
        KF_LOG(warn, "session", "{}: no version after v{} from {} within {} ms; writing it",
               peer_->endpoint().str(), peer_->version(), writer->endpoint.str(),
               options_.recovery_writer_wait.count());
        break;
      }
      const auto slice = std::min<SteadyClock::duration>(deadline - now, kWriterCheck);
      if (link_->wait_newer(peer_->version(),
                            std::chrono::ceil<std::chrono::milliseconds>(slice))) {
        Cluster next = link_->latest().cluster;
        KF_LOG(info, "session",
               "{}: took v{} from the config service (the survivors' writer is {})",
               peer_->endpoint().str(), next.version, writer->endpoint.str());
        return next;
      }
      for (const auto& ep : peer_->lost_peers()) {
        if (std::find(gone.begin(), gone.end(), ep) == gone.end()) gone.push_back(ep);
      }
    }
  }
  ConfigClient client(link_->url(), link_->token());
  std::chrono::milliseconds backoff{50};
  bool said_down = false;
  SteadyClock::time_point down_since{};
  // A recovery edits the document this worker runs, without reading it first: when the service
  // has moved on, the compare-and-swap fails and answers with the current one, so a read would
  // only add a round trip to every recovery. Joiners to drop are in a newer version: read it.
  bool read_first = edit_newer;
  for (;;) {
    try {
      Cluster current = read_first ? client.get_cluster() : peer_->cluster();
      read_first = true;  // a retry after the service was unreachable reads
      for (;;) {
        Cluster next = current;
        std::erase_if(next.workers, [&](const WorkerSpec& w) {
          return std::find(gone.begin(), gone.end(), w.endpoint) != gone.end();
        });
        const bool removes = next.workers.size() != current.workers.size();
        // The others moved past the version this worker failed in. When they removed what this
        // worker lost (or removed this worker), they handled the failure, and this worker may be
        // the one that was cut off: form what they wrote, or leave. When the newer document
        // still lists the lost peers (a change nobody made for the failure, such as an add), it
        // is edited like the current one: forming it as it is could only fail again, on the
        // peers known lost.
        if (!edit_newer && current.version > peer_->version() &&
            (!removes || !contains(current, peer_->endpoint()) ||
             !std::all_of(gone.begin(), gone.end(),
                          [&](const Endpoint& ep) { return contains(current, ep); }))) {
          link_->offer(current);
          return current;
        }
        if (!removes && current.version > peer_->version()) {
          link_->offer(current);
          return current;
        }
        if (next.workers.empty()) return next;  // nobody left (not even this worker)
        // Hot spares take the places of the workers lost, in the same write.
        const auto promoted = promote_spares(next, current.workers.size() - next.workers.size());
        try {
          Cluster stored = client.put_cluster(next, &current);
          KF_LOG(info, "session", "{}: wrote v{} without {}{}", peer_->endpoint().str(),
                 stored.version, join_endpoints(gone),
                 promoted.empty() ? "" : ", moving in the spares " + join_specs(promoted));
          for (const auto& ep : gone) {
            if (contains(current, ep)) {
              link_->post("failed", ep.str(), why + "; removed by " + peer_->endpoint().str(),
                          stored.version);
            }
          }
          for (const auto& w : promoted) {
            link_->post("promoted", w.endpoint.str(),
                        "a hot spare, in place of " + join_endpoints(gone) + "; by " +
                            peer_->endpoint().str(),
                        stored.version);
          }
          link_->offer(stored);
          return stored;
        } catch (const ConflictError& e) {
          current = e.current();
        }
      }
    } catch (const ConflictError&) {
      throw;  // not reached: conflicts are handled above
    } catch (const Error& e) {
      if (e.code() != errc::service_unavailable) throw;
      if (!said_down) {
        KF_LOG(warn, "session",
               "{}: config service unreachable during recovery ({}); waiting up to {} ms",
               peer_->endpoint().str(), e.what(), options_.service_timeout.count());
        down_since = SteadyClock::now();
      }
      said_down = true;
      if (SteadyClock::now() - down_since > options_.service_timeout) {
        throw Error(make_error_code(errc::service_unavailable),
                    "Session: the config service was unreachable for " +
                        std::to_string(options_.service_timeout.count()) +
                        " ms during recovery: stopping this worker (the workers that reach the "
                        "service go on without it); last: " +
                        e.what());
      }
      std::this_thread::sleep_for(backoff);  // retry pacing while the service is down
      backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
    }
  }
}

}  // namespace kf
