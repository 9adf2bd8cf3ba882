// SPDX-License-Identifier: Apache-2.0
// The step-boundary protocol (docs/elastic.md). Every decision below is taken from data all
// workers hold (the gathered control records, a broadcast cluster document, the config service's
// answer to a compare-and-swap), so every worker takes the same one.
#include "kf/runtime/session.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "kf/common/env.hpp"
#include "kf/common/error.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/jsonl_writer.hpp"
#include "kf/monitor/metrics.hpp"
#include "kf/monitor/metrics_server.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/job_file.hpp"

namespace kf {

namespace {

using SteadyClock = std::chrono::steady_clock;

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Failures a session recovers from: a peer lost or silent, or a peer that moved to another
// cluster version (so this worker's collectives of the old one cannot finish).
bool is_peer_failure(const std::error_code& ec) {
  return ec == errcond::peer_failure || ec == errc::stale_version || ec == errc::closed;
}

bool contains(const Cluster& c, const Endpoint& ep) { return c.rank_of(ep).has_value(); }

std::string join_endpoints(const std::vector<Endpoint>& eps) {
  std::string s;
  for (const auto& e : eps) s += (s.empty() ? "" : ", ") + e.str();
  return s;
}

// The control record each worker contributes at a step boundary: these fields, then one word
// per registered metric (a double's bits).
constexpr std::size_t kRecordWords = 4;
enum RecordField : std::size_t {
  kVersionSeen = 0,   // newest cluster version this worker's watch holds
  kCommits = 1,       // its commit count
  kDocBytes = 2,      // size of that version's document (0 when not newer than the current one)
  kReadyVersion = 3,  // pending version whose joiners it has reached (0: none)
};

// A port on `host` that the kernel gave out just now and that `cluster` does not use (the
// worker that will listen on it is started by the agent on that host, moments later).
std::uint16_t free_port(const std::string& host, const Cluster& cluster) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(fd);
    if (!ok) break;
    const auto port = ntohs(a.sin_port);
    bool used = false;
    for (const auto& w : cluster.workers) used = used || (w.endpoint.host == host && w.endpoint.port == port);
    if (!used) return port;
  }
  throw std::runtime_error("cannot find a free port on " + host);
}

}  // namespace

// ---- the watch of the config service --------------------------------------------------------

// Long-polls the cluster document on a thread of its own and keeps the newest version, so that
// the step boundary reads it without a network round trip. Also posts audit events off the
// training thread.
class Session::Watch {
 public:
  struct Snapshot {
    Cluster cluster;
    std::string json;
    std::int64_t seen_us = 0;
  };

  Watch(const std::string& url, const std::string& token, const Cluster& initial,
        std::chrono::milliseconds poll)
      : url_(url), token_(token), poll_(poll) {
    latest_.cluster = initial;
    latest_.json = initial.to_json().dump();
    latest_.seen_us = now_us();
    version_.store(initial.version, std::memory_order_release);
    ConfigClient probe(url, token);  // validates the URL now (throws std::invalid_argument)
    thread_ = std::thread([this] { run(); });
    poster_ = std::thread([this] { post_loop(); });
  }

  ~Watch() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    poster_.join();
  }

  std::uint64_t version() const noexcept { return version_.load(std::memory_order_acquire); }

  Snapshot latest() const {
    std::lock_guard<std::mutex> lk(mu_);
    return latest_;
  }

  /// Takes a document this worker learnt otherwise (from a compare-and-swap answer).
  void offer(const Cluster& c) {
    std::lock_guard<std::mutex> lk(mu_);
    if (c.version <= latest_.cluster.version) return;
    latest_ = Snapshot{c, c.to_json().dump(), now_us()};
    version_.store(c.version, std::memory_order_release);
  }

  /// Queues an audit event; the poster thread sends it (best effort, logged on failure).
  void post(std::string type, std::string worker, std::string detail, std::uint64_t version) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      events_.push_back({std::move(type), std::move(worker), std::move(detail), version});
    }
    cv_.notify_all();
  }

  /// Queues a write to the config service for the poster thread, unless one with the same key
  /// is still queued (a proposal made again at the next step while the first is on its way).
  /// Work that fails is logged; the policy proposes again while it still wants the change.
  void submit(std::string key, std::function<void(ConfigClient&)> work) {
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

  const std::string& url() const noexcept { return url_; }
  const std::string& token() const noexcept { return token_; }

 private:
  struct Event {
    std::string type, worker, detail;
    std::uint64_t version = 0;
    std::string key;                               // for submitted work: its identity
    std::function<void(ConfigClient&)> work;       // submitted work instead of an event
  };

  void run() {
    ConfigClient client(url_, token_);
    std::chrono::milliseconds backoff{50};
    bool down = false;
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_) return;
      }
      try {
        Cluster c = client.watch(version(), poll_);
        if (down) KF_LOG(info, "session", "config service {} is back", url_);
        down = false;
        backoff = std::chrono::milliseconds{50};
        offer(c);
      } catch (const std::exception& e) {
        if (!down) {
          KF_LOG(warn, "session",
                 "config service {} unreachable ({}); training goes on with cluster v{}", url_,
                 e.what(), version());
        }
        down = true;
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, backoff, [&] { return stop_; });
        backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
      }
    }
  }

  void post_loop() {
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

  const std::string url_;
  const std::string token_;
  const std::chrono::milliseconds poll_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Snapshot latest_;
  std::atomic<std::uint64_t> version_{0};
  std::deque<Event> events_;
  std::thread thread_;
  std::thread poster_;
};

