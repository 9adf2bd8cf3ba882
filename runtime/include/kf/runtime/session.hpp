// SPDX-License-Identifier: Apache-2.0
// kf::Session: one worker's membership in an elastic job, and the step-boundary protocol of
// docs/elastic.md ("The step boundary"). A training loop wraps each step in Session::step(); at the
// end of every step the workers run one small control collective (allgather of a 32-byte record:
// the newest cluster version each has seen, its commit count, and readiness of pending joiners), so
// they all see the same inputs and take the same decision:
//   - no change: the step's state is committed (State::commit) and training goes on;
//   - a newer cluster from the config service: every worker switches to it at the same step
//     (survivors keep their connections; leavers return Outcome::left and exit; joiners are
//     invited, and the switch happens at the first boundary after every joiner is reachable, so
//     survivors never wait for a process to start), and joiners receive the state from a survivor;
//   - a failure (a lost peer, a deadline, a failed switch): every survivor restores the last
//     commit, removes the lost workers from the cluster by compare-and-swap on the config service
//     (so there is only one successor cluster), and forms it; the state of the survivor with the
//     newest commit is synced to the others, so nothing committed is lost.
// With boundaries on change (settings "boundaries": "on-change", in pair-avg or async-ps) a step
// ends at a boundary only when a worker needs one: the others learn of it by a request message and
// take it at the end of their current step; every other step commits this worker's state locally
// and waits for nobody (docs/elastic.md, "Boundaries on change"). In sma (period above 1) the
// setting puts the boundaries at its averaging steps only. See docs/elastic.md for the
// protocol, its phases and timings, and how to write the loop.
//
// Ownership: the Session owns the Peer and its link to the config service (a kf::ClusterWatch and
// a thread that posts events); the State is the caller's and must outlive the session.
// Thread-safety: use a Session from one thread (the training loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/peer.hpp"
#include "kf/policies/policy.hpp"
#include "kf/policies/training_spec.hpp"
#include "kf/runtime/policy_runner.hpp"
#include "kf/runtime/state.hpp"
#include "kf/runtime/step_monitor.hpp"
#include "kf/runtime/stragglers.hpp"

namespace kf {

namespace monitor {
class MetricsRegistry;
class MetricsServer;
class JsonlWriter;
class Counter;
class Gauge;
class Histogram;
}  // namespace monitor

namespace detail {
class BoundaryAgreement;
class ServiceLink;
class SnapshotAssembler;
class SpareGreeter;
class SparePusher;
struct RecordLayout;
}  // namespace detail

struct SessionOptions {
  /// URL of the config service (KF_CONFIG_SERVER). Without one the job is static: it never
  /// changes membership, and a lost worker ends the job with an error on every survivor.
  std::optional<std::string> config_server;
  std::string job_token;  ///< presented on the config service's compare-and-swap writes
  /// Settings the job runs with where the cluster's settings lack the key, e.g. a program's
  /// {"mode": "sma:period=4"} from its command line (every worker must give the same ones).
  /// The cluster's settings, and so the config service and the policies, win over them.
  nlohmann::json default_settings = nlohmann::json::object();
  /// How long a worker waits for the running job to invite it (and a new job's rank 0 waits
  /// for the others to arrive) before join() fails.
  std::chrono::milliseconds join_timeout{std::chrono::minutes(10)};
  /// A joiner that the survivors' invitations have failed to reach for this long (its process
  /// died before the switch, or its host vanished with the agent that would report it) is
  /// removed from the cluster by the survivors, as a lost member is, and the job goes on
  /// without it. A joiner still starting up is not affected: an invitation waits up to the
  /// peer's connect timeout for it.
  std::chrono::milliseconds joiner_timeout{std::chrono::seconds(5)};
  /// How long a recovery waits for an unreachable config service before this worker stops with
  /// errc::service_unavailable (KF_SERVICE_TIMEOUT_MS). A worker cut off from the service cannot
  /// agree on a successor cluster; the workers that reach the service go on without it, so it
  /// stops instead of waiting for ever (never a second job beside theirs).
  std::chrono::milliseconds service_timeout{std::chrono::seconds(60)};
  /// The kfrun agent that started this worker (KF_AGENT_PID, set by `kfrun --watch`). A worker
  /// whose agent died trains on, for a restarted agent to adopt; but once that agent is gone
  /// (the worker's parent is another process) and the config service has been unreachable for
  /// `service_timeout` too, nothing can adopt it or change its job, and it stops at its next
  /// step boundary with errc::service_unavailable. While its agent lives, or its service
  /// answers, an outage of any length leaves training alone.
  std::optional<std::int64_t> agent_pid;
  /// A job whose membership keeps changing (failures, recoveries, joins that fail) without a
  /// step committed in between for this long stops: the recovery or change that finds it throws
  /// errc::no_progress on every worker, instead of looping for ever. Steps that merely take long
  /// do not count, nor does a change after a committed step. 0: never. KF_NO_PROGRESS_TIMEOUT_MS.
  std::chrono::milliseconds no_progress_timeout{std::chrono::minutes(10)};
  /// After a failure one survivor writes the successor cluster (the first worker of the failed
  /// version not lost); the others wait this long for its document to reach them through the
  /// config service's watch, then write it themselves (the first write wins). Only the cost of a
  /// double fault (the writer lost too, or cut off from the service) depends on it. 0: every
  /// survivor writes at once. KF_RECOVERY_WRITER_WAIT_MS.
  std::chrono::milliseconds recovery_writer_wait{250};
  /// A recovery whose successor holds joiners (a worker added just before the failure) waits
  /// this long for every survivor to reach them; joiners not reached by then (dead, or not
  /// started yet) are removed from the successor, so that a loss that meets an add settles in
  /// about one detection time instead of waiting on the joiners' connect timeout. A joiner
  /// reached in a normal join does not count against it. KF_RECOVERY_JOINER_WAIT_MS.
  std::chrono::milliseconds recovery_joiner_wait{100};
  /// Rank 0 sends the cluster's hot spares its last commit at most once per this interval, and
  /// only once the last copy was delivered and its copy on the training thread took at most a
  /// tenth of the time since it began (docs/elastic.md, "Hot spares"). 0: at every commit those
  /// allow. A job whose steps take longer than this keeps its spares at the latest commit; a
  /// faster one keeps them within about this interval, and a spare that moves in behind the
  /// survivors gets the state in the move's sync. KF_SPARE_SYNC_MS.
  std::chrono::milliseconds spare_sync{1000};
  /// In an elastic job, rank 0 posts the job's summary (the agreed step, speeds, GNS, batch,
  /// learning rate, the last change's phases) to the config service for its dashboard at most
  /// once per this interval, at a boundary. 0: never. KF_SUMMARY_INTERVAL_MS.
  std::chrono::milliseconds summary_interval{1000};
  /// With boundaries on change (settings "boundaries": "on-change" in pair-avg or async-ps), a
  /// worker asks for a boundary once this long has passed since the last one, so that the metrics,
  /// the straggler scores and the policies, which see the job at boundaries, stay current.
  /// KF_BOUNDARY_INTERVAL_MS.
  std::chrono::milliseconds boundary_interval{1000};
  /// Longest wait of one long-poll of the config service; also bounds how long the session's
  /// destructor waits for its watch thread.
  std::chrono::milliseconds watch_poll{500};
  /// When set, rank 0 writes the last commit there (State::save) every `checkpoint_every`
  /// commits, and a new job whose workers hold no state loads it before the first step.
  std::optional<std::string> checkpoint_path;
  std::int64_t checkpoint_every = 100;
  /// The state is committed (State::commit copies every registered buffer) at every
  /// `commit_every`-th step boundary; a failure rolls back to the last commit, so a larger value
  /// trades redone steps for less copying with large models. Membership is checked at every
  /// boundary regardless.
  std::int64_t commit_every = 1;
  /// Failed recovery attempts in a row before the session gives up with the last error.
  int max_recovery_attempts = 50;
  /// The built-in monitors (StepMonitor: step time, throughput, communication, gradient noise
  /// scale; docs/monitoring.md). Their StepMonitor::kWords words ride in every step's control
  /// collective. KF_MONITORS=0 turns them off; KF_GNS_THETA sets monitor.gns_theta.
  bool monitors = true;
  StepMonitorOptions monitor;
  /// When set, each worker serves its metrics for Prometheus on this port (0: the kernel picks
  /// one; see Session::metrics_port()) at metrics_host. KF_METRICS_PORT, KF_METRICS_HOST.
  std::optional<std::uint16_t> metrics_port;
  std::string metrics_host = "127.0.0.1";
  /// When set, rank 0 appends the metrics as one JSON line every `metrics_every` steps
  /// (monitor::JsonlWriter). KF_METRICS_JSONL, KF_METRICS_EVERY.
  std::optional<std::string> metrics_jsonl;
  std::int64_t metrics_every = 1;
};

/// One change of membership as this worker saw it. Times are wall-clock microseconds since the
/// Unix epoch (comparable across processes on one host); a phase that did not happen has
/// duration 0. Phases: detect (the change became known: the watch saw the new version, or a
/// collective failed) -> boundary (the step ended and the workers took it up) -> agree (all
/// workers decided on the same cluster) -> [joiners: training goes on at the old size until
/// every survivor has reached every joiner; switch_us is the boundary that applies it] ->
/// connect (every member of the new cluster took part in one collective) -> sync (joiners hold
/// the state) -> resume (the first step at the new size committed). The survivors' pause is
/// from switch_us (or agreed_us) to synced_us.
struct ChangeRecord {
  std::string
      kind;  ///< "join" (this worker joined), "resize", "settings" (same workers), "recovery"
  std::string detail;
  std::uint64_t from_version = 0, to_version = 0;
  int from_size = 0, to_size = 0;
  std::int64_t commit = 0;  ///< commits before the change took effect
  std::int64_t detected_us = 0, boundary_us = 0, agreed_us = 0, switch_us = 0, connected_us = 0,
               synced_us = 0, resumed_us = 0;
  std::size_t sync_bytes = 0;  ///< state bytes this worker sent or received (0 without a sync)