// ---- ChangeRecord -----------------------------------------------------------------------------

std::string ChangeRecord::summary() const {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "v%llu -> v%llu (%d -> %d workers, %s): detect %.1f ms, agree %.1f ms, "
                "joiners ready %.1f ms (training went on), connect %.1f ms, sync %.1f ms "
                "(%zu bytes), resume %.1f ms; pause %.1f ms",
                static_cast<unsigned long long>(from_version),
                static_cast<unsigned long long>(to_version), from_size, to_size, kind.c_str(),
                ms(detected_us, boundary_us), ms(boundary_us, agreed_us),
                ms(agreed_us, switch_us), ms(switch_us > 0 ? switch_us : agreed_us, connected_us),
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

Session::Session(std::unique_ptr<Peer> peer, Cluster initial, State& state,
                 SessionOptions options)
    : peer_(std::move(peer)), initial_(std::move(initial)), state_(state),
      options_(std::move(options)), commits_(&state.counter("kf.commits")),
      steps_(&state.counter("kf.steps")) {
  if (options_.commit_every < 1) throw std::invalid_argument("Session: commit_every must be >= 1");
  if (!peer_) throw std::invalid_argument("Session: no peer");
  if (peer_->size() != 0) throw std::invalid_argument("Session: the peer was already started");
  if (!contains(initial_, peer_->endpoint())) {
    throw std::invalid_argument("Session: this worker (" + peer_->endpoint().str() +
                                ") is not in its initial cluster (version " +
                                std::to_string(initial_.version) + ")");
  }
  if (options_.config_server) {
    if (options_.job_token.empty()) {
      throw std::invalid_argument("Session: a config service needs the job token");
    }
    watch_ = std::make_unique<Watch>(*options_.config_server, options_.job_token, initial_,
                                     options_.watch_poll);
  }
  if (options_.monitors) monitor_ = std::make_unique<StepMonitor>(options_.monitor);
  if (options_.metrics_every < 1) throw std::invalid_argument("Session: metrics_every must be >= 1");
  if (options_.metrics_port || options_.metrics_jsonl) {
    registry_ = std::make_unique<monitor::MetricsRegistry>();
  }
  if (options_.metrics_port) {
    metrics_server_ = std::make_unique<monitor::MetricsServer>(
        *registry_, monitor::MetricsServerOptions{options_.metrics_host, *options_.metrics_port});
    KF_LOG(info, "session", "{}: metrics on http://{}/metrics", peer_->endpoint().str(),
           metrics_server_->address());
  }
}

namespace {

// The integer value of environment variable `name` in [lo, hi], or nothing when it is unset.
std::optional<std::int64_t> env_integer(const char* name, std::int64_t lo, std::int64_t hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(v, v + std::strlen(v), n);
  if (ec != std::errc() || *end != '\0' || n < lo || n > hi) {
    throw std::invalid_argument(std::string(name) + "='" + v + "' must be an integer in " +
                                std::to_string(lo) + ".." + std::to_string(hi));
  }
  return n;
}

}  // namespace

std::unique_ptr<Session> Session::from_environment(State& state) {
  const Env e = Env::from_environment();
  PeerOptions peer_options = Peer::options_from(e);
  SessionOptions o;
  // The job file (kfrun --job) first; the KF_* variables below override it.
  std::optional<JobFile> job;
  if (const char* path = std::getenv(env::kJobFile); path && *path) {
    job = load_job_file(path);
    if (!std::getenv(env::kTimeoutMs)) peer_options.timeout = job->timeouts.collective;
    if (!std::getenv(env::kHeartbeatMs)) peer_options.heartbeat_timeout = job->timeouts.heartbeat;
    peer_options.connect_timeout = job->timeouts.connect;
    o.commit_every = job->commit_every;
    if (job->checkpoint) {
      o.checkpoint_path = job->checkpoint->path;
      o.checkpoint_every = job->checkpoint->every;
    }
    if (job->metrics && job->metrics->jsonl) o.metrics_jsonl = job->metrics->jsonl;
  }
  auto peer = std::make_unique<Peer>(peer_options);
  o.config_server = e.config_server;
  o.job_token = e.job_token;
  if (const char* path = std::getenv(env::kCheckpoint); path && *path) o.checkpoint_path = path;
  if (auto n = env_integer(env::kCheckpointEvery, 1, std::numeric_limits<std::int64_t>::max())) {
    o.checkpoint_every = *n;
  }
  if (auto n = env_integer(env::kMonitors, 0, 1)) o.monitors = *n == 1;
  if (const char* theta = std::getenv(env::kGnsTheta); theta && *theta) {
    char* end = nullptr;
    const double t = std::strtod(theta, &end);
    if (end == theta || *end != '\0' || !(t > 0.0 && t < 1.0)) {
      throw std::invalid_argument(std::string(env::kGnsTheta) + "='" + theta +
                                  "' must be a number in (0, 1)");
    }
    o.monitor.gns_theta = t;
  }
  if (auto n = env_integer(env::kMetricsPort, 0, 65535)) {
    o.metrics_port = static_cast<std::uint16_t>(*n);
  }
  if (const char* host = std::getenv(env::kMetricsHost); host && *host) o.metrics_host = host;
  if (const char* path = std::getenv(env::kMetricsJsonl); path && *path) o.metrics_jsonl = path;
  if (auto n = env_integer(env::kMetricsEvery, 1, std::numeric_limits<std::int64_t>::max())) {
    o.metrics_every = *n;
  }
  auto session = std::make_unique<Session>(std::move(peer), e.cluster, state, std::move(o));
  if (job && (!job->policies.empty())) {
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

Session::~Session() = default;

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
  for (;;) {
    Cluster newest = initial_;
    if (watch_ && watch_->version() > newest.version) newest = watch_->latest().cluster;
    if (!contains(newest, self)) {
      KF_LOG(info, "session", "{}: removed from the cluster (v{}) before it joined", self.str(),
             newest.version);
      return false;
    }
    if (newest.settings.value("finished", false)) {
      KF_LOG(info, "session", "{}: the job finished (v{}) before this worker joined", self.str(),
             newest.version);
      return false;
    }
    // The first worker of a cluster nobody has formed yet forms it. (Survivors of a running job
    // always come first in a cluster: kf-member appends joiners.)
    if (*newest.rank_of(self) == 0 && newest.version > attempted_version_) {
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
        if (!is_peer_failure(e.code()) || !watch_) throw;
        last_error = e.what();
        KF_LOG(warn, "session", "{}: forming cluster v{} failed: {}", self.str(),
               newest.version, e.what());
      }
    }
    const auto left = deadline - SteadyClock::now();
    if (left <= SteadyClock::duration::zero()) {
      throw Error(make_error_code(errc::timeout),
                  "Session::join: " + self.str() + " was not invited into the job within " +
                      std::to_string(options_.join_timeout.count()) + " ms" +
                      (last_error.empty() ? "" : " (last failure: " + last_error + ")"));
    }
    auto inv = peer_->wait_invitation(std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(100),
        std::chrono::ceil<std::chrono::milliseconds>(left)));
    if (!inv) continue;
    Cluster target;
    try {
      const auto doc = nlohmann::json::parse(inv->payload);
      target = Cluster::from_json(doc.at("cluster"));
    } catch (const std::exception& e) {
      KF_LOG(warn, "session", "{}: ignored a malformed invitation from {}: {}", self.str(),
             inv->from.str(), e.what());
      continue;
    }
    if (target.version <= attempted_version_ || !contains(target, self)) continue;
    if (watch_) watch_->offer(target);
    rec.agreed_us = now_us();
    rec.to_version = target.version;
    rec.to_size = target.size();
    try {
      if (form(target, nullptr, /*fresh=*/false, rec)) {
        finish_change(rec);
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

// Moves the peer to `target`, invites its joiners, agrees with every member on whose state is
// newest and syncs it to those behind. Returns true on success; throws kf::Error on a failure.
bool Session::form(const Cluster& target, const Cluster* previous, bool fresh,
                   ChangeRecord& rec) {
  attempted_version_ = std::max(attempted_version_, target.version);
  if (peer_->size() == 0 || peer_->version() < target.version) peer_->update(target);
  if (fresh ? peer_->rank() == 0 : previous != nullptr) {
    invite_joiners(target, fresh ? Cluster{} : *previous, fresh);
  }
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
  if (behind) {
    state_.sync(*peer_, root);
    rec.sync_bytes = state_.bytes();
  } else if (!state_.has_commit()) {
    state_.commit();
  }
  rec.synced_us = now_us();
  invites_.clear();
  invited_version_ = 0;
  // The monitors' throughput window measured the old cluster; a half-measured step is dropped.
  if (monitor_) monitor_->membership_changed();
  report_ = StepReport{};
  samples_reported_ = false;
  step_began_ = SteadyClock::now();
  const bool resized = joined_;
  joined_ = true;
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
  nlohmann::json doc = {{"cluster", target.to_json()}, {"fresh", fresh}};
  const std::string payload = doc.dump();
  for (const auto& w : target.workers) {
    if (w.endpoint == peer_->endpoint() || contains(previous, w.endpoint)) continue;
    invites_.push_back(peer_->invite(w.endpoint, payload));
  }
  invited_version_ = target.version;
}

bool Session::invites_delivered() {
  for (auto& h : invites_) {
    if (!h.ready()) return false;
    if (h.wait_status()) {
      KF_LOG(warn, "session", "{}", h.message());
      invited_version_ = 0;  // try again at the next boundary
      return false;
    }
  }
  return true;
}

Session::Outcome Session::step(const std::function<void()>& body) {
  if (!joined_) throw std::logic_error("Session::step: call join() first");
  try {
    body();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  return end_step();
}

Session::Outcome Session::end_step() {
  const auto t0 = SteadyClock::now();
  const std::int64_t boundary_us = now_us();
  ++boundary_;
  const std::uint64_t current = peer_->version();
  // Record: the fixed fields, the monitors' words, then the registered metrics.
  const std::size_t monitor_words = monitor_ ? StepMonitor::kWords : 0;
  const std::size_t user_at = kRecordWords + monitor_words;
  const std::size_t words = user_at + metric_values_.size();
  std::vector<std::int64_t> mine(words, 0);
  mine[kVersionSeen] = static_cast<std::int64_t>(current);
  mine[kCommits] = *commits_;
  if (monitor_) {
    report_.step_time = std::chrono::duration<double>(t0 - step_began_).count();
    StepMonitor::pack(report_, std::span<std::int64_t>(mine).subspan(kRecordWords, monitor_words));
  }
  for (std::size_t i = 0; i < metric_values_.size(); ++i) {
    mine[user_at + i] = std::bit_cast<std::int64_t>(metric_values_[i]);
  }
  Watch::Snapshot newest;
  if (watch_ && watch_->version() > current) {
    newest = watch_->latest();
    mine[kVersionSeen] = static_cast<std::int64_t>(newest.cluster.version);
    mine[kDocBytes] = static_cast<std::int64_t>(newest.json.size());
  }
  if (pending_ && invited_version_ == pending_->version && invites_delivered()) {
    mine[kReadyVersion] = static_cast<std::int64_t>(pending_->version);
  } else if (pending_ && invited_version_ != pending_->version &&
             contains(*pending_, peer_->endpoint())) {
    invite_joiners(*pending_, peer_->cluster(), false);  // a failed invitation: try again
  }
  const auto p = static_cast<std::size_t>(peer_->size());
  std::vector<std::int64_t> all(p * words);
  try {
    peer_->allgather("kf.ctl", buffer(mine.data(), words), buffer(all.data(), all.size()))
        .wait();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  const auto checked = SteadyClock::now();
  // Every worker finished the step.
  ++*steps_;
  if (*steps_ % options_.commit_every == 0) {
    ++*commits_;
    state_.commit();
  }
  after_commit();
  // The step's metrics, averaged in rank order: the same bits on every worker.
  for (std::size_t i = 0; i < metric_names_.size(); ++i) {
    double sum = 0;
    for (std::size_t r = 0; r < p; ++r) {
      sum += std::bit_cast<double>(all[r * words + user_at + i]);
    }
    metrics_[metric_names_[i]] = sum / static_cast<double>(p);
  }
  std::fill(metric_values_.begin(), metric_values_.end(), 0.0);
  if (monitor_) {
    if (auto said = monitor_->update(all, words, kRecordWords, peer_->size(), metrics_)) {
      KF_LOG(info, "monitor", "{} (rank {}): {}", peer_->endpoint().str(), peer_->rank(), *said);
    }
    report_ = StepReport{};
    samples_reported_ = false;
  }
  step_began_ = t0;
  if (registry_) export_metrics();
  const auto committed = SteadyClock::now();
  if (policies_ != nullptr && !policies_->empty()) {
    apply(policies_->run(PolicyHook::after_step, policy_inputs()), "after_step");
  }

  std::int64_t vmax = 0;
  std::size_t root = 0;
  for (std::size_t r = 0; r < p; ++r) {
    if (all[r * words + kVersionSeen] > vmax) {
      vmax = all[r * words + kVersionSeen];
      root = r;
    }
  }
  // A pending change whose joiners every survivor has reached is applied now.
  if (pending_ && static_cast<std::uint64_t>(vmax) <= pending_->version) {
    bool ready = true;
    for (const auto& w : pending_->workers) {
      auto r = peer_->cluster().rank_of(w.endpoint);
      if (r && all[static_cast<std::size_t>(*r) * words + kReadyVersion] !=
                   static_cast<std::int64_t>(pending_->version)) {
        ready = false;
      }
    }
    if (!ready) return Outcome::committed;
    Cluster target = std::move(*pending_);
    ChangeRecord rec = std::move(*pending_record_);
    rec.switch_us = boundary_us;
    pending_.reset();
    pending_record_.reset();
    return switch_to(target, std::move(rec));
  }
  if (static_cast<std::uint64_t>(vmax) <= current ||
      static_cast<std::uint64_t>(vmax) == refused_version_) {
    last_check_us_ = std::chrono::duration<double, std::micro>(SteadyClock::now() - committed +
                                                               (checked - t0))
                         .count();
    return Outcome::committed;
  }
  // A newer cluster: the worker that holds it sends it to all, so everyone decides on the same
  // document whatever its own watch has seen by now.
  std::string doc(static_cast<std::size_t>(all[root * words + kDocBytes]), '\0');
  if (static_cast<int>(root) == peer_->rank()) doc = newest.json;
  CollOptions o;
  o.root = static_cast<int>(root);
  try {
    peer_->broadcast("kf.ctl/doc",
                     buffer(reinterpret_cast<std::uint8_t*>(doc.data()), doc.size()), o)
        .wait();
  } catch (const Error& e) {
    if (!is_peer_failure(e.code())) throw;
    return recover(e);
  }
  Cluster target = Cluster::from_json(nlohmann::json::parse(doc));
  if (watch_) watch_->offer(target);
  // Bounds from the job settings (kf-member checks them too; any writer may not).
  const auto max_workers = target.settings.value("max_workers", std::int64_t{0});
  if (max_workers > 0 && target.size() > max_workers) {
    if (refused_version_ != target.version) {
      KF_LOG(err, "session", "{} (rank {}, v{}): ignoring v{}: {} workers exceed max_workers {}",
             peer_->endpoint().str(), peer_->rank(), current, target.version, target.size(),
             max_workers);
    }
    refused_version_ = target.version;
    return Outcome::committed;
  }
  ChangeRecord rec;
  // The same workers with other settings (a policy's batch size, say) is a "settings" change.
  rec.kind = target.workers == peer_->cluster().workers ? "settings" : "resize";
  rec.from_version = current;
  rec.from_size = peer_->size();
  rec.to_version = target.version;
  rec.to_size = target.size();
  rec.commit = *commits_;
  rec.detected_us = newest.seen_us > 0 ? newest.seen_us : boundary_us;
  rec.boundary_us = boundary_us;
  rec.agreed_us = now_us();
  bool joiners = false;
  for (const auto& w : target.workers) joiners = joiners || !contains(peer_->cluster(), w.endpoint);
  pending_.reset();
  pending_record_.reset();
  if (!joiners) return switch_to(target, std::move(rec));
  // Joiners first have to be reachable: invite them now and switch at the first boundary where
  // every survivor has reached every joiner, so that nobody waits here for a process to start.
  if (contains(target, peer_->endpoint())) invite_joiners(target, peer_->cluster(), false);
  KF_LOG(info, "session", "{} (rank {}, v{}): v{} adds workers; switching once they are reachable",
         peer_->endpoint().str(), peer_->rank(), current, target.version);
  pending_ = std::move(target);
  pending_record_ = std::move(rec);
  return Outcome::committed;
}

Session::Outcome Session::switch_to(const Cluster& target, ChangeRecord rec) {
  const Cluster previous = peer_->cluster();
  if (!contains(target, peer_->endpoint())) {
    rec.kind = "left";
    KF_LOG(info, "session", "{} (rank {}, v{}): not a member of v{}; leaving after {} commits",
           peer_->endpoint().str(), peer_->rank(), previous.version, target.version, *commits_);
    if (watch_) {
      watch_->post("left", peer_->endpoint().str(),
                   "left at commit " + std::to_string(*commits_), target.version);
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
      rec.connected_us = rec.synced_us = now_us();
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

Session::Outcome Session::recover(const std::exception& error) {
  const auto* kf_error = dynamic_cast<const Error*>(&error);
  if (!watch_) {
    KF_LOG(err, "session", "{} (rank {}, v{}): {}; a static job (no config service) cannot "
           "recover", peer_->endpoint().str(), peer_->rank(), peer_->version(), error.what());
    if (kf_error) throw *kf_error;
    throw std::runtime_error(error.what());
  }
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
  invited_version_ = 0;
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
    const Cluster previous = peer_->cluster();
    const auto min_workers = target.settings.value("min_workers", std::int64_t{0});
    if (target.size() < min_workers) {
      KF_LOG(warn, "session", "{}: {} workers left, fewer than min_workers {}; going on",
             peer_->endpoint().str(), target.size(), min_workers);
    }
    try {
      form(target, &previous, false, rec);
      resuming_ = rec;
      return Outcome::rolled_back;
    } catch (const Error& e) {
      if (!is_peer_failure(e.code())) throw;
      last = e.what();
      KF_LOG(warn, "session", "{}: recovery into v{} failed: {}; trying again",
             peer_->endpoint().str(), target.version, e.what());
    }
  }
  throw Error(make_error_code(errc::peer_lost),
              "Session: gave up after " + std::to_string(options_.max_recovery_attempts) +
                  " failed recoveries; last: " + last);
}

// Writes "the cluster without `lost`" to the config service by compare-and-swap, re-reading on a
// conflict, and returns the document to form next: the stored one, or a newer one that already
// lacks them. When nothing is to be removed (a silent timeout, a peer that moved on), the version
// is still moved past the current one, so that the survivors form a version none of them has
// used. Waits for the service while it is unreachable.
Cluster Session::remove_lost(const std::vector<Endpoint>& lost) {
  ConfigClient client(watch_->url(), watch_->token());
  std::chrono::milliseconds backoff{50};
  bool said_down = false;
  for (;;) {
    try {
      Cluster current = client.get_cluster();
      for (int conflicts = 0;; ++conflicts) {
        Cluster next = current;
        std::erase_if(next.workers, [&](const WorkerSpec& w) {
          return std::find(lost.begin(), lost.end(), w.endpoint) != lost.end();
        });
        const bool removes = next.workers.size() != current.workers.size();
        if (!removes && current.version > peer_->version()) {
          watch_->offer(current);
          return current;
        }
        if (next.workers.empty()) return next;  // nobody left (not even this worker)
        try {
          Cluster stored = client.put_cluster(next);
          for (const auto& ep : lost) {
            if (contains(current, ep)) {
              watch_->post("failed", ep.str(), "lost by the job; removed by " +
                                                   peer_->endpoint().str(), stored.version);
            }
          }
          watch_->offer(stored);
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
        KF_LOG(warn, "session", "{}: config service unreachable during recovery ({}); waiting",
               peer_->endpoint().str(), e.what());
      }
      said_down = true;
      std::this_thread::sleep_for(backoff);  // retry pacing while the service is down
      backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
    }
  }
}

int Session::add_metric(const std::string& name) {
  if (joined_) throw std::logic_error("Session::add_metric('" + name + "'): call before join()");
  if (std::find(metric_names_.begin(), metric_names_.end(), name) != metric_names_.end()) {
    throw std::invalid_argument("Session::add_metric: '" + name + "' is registered twice");
  }
  metric_names_.push_back(name);
  metric_values_.push_back(0.0);
  return static_cast<int>(metric_names_.size()) - 1;
}

void Session::set_metric(int slot, double value) {
  if (slot < 0 || static_cast<std::size_t>(slot) >= metric_values_.size()) {
    throw std::out_of_range("Session::set_metric: no metric slot " + std::to_string(slot));
  }
  metric_values_[static_cast<std::size_t>(slot)] = value;
}

PolicyInputs Session::policy_inputs() const {
  PolicyInputs in;
  in.step = *steps_;
  in.epoch = epoch_;
  in.workers = peer_->size();
  in.version = peer_->version();
  in.settings = settings_;
  in.metrics = metrics_;
  return in;
}

Proposal Session::run_hook(PolicyHook hook, std::int64_t epoch) {
  if (epoch >= 0) epoch_ = epoch;
  if (policies_ == nullptr || policies_->empty()) return {};
  Proposal p = policies_->run(hook, policy_inputs());
  apply(p, to_string(hook));
  return p;
}

void Session::adopt_settings(const nlohmann::json& settings) {
  // Settings a static job changed locally stay until a cluster version says otherwise.
  if (!watch_ && !settings_.empty()) return;
  settings_ = settings.is_object() ? settings : nlohmann::json::object();
  if (settings_.contains("algorithm") && settings_["algorithm"].is_string()) {
    if (auto a = parse_algorithm(settings_["algorithm"].get<std::string>())) {
      peer_->set_default_algorithm(*a);
    }
  }
}

// Applies a proposal on every worker at once. Every worker computed the same proposal from the
// same inputs; in an elastic job rank 0 alone writes it as one new cluster version (all changes
// together), which every worker then takes up at the same boundary. In a static job the
// settings change here, on every worker, at this boundary.
void Session::apply(const Proposal& proposal, const char* hook) {
  if (proposal.empty() || proposal.changes_nothing(peer_->size(), settings_)) return;
  std::string why;
  for (const auto& r : proposal.reasons) why += (why.empty() ? "" : "; ") + r;
  // Captures a copy: the elastic branch runs it later, on the poster thread.
  const auto edit_settings = [p = proposal](nlohmann::json& st) {
    if (p.batch_size) st["batch_size"] = *p.batch_size;
    if (p.learning_rate) st["lr"] = *p.learning_rate;
    if (p.algorithm) st["algorithm"] = *p.algorithm;
    if (p.stop) st["stop"] = true;
  };
  if (!watch_) {
    if (proposal.workers && *proposal.workers != peer_->size()) {
      KF_LOG(warn, "session", "{}: a static job cannot resize ({})", peer_->endpoint().str(), why);
    }
    nlohmann::json st = settings_;
    edit_settings(st);
    settings_ = st;
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
  Watch* watch = watch_.get();
  watch_->submit(proposal.to_json().dump(), [=](ConfigClient& client) {
    Cluster c = client.get_cluster();
    for (int attempt = 0; attempt < 20; ++attempt) {
      Cluster next = c;
      edit_settings(next.settings);
      if (proposal.workers) {
        const auto want = static_cast<std::size_t>(*proposal.workers);
        if (want < next.workers.size()) next.workers.resize(want);
        int slot = 0;
        for (const auto& w : next.workers) {
          if (w.endpoint.host == self.host) slot = std::max(slot, w.slot + 1);
        }
        while (next.workers.size() < want) {
          const std::uint16_t port = free_port(self.host, next);
          next.workers.push_back(WorkerSpec{Endpoint{self.host, port}, slot++});
        }
      }
      if (next.workers == c.workers && next.settings == c.settings) return;  // already there
      try {
        const Cluster stored = client.put_cluster(next);
        KF_LOG(info, "session", "{} (rank 0) step {}: {} wrote v{}: {}", self.str(), step, hook,
               stored.version, why);
        watch->post(proposal.workers ? "resized" : "note", "", "policy: " + why, stored.version);
        return;
      } catch (const ConflictError& e) {
        c = e.current();
      }
    }
  });
}

namespace {

// ḡ = sum × (1/K) and |ḡ|², in one pass over the reduced buffer.
double scale_and_norm(std::span<float> values, float factor) noexcept {
  return scale_and_squared_norm(values, factor);
}

}  // namespace

void Session::allreduce_gradients(std::span<float> grads, double local_batch) {
  const double local = monitor_ ? squared_norm(grads) : 0.0;
  const auto t0 = SteadyClock::now();
  peer_->allreduce("kf.grads", buffer(grads.data(), grads.size()),
                   buffer(grads.data(), grads.size()))
      .wait();
  average_gradients(grads, local, t0, local_batch);
}

void Session::allreduce_gradients(std::span<const float> local, std::span<float> mean,
                                  double local_batch) {
  if (local.size() != mean.size()) {
    throw std::invalid_argument("Session::allreduce_gradients: local has " +
                                std::to_string(local.size()) + " values, mean " +
                                std::to_string(mean.size()));
  }
  const auto t0 = SteadyClock::now();
  Handle h = peer_->allreduce("kf.grads", buffer(local.data(), local.size()),
                              buffer(mean.data(), mean.size()));
  // The I/O thread reduces while this thread reads the same input for its norm.
  const double own = monitor_ ? squared_norm(local) : 0.0;
  h.wait();
  average_gradients(mean, own, t0, local_batch);
}

// The allreduced sum → the mean, and the step's reports (|ḡ|² in the same pass).
void Session::average_gradients(std::span<float> sum, double local_sqnorm,
                                std::chrono::steady_clock::time_point started,
                                double local_batch) {
  const double comm = std::chrono::duration<double>(SteadyClock::now() - started).count();
  const float factor = 1.0f / static_cast<float>(peer_->size());
  if (!monitor_) {
    for (float& g : sum) g *= factor;
    return;
  }
  const double global = scale_and_norm(sum, factor);
  report_comm(comm, static_cast<double>(sum.size_bytes()));
  report_gradients(local_sqnorm, global, local_batch, 1, std::isfinite(local_sqnorm));
}

void Session::report_gradients(double local_sqnorm, double global_sqnorm, double local_batch,
                               int micro_batches, bool finite) {
  if (micro_batches < 1 || !(local_batch > 0)) {
    throw std::invalid_argument("Session::report_gradients: micro_batches must be >= 1 and "
                                "local_batch > 0");
  }
  report_.local_sqnorm += local_sqnorm;
  report_.global_sqnorm = global_sqnorm;
  report_.local_batch = local_batch;
  report_.micro_batches += micro_batches;
  if (!finite) report_.nonfinite = 1;
  if (!samples_reported_) report_.samples += local_batch * micro_batches;
}

void Session::report_samples(double samples) {
  if (!samples_reported_) report_.samples = 0;  // replaces what gradients implied
  samples_reported_ = true;
  report_.samples += samples;
}

void Session::report_comm(double seconds, double bytes) {
  report_.comm_time += seconds;
  report_.comm_bytes += bytes;
}

// Every metric as a gauge "kf_<name>" (dots become underscores), plus the job's shape; rank 0
// appends a JSON line every metrics_every steps.
void Session::export_metrics() {
  auto& r = *registry_;
  r.gauge("kf_steps", "steps finished by every worker").set(static_cast<double>(*steps_));
  r.gauge("kf_commits", "commits of the training state").set(static_cast<double>(*commits_));
  r.gauge("kf_workers", "workers in the cluster").set(peer_->size());
  r.gauge("kf_cluster_version", "cluster version").set(static_cast<double>(peer_->version()));
  r.gauge("kf_rank", "this worker's rank").set(peer_->rank());
  if (auto b = settings_.find("batch_size"); b != settings_.end() && b->is_number()) {
    r.gauge("kf_batch_size", "global batch size (settings)").set(b->get<double>());
  }
  if (auto lr = settings_.find("lr"); lr != settings_.end() && lr->is_number()) {
    r.gauge("kf_learning_rate", "learning rate (settings)").set(lr->get<double>());
  }
  for (const auto& [name, value] : metrics_) {
    std::string m = "kf_" + name;
    for (char& c : m) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') c = '_';
    }
    if (!monitor::is_valid_metric_name(m)) continue;
    r.gauge(m, "step metric '" + name + "', averaged over the workers").set(value);
  }
  if (options_.metrics_jsonl && peer_->rank() == 0 && *steps_ % options_.metrics_every == 0) {
    try {
      if (!metrics_jsonl_) {
        metrics_jsonl_ = std::make_unique<monitor::JsonlWriter>(*options_.metrics_jsonl);
      }
      metrics_jsonl_->write(*steps_, r);
    } catch (const std::exception& e) {
      // Metrics are for people: losing them must not stop training.
      KF_LOG(err, "session", "{}: {}; metrics lines are no longer written", peer_->endpoint().str(),
             e.what());
      options_.metrics_jsonl.reset();
    }
  }
}

void Session::finish() {
  if (!watch_ || peer_->rank() != 0) return;
  try {
    ConfigClient client(watch_->url(), watch_->token());
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
}

void Session::finish_change(ChangeRecord rec) {
  if (rec.to_version == 0) rec.to_version = peer_->version();
  if (rec.to_size == 0) rec.to_size = peer_->size();
  KF_LOG(info, "session", "{} (rank {}): {}", peer_->endpoint().str(), peer_->rank(),
         rec.summary());
  if (watch_ && rec.kind == "join") {
    watch_->post("joined", peer_->endpoint().str(), rec.summary(), rec.to_version);
  } else if (watch_ && peer_->rank() == 0) {
    watch_->post("resized", "", rec.summary(), rec.to_version);
  }
  changes_.push_back(std::move(rec));
}

}  // namespace kf