  double ms(std::int64_t from, std::int64_t to) const noexcept {
    return from > 0 && to >= from ? static_cast<double>(to - from) / 1000.0 : 0.0;
  }
  /// "v3 -> v4 (2 -> 3 workers, resize): detect 0.4 ms, agree 0.2 ms, ..." for the logs.
  std::string summary() const;
};

/// A proposal of the policies that this worker's session applied (Session::decisions).
struct PolicyDecision {
  std::int64_t step = 0;  ///< steps finished when it was made
  std::string hook;       ///< "after_step", "on_membership_change", ...
  Proposal proposal;
};

class Session {
 public:
  enum class Outcome {
    committed,    ///< the step is done on every worker and committed
    rolled_back,  ///< the step failed: the state is back at the last commit (re-read counters)
    left,         ///< this worker is no longer a member (revoked or removed), or the job is
                  ///< suspended (its checkpoint written): exit cleanly
  };

  /// `peer` must not be started yet; `initial` is the cluster this worker was started with
  /// (KF_CLUSTER). Creates State counters "kf.commits" and "kf.steps". Throws:
  /// std::invalid_argument when the peer is neither a member nor a spare of `initial`, or the
  /// peer was already started.
  Session(std::unique_ptr<Peer> peer, Cluster initial, State& state, SessionOptions options);
  /// The worker started by kfrun: peer, cluster, config service and token from the KF_*
  /// environment. With KF_JOB_FILE (kfrun --job) the job file gives the timeouts, commit_every,
  /// the checkpoint, the metrics JSON-lines file, and the policies (built-ins and plugins),
  /// which the session then runs itself (set_policies replaces them). Then KF_CHECKPOINT,
  /// KF_CHECKPOINT_EVERY, KF_MONITORS, KF_METRICS_PORT, KF_METRICS_HOST, KF_METRICS_JSONL and
  /// KF_METRICS_EVERY override. `default_settings` becomes SessionOptions::default_settings
  /// (a program's own defaults, e.g. its --mode). Throws: std::invalid_argument naming a bad
  /// variable; kf::JobFileError naming the file, line and key; std::runtime_error from a
  /// plugin; kf::Error.
  static std::unique_ptr<Session> from_environment(
      State& state, const nlohmann::json& default_settings = nlohmann::json::object());
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Joins the job: the first worker of a new job forms it and invites the others; every other
  /// worker waits for an invitation from the running job. Then the workers agree on the state
  /// (a survivor's, rank 0's for a new job, or the checkpoint) and State::sync() it.
  /// A hot spare (listed in the cluster's `spares`, docs/elastic.md) waits here while it is
  /// one, taking the commits rank 0 sends it into the state, until a loss or a notice moves it
  /// into the workers (then it joins holding the state the survivors hold) or it is removed.
  /// Returns false when this worker was removed from the cluster before it could join, or the
  /// job finished or is suspended (exit 0).
  /// Throws: kf::Error(errc::timeout) after join_timeout; std::runtime_error when the workers'
  /// state layouts differ.
  bool join();

  /// Runs `body` (one training step: its collectives must all be waited on before it returns),
  /// then the step boundary. A peer failure (kf::Error matching errcond::peer_failure, or
  /// errc::stale_version) thrown by `body` or met at the boundary is recovered from. Other
  /// exceptions propagate.
  Outcome step(const std::function<void()>& body);
  /// The step boundary alone, for loops that handle their own errors: call after the step's
  /// collectives have completed.
  Outcome end_step();
  void check_control_plane() const;
  void count_change_without_progress();
  /// Recovers from a failure of the current step (see the header comment); rethrows `error` in
  /// a static job. Returns rolled_back, or left when this worker was removed.
  Outcome recover(const std::exception& error);

  /// Ends the job after the last step: rank 0 marks the cluster finished on the config service
  /// (settings "finished": true), so that workers still waiting to join give up (join() returns
  /// false) and agents start no more workers. Best effort: a service that cannot be reached is
  /// logged. Does nothing in a static job.
  void finish();

  // ---- metrics and policies (docs/policies.md) ----

  /// Registers a per-step scalar (before join()); every worker registers the same names in the
  /// same order. Returns the slot for set_metric(). Throws: std::logic_error after join().
  int add_metric(const std::string& name);
  /// This worker's value of a metric for the current step (0 when not set); the boundary
  /// averages it over the workers.
  void set_metric(int slot, double value);
  /// The metrics of the last boundary, averaged over the workers (the same on every worker):
  /// the registered ones and, with the monitors on, those of StepMonitor.
  const std::map<std::string, double>& metrics() const noexcept { return metrics_; }

  /// Averages the gradient over the workers in place (allreduce sum, then × 1/size) and feeds
  /// the monitors: this worker's |g|² is taken before the allreduce, |ḡ|² in the same pass that
  /// divides the sum; the allreduce's time and bytes are the step's communication. Counts
  /// local_batch × micro_batches samples for the throughput unless report_samples() was called
  /// in this step. `grads` holds the mean over this worker's micro_batches micro-batch gradients
  /// (gradient accumulation: micro_batches > 1; then |g|² is of that mean, and the estimate is
  /// formed from K·1 gradients of local_batch × micro_batches samples each).
  /// Throws: kf::Error from the collective (a peer failure is recovered from by step()).
  void allreduce_gradients(std::span<float> grads, double local_batch);
  /// The same out of place: `local` is left as it is and `mean` receives the average. Here the
  /// squared norm of `local` is taken while the allreduce runs (it reads `local` too, so the
  /// pass costs no wall time when communication is the bottleneck).
  void allreduce_gradients(std::span<const float> local, std::span<float> mean, double local_batch);
  /// For a loop that exchanges gradients itself: this step's Σ|g_j|² over its micro_batches
  /// local gradients, |ḡ|² of the averaged gradient, and whether the local gradient was finite.
  void report_gradients(double local_sqnorm, double global_sqnorm, double local_batch,
                        int micro_batches = 1, bool finite = true);
  /// Samples this worker trained on in the current step (adds up within a step).
  void report_samples(double samples);
  /// Communication of the current step (adds up within a step).
  void report_comm(double seconds, double bytes);
  /// Time this worker spent computing in the current step, waits for others left out (adds up
  /// within a step; the LibTorch adapter reports the span from begin_step to step). With it and
  /// the samples, each boundary measures every worker's speed (samples per computed second, a
  /// moving average that restarts with each cluster version) for balanced batches.
  void report_compute(double seconds);
  /// This worker's part [first, first + count) of a step of `samples` samples, the same split
  /// on every worker: equal parts in rank order (as ElasticSampler::batch splits), or, with the
  /// settings' "balance" true and every worker's speed measured in this cluster version, parts
  /// proportional to the speeds (ElasticSampler::split), so that a slower worker takes fewer
  /// samples and nobody waits for it (docs/training-modes.md, "Stragglers").
  std::pair<std::size_t, std::size_t> batch_part(std::size_t samples) const;
  /// The speeds batch_part weighs by (samples/s per rank); empty while not every worker has one.
  std::vector<double> speeds() const;
  /// Every worker's straggler score as of the last boundary, in rank order (docs/monitoring.md,
  /// "Stragglers"): its speed over a window of boundaries against the fastest worker's and its
  /// own best, and whether it is slow. The same on every worker. A worker is scored once it has
  /// reported samples and compute time (report_compute) at a few boundaries; empty with the
  /// monitors off.
  const std::vector<StragglerScore>& straggler_scores() const noexcept {
    return stragglers_.scores();
  }
  /// The port of this worker's Prometheus endpoint; 0 when it serves none.
  std::uint16_t metrics_port() const noexcept;
  /// Policies to run: after_step at every boundary once the step is committed,
  /// on_membership_change after every switch. Their proposal is applied at a later boundary on
  /// every worker at once: a new cluster version written by rank 0 (compare-and-swap) holding
  /// all the changes together. In a static job, settings changes are applied at once on every
  /// worker (resize is not possible and is logged). `runner` must outlive the session.
  void set_policies(PolicyRunner* runner) noexcept { policies_ = runner; }
  /// Runs a hook the training loop drives (before_train, before_epoch, after_epoch) and applies
  /// its proposal the same way.
  Proposal run_hook(PolicyHook hook, std::int64_t epoch = -1);
  /// The inputs policies see now.
  PolicyInputs policy_inputs() const;
  /// True once a policy (or anyone, through settings "stop": true) asked the job to stop; every
  /// worker sees it at the same step.
  bool stop_requested() const noexcept { return settings_.value("stop", false); }

  Peer& peer() noexcept { return *peer_; }
  int rank() const noexcept;
  int size() const noexcept;
  std::uint64_t version() const noexcept;
  /// The settings of the current cluster version (batch_size, lr, algorithm, ...).
  const nlohmann::json& settings() const noexcept { return settings_; }
  /// The training mode of the current settings ("mode"; sync-sgd when absent), and the
  /// compression of what it sends ("compression"; none when absent). docs/training-modes.md.
  ModeSpec mode() const;
  CompressionSpec compression() const;
  /// Commits so far (State counter "kf.commits": steps every worker finished).
  std::int64_t commits() const noexcept { return *commits_; }
  const std::vector<ChangeRecord>& changes() const noexcept { return changes_; }
  /// The policies' proposals this worker applied, oldest first: the last kMaxDecisions. (In an
  /// elastic job rank 0 writes them to the config service and every worker takes them up with
  /// the version; every worker made the same proposal.)
  const std::deque<PolicyDecision>& decisions() const noexcept { return decisions_; }
  static constexpr std::size_t kMaxDecisions = 256;
  /// Steps finished on every worker (State counter "kf.steps"; commits happen every
  /// commit_every of them).
  std::int64_t steps() const noexcept { return *steps_; }
  /// Time the membership check (control collective and decision) took at the last boundary
  /// that changed nothing, in microseconds; the commit's copy is not included. With
  /// boundaries on change, a step without a boundary costs what deciding so took (the
  /// requests polled, the reasons checked).
  double last_check_us() const noexcept { return last_check_us_; }

  // ---- boundaries on change (docs/elastic.md) ----

  /// Whether steps end at a boundary only when something changes: settings "boundaries":
  /// "on-change" in the pair-avg, async-ps or sma (period above 1, where the boundaries are the
  /// averaging steps) mode (the same on every worker, from the same
  /// version). Then steps(), commits() and the State are this worker's own between boundaries: a
  /// step that ends without one is committed locally (every commit_every steps) and waits for
  /// nobody; the monitors' report covers every step since the last boundary; the policies run at
  /// boundaries only, and see rank 0's step count as the job's step.
  bool boundaries_on_change() const noexcept { return on_change_; }
  /// Asks for a boundary at the end of the current step (e.g. this worker ran out of samples):
  /// every worker takes it at the end of the step it is in when the request reaches it (in sma,
  /// at its next averaging step). With boundaries at every step it changes nothing.
  void request_boundary() noexcept { boundary_wanted_ = true; }
  /// Whether the step under way will end at a boundary, decided now (inside Session::step's
  /// body) on what this worker knows so far, and kept for the step's end: news that comes later
  /// waits for the next step. An exchange that must not wait for a worker already at the
  /// boundary asks (kf::ParameterServer). Always true with boundaries at every step.
  bool boundary_ahead();
  /// Boundaries passed in the current cluster version (0 right after a change): the same on
  /// every worker after each boundary, so (version(), boundaries_in_version()) names one.
  std::uint64_t boundaries_in_version() const noexcept {
    return boundaries_version_ == peer_->version() ? boundaries_in_version_ : 0;
  }

 private:
  Outcome form_after_failure(ChangeRecord rec);
  void take_spare_piece(detail::SnapshotAssembler& snapshots, const Invitation& inv);
  bool form(const Cluster& target, const Cluster* previous, bool fresh, ChangeRecord& rec);
  Outcome switch_to(const Cluster& target, ChangeRecord rec);
  /// `target` suspends the job (settings "suspended", written by an agent whose notice reached
  /// every worker): rank 0 writes the last commit to the checkpoint, and every worker leaves.
  Outcome suspend(const Cluster& target, ChangeRecord rec);
  /// The cluster without `lost`, written by compare-and-swap (runtime/src/session/membership.cpp).
  /// `edit_newer`: the edit may apply to a document newer than this worker's version (joiners
  /// of a pending version); otherwise a newer document is formed as it is.
  /// `why` is the detail of each removed worker's `failed` event, before "; removed by SELF".
  Cluster remove_lost(const std::vector<Endpoint>& lost, bool edit_newer = false,
                      const std::string& why = "lost by the job");
  void invite_joiners(const Cluster& target, const Cluster& previous, bool fresh);
  bool invites_delivered();
  bool joiners_reached_in_time();
  bool joiners_given_up() const;
  void drop_unreachable_joiners();
  void finish_change(ChangeRecord rec);
  void after_commit();
  void adopt_settings(const nlohmann::json& settings);
  /// `settings` with SessionOptions::default_settings for the keys it lacks.
  nlohmann::json with_defaults(const nlohmann::json& settings) const;
  void apply(const Proposal& proposal, const char* hook);
  void export_metrics();
  /// The exported series that are updated as things happen (steps, collectives, changes,
  /// policy decisions) rather than at boundaries; nothing without a registry.
  void register_metrics();
  void count_step(std::chrono::steady_clock::time_point now);
  void count_change(const ChangeRecord& rec);
  void count_decisions(const Proposal& proposal);
  /// Rank 0: the job's summary to the config service, when summary_interval has passed.
  void post_summary();
  // The step boundary (step_boundary.cpp): pack, commit the step, take a newer cluster.
  std::vector<std::int64_t> pack_record(const detail::RecordLayout& layout,
                                        std::chrono::steady_clock::time_point now,
                                        std::string* newest_json, std::int64_t* newest_seen_us);
  void commit_step(std::span<const std::int64_t> all, const detail::RecordLayout& layout,
                   std::chrono::steady_clock::time_point began);
  Outcome take_newer(int root, std::size_t doc_bytes, const std::string& own_json,
                     std::int64_t seen_us, std::int64_t boundary_us);
  void average_gradients(std::span<float> sum, double local_sqnorm,
                         std::chrono::steady_clock::time_point started, double local_batch);

  std::unique_ptr<Peer> peer_;
  Cluster initial_;
  State& state_;
  SessionOptions options_;
  std::unique_ptr<detail::ServiceLink> link_;  ///< the config service; null in a static job
  /// Rank 0 sends the last commit to the cluster's hot spares (session/spares.hpp).
  std::unique_ptr<detail::SparePusher> spare_pusher_;
  /// Opens the connections between the spares and this worker before a move-in needs them.
  std::unique_ptr<detail::SpareGreeter> greeter_;
  std::int64_t* commits_;
  std::int64_t* steps_;
  bool joined_ = false;
  std::uint64_t attempted_version_ = 0;  ///< newest version this worker tried to form
  /// The last version formed: its workers hold the job's state. A recovery invites every worker
  /// of its successor not in it (the peer's own cluster may be a version that failed to form,
  /// whose joiners never joined and must be invited again).
  Cluster formed_;
  // A change decided at a boundary that waits for its joiners to be reachable.
  std::optional<Cluster> pending_;
  std::optional<ChangeRecord> pending_record_;
  std::vector<Handle> invites_;
  std::vector<Endpoint> invitees_;  // whom invites_[i] invites
  std::uint64_t invited_version_ = 0;
  // Since when (us) invitations of the pending version have failed, and to whom; 0: they have
  // not.
  std::int64_t invites_failing_since_us_ = 0;
  std::vector<Endpoint> unreachable_;
  std::optional<ChangeRecord> resuming_;  ///< a change whose first step has not committed yet
  // The no-progress guard (SessionOptions::no_progress_timeout): the last committed step, and
  // the membership changes since.
  std::chrono::steady_clock::time_point progress_at_ = std::chrono::steady_clock::now();
  int changes_since_progress_ = 0;
  std::vector<ChangeRecord> changes_;
  std::deque<PolicyDecision> decisions_;
  double last_check_us_ = 0;
  std::uint64_t boundary_ = 0;
  std::uint64_t refused_version_ = 0;  ///< a version over max_workers, not switched to
  nlohmann::json settings_ = nlohmann::json::object();
  std::vector<std::string> metric_names_;
  std::vector<double> metric_values_;
  std::map<std::string, double> metrics_;
  PolicyRunner* policies_ = nullptr;
  std::unique_ptr<PolicyRunner> owned_policies_;  ///< the job file's (from_environment)
  // The built-in monitors: this step's report, and when the step began.
  std::unique_ptr<StepMonitor> monitor_;
  StepReport report_;
  bool samples_reported_ = false;
  // Every worker's speed, from the allgathered reports, in cluster version speeds_version_.
  std::vector<double> speeds_;
  std::uint64_t speeds_version_ = 0;
  void update_speeds(std::span<const std::int64_t> all, std::size_t stride, std::size_t offset);
  // Straggler scores, fed from the same reports at every boundary.
  StragglerTracker stragglers_;
  void track_stragglers(std::span<const std::int64_t> all, std::size_t stride, std::size_t offset);
  std::chrono::steady_clock::time_point step_began_{};
  std::unique_ptr<monitor::MetricsRegistry> registry_;
  // Series owned by registry_ (null without one).
  monitor::Counter* steps_total_ = nullptr;
  monitor::Counter* commits_total_ = nullptr;
  monitor::Counter* samples_total_ = nullptr;
  monitor::Counter* collective_bytes_total_ = nullptr;
  monitor::Histogram* step_seconds_ = nullptr;
  monitor::Histogram* collective_seconds_ = nullptr;
  std::chrono::steady_clock::time_point last_step_end_{};
  std::int64_t commits_counted_ = 0;
  monitor::Gauge* mode_info_ = nullptr;  // the kf_mode_info series set to 1
  bool mode_info_stale_ = true;          // the settings changed since it was set
  std::set<std::string> unexported_;     // metrics whose exported name another series holds
  std::chrono::steady_clock::time_point summary_at_{};  // the last summary posted
  std::unique_ptr<monitor::MetricsServer> metrics_server_;
  std::unique_ptr<monitor::JsonlWriter> metrics_jsonl_;
  std::int64_t epoch_ = -1;  ///< boundaries run (names the control collectives)
  // Boundaries on change (step_boundary.cpp).
  bool on_change_ = false;
  bool on_change_refused_ = false;  // asked for outside the asynchronous modes (logged once)
  std::optional<bool> ahead_;       // boundary_ahead()'s verdict for the step under way
  // On change in sma: its mode, whose averaging steps are the boundaries.
  std::optional<ModeSpec> averaging_boundaries_;
  std::int64_t job_step_ = 0;  // rank 0's steps as of the last boundary
  bool boundary_wanted_ = false;
  std::unique_ptr<detail::BoundaryAgreement> agreement_;
  std::uint64_t agreement_version_ = 0;
  std::uint64_t next_boundary_ = 0;  // the number of the boundary this step ends at
  bool watching_asks_ = false;
  std::uint64_t seen_asks_ = 0;  // Peer::watched_arrivals() when the requests were last taken
  std::uint64_t boundaries_in_version_ = 0, boundaries_version_ = 0;
  std::chrono::steady_clock::time_point last_boundary_at_ = std::chrono::steady_clock::now();
  struct Asking {
    Handle handle;
    std::unique_ptr<std::int64_t> index;  // the request's payload, until it is written
  };
  std::vector<Asking> asking_;
  /// Whether this step ends at a boundary; sends this worker's requests when it asks for one.
  bool boundary_due();
  /// A step that ends without a boundary: counted and committed by this worker alone.
  Outcome local_step(std::chrono::steady_clock::time_point t0);
};

/// "left" etc. for logs.
const char* to_string(Session::Outcome o) noexcept;

}  // namespace kf
