// SPDX-License-Identifier: Apache-2.0
// kf::Session's metrics: the registered per-step scalars, the monitors' reports of the current
// step, and their export (Prometheus gauges, rank 0's JSON lines).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>

#include "config.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/jsonl_writer.hpp"
#include "kf/monitor/metrics.hpp"
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/session.hpp"
#include "session/service_link.hpp"

namespace kf {

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

void Session::report_gradients(double local_sqnorm, double global_sqnorm, double local_batch,
                               int micro_batches, bool finite) {
  if (micro_batches < 1 || !(local_batch > 0)) {
    throw std::invalid_argument(
        "Session::report_gradients: micro_batches must be >= 1 and "
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
  if (collective_bytes_total_ != nullptr && bytes >= 0 && std::isfinite(bytes)) {
    collective_bytes_total_->inc(bytes);
    collective_seconds_->observe(seconds);
  }
}

void Session::report_compute(double seconds) {
  if (seconds > 0) report_.compute_time += seconds;
}

// Each worker's samples per computed second, a moving average over the boundaries of one
// cluster version; every worker computes it from the same allgathered words, so all hold the
// same bits.
void Session::update_speeds(std::span<const std::int64_t> all, std::size_t stride,
                            std::size_t offset) {
  const int n = peer_->size();
  if (speeds_version_ != peer_->version() || speeds_.size() != static_cast<std::size_t>(n)) {
    speeds_.assign(static_cast<std::size_t>(n), 0.0);
    speeds_version_ = peer_->version();
  }
  for (int r = 0; r < n; ++r) {
    const auto [samples, compute] = StepMonitor::samples_and_compute(all, stride, offset, r);
    if (!(samples > 0) || !(compute > 0) || !std::isfinite(samples / compute)) continue;
    double& s = speeds_[static_cast<std::size_t>(r)];
    s = s > 0 ? 0.7 * s + 0.3 * (samples / compute) : samples / compute;
  }
}

// Every worker's straggler score from the same reports (so the same on every worker); the job's
// slowest score and count of slow workers become metrics, and rank 0 logs and posts each worker
// that turns slow or recovers.
void Session::track_stragglers(std::span<const std::int64_t> all, std::size_t stride,
                               std::size_t offset) {
  const auto& workers = peer_->cluster().workers;
  std::vector<StragglerSample> step;
  step.reserve(workers.size());
  for (int r = 0; r < peer_->size(); ++r) {
    const auto [samples, compute] = StepMonitor::samples_and_compute(all, stride, offset, r);
    step.push_back({workers[static_cast<std::size_t>(r)].endpoint.str(), samples, compute});
  }
  const auto changes = stragglers_.update(step);
  const auto& scores = stragglers_.scores();
  if (scores.empty()) {
    metrics_.erase("straggler.slowest");
    metrics_.erase("straggler.slow_workers");
  } else {
    double slowest = 1.0;
    for (const auto& s : scores) slowest = std::min(slowest, s.vs_fastest);
    metrics_["straggler.slowest"] = slowest;
    metrics_["straggler.slow_workers"] = stragglers_.slow_count();
  }
  if (peer_->rank() != 0) return;
  for (const auto& c : changes) {
    const std::string detail = fmt::format(
        "{:.4g} samples per second of compute: {:.2f} of the fastest worker's, {:.2f} "
        "of its own best",
        c.score.speed, c.score.vs_fastest, c.score.vs_own_best);
    KF_LOG(warn, "stragglers", "{} (rank 0, v{}): {} {}: {}", peer_->endpoint().str(),
           peer_->version(), c.score.worker, c.slow ? "is slow" : "recovered", detail);
    if (link_) link_->post(c.slow ? "slow" : "recovered", c.score.worker, detail, peer_->version());
  }
}

std::vector<double> Session::speeds() const {
  const bool current = speeds_version_ == peer_->version() &&
                       speeds_.size() == static_cast<std::size_t>(peer_->size());
  if (!current) return {};
  for (double s : speeds_) {
    if (!(s > 0)) return {};
  }
  return speeds_;
}

std::pair<std::size_t, std::size_t> Session::batch_part(std::size_t samples) const {
  const std::vector<double> weights =
      settings_.value("balance", false) ? speeds() : std::vector<double>{};
  const std::vector<std::size_t> parts = ElasticSampler::split(samples, weights, peer_->size());
  std::size_t first = 0;
  for (int r = 0; r < peer_->rank(); ++r) first += parts[static_cast<std::size_t>(r)];
  return {first, parts[static_cast<std::size_t>(peer_->rank())]};
}

namespace {

// The exported name of a metric of Session::metrics(): the monitors' own with their units
// (Prometheus's conventions: base units as suffixes), any other "kf_<name>" with dots and other
// characters a name cannot hold as underscores.
std::string exported_name(const std::string& name) {
  static const std::map<std::string, std::string, std::less<>> kUnits = {
      {"step_time", "kf_step_time_seconds"},
      {"step_time_ema", "kf_step_time_ema_seconds"},
      {"samples", "kf_step_samples"},
      {"throughput", "kf_throughput_samples_per_second"},
      {"throughput_per_worker", "kf_throughput_per_worker_samples_per_second"},
      {"comm_time", "kf_comm_time_seconds"},
      {"comm_bytes", "kf_comm_bytes"},
      {"algbw", "kf_algbw_bytes_per_second"},
      {"straggler.slowest", "kf_straggler_slowest_ratio"},
      // "b" reads as bytes to Prometheus's linter: B_simple is the simple noise scale.
      {"gns.b_simple", "kf_gns_simple_noise_scale"},
  };
  if (const auto it = kUnits.find(name); it != kUnits.end()) return it->second;
  std::string m = "kf_" + name;
  for (char& c : m) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') c = '_';
  }
  return m;
}

// "policy: field=value (why)" (PolicyContext::note): the policy and the field.
std::pair<std::string, std::string> policy_and_action(const std::string& reason) {
  const auto colon = reason.find(": ");
  if (colon == std::string::npos) return {"unknown", "unknown"};
  const std::string rest = reason.substr(colon + 2);
  return {reason.substr(0, colon), rest.substr(0, rest.find_first_of("= ("))};
}

}  // namespace

void Session::register_metrics() {
  if (!registry_) return;
  auto& r = *registry_;
  r.gauge("kf_build_info", "kf's version, as the label (the value is 1)", {{"version", KF_VERSION}})
      .set(1);
  steps_total_ = &r.counter("kf_steps_total", "steps this worker finished");
  commits_total_ = &r.counter("kf_commits_total", "commits of the training state on this worker");
  samples_total_ =
      &r.counter("kf_samples_total", "samples this worker trained on (Session::report_samples)");
  collective_bytes_total_ = &r.counter("kf_collective_bytes_total",
                                       "payload bytes of this worker's collectives (report_comm)");
  step_seconds_ = &r.histogram("kf_step_duration_seconds", "wall time of each step of this worker",
                               monitor::duration_buckets());
  collective_seconds_ = &r.histogram("kf_collective_duration_seconds",
                                     "time of each of this worker's collectives (report_comm)",
                                     monitor::duration_buckets());
}

// A step ended on this worker (at a boundary or not).
void Session::count_step(std::chrono::steady_clock::time_point now) {
  if (steps_total_ == nullptr) return;
  steps_total_->inc();
  if (last_step_end_ != std::chrono::steady_clock::time_point{}) {
    step_seconds_->observe(std::chrono::duration<double>(now - last_step_end_).count());
  }
  last_step_end_ = now;
  if (*commits_ > commits_counted_)
    commits_total_->inc(static_cast<double>(*commits_ - commits_counted_));
  commits_counted_ = *commits_;  // a rollback counts nothing twice
}

// A change this worker took part in: its kind and each phase's time.
void Session::count_change(const ChangeRecord& rec) {
  if (!registry_) return;
  auto& r = *registry_;
  // A resize is a grow or a shrink (workers revoked, given notice or taken out); a recovery
  // follows a lost worker.
  std::string kind = rec.kind;
  if (kind == "resize" && rec.to_size != rec.from_size) {
    kind = rec.to_size > rec.from_size ? "grow" : "shrink";
  }
  r.counter("kf_membership_changes_total",
            "changes this worker took part in, by kind (join, grow, shrink, resize, settings, "
            "recovery)",
            {{"kind", kind}})
      .inc();
  const std::int64_t from = rec.switch_us > 0 ? rec.switch_us : rec.agreed_us;
  const std::pair<const char*, double> phases[] = {
      {"detect", rec.ms(rec.detected_us, rec.boundary_us)},
      {"agree", rec.ms(rec.boundary_us, rec.agreed_us)},
      {"connect", rec.ms(from, rec.connected_us)},
      {"sync", rec.ms(rec.connected_us, rec.synced_us)},
      {"resume", rec.ms(rec.synced_us, rec.resumed_us)},
  };
  for (const auto& [phase, ms] : phases) {
    r.histogram("kf_resize_phase_duration_seconds",
                "time of each phase of the changes this worker took part in",
                monitor::duration_buckets(), {{"phase", phase}})
        .observe(ms / 1000.0);
  }
}

// The policies' decisions applied at a boundary, by policy and the setting each changed.
void Session::count_decisions(const Proposal& proposal) {
  if (!registry_) return;
  for (const auto& reason : proposal.reasons) {
    const auto [policy, action] = policy_and_action(reason);
    registry_
        ->counter("kf_policy_decisions_total",
                  "decisions of the policies applied, by policy and action",
                  {{"policy", policy}, {"action", action}})
        .inc();
  }
}

// Every metric as a gauge (monitor::exported_name), plus the job's shape; rank 0 appends a JSON
// line every metrics_every steps.
void Session::export_metrics() {
  auto& r = *registry_;
  r.gauge("kf_cluster_size", "workers in the cluster").set(peer_->size());
  r.gauge("kf_cluster_version", "cluster version").set(static_cast<double>(peer_->version()));
  r.gauge("kf_rank", "this worker's rank").set(peer_->rank());
  if (auto b = settings_.find("batch_size"); b != settings_.end() && b->is_number()) {
    const double global = b->get<double>();
    r.gauge("kf_global_batch_size", "global batch size (settings)").set(global);
    if (global >= 1) {
      r.gauge("kf_local_batch_size", "this worker's part of the global batch (Session::batch_part)")
          .set(static_cast<double>(batch_part(static_cast<std::size_t>(global)).second));
    }
  }
  if (auto lr = settings_.find("lr"); lr != settings_.end() && lr->is_number()) {
    r.gauge("kf_learning_rate", "learning rate (settings)").set(lr->get<double>());
  }
  // The settings change only at some boundaries: parse the mode and compression only then.
  if (mode_info_stale_) {
    mode_info_stale_ = false;
    monitor::Gauge& now =
        r.gauge("kf_mode_info",
                "the training mode, compression and boundaries in use (1; 0 for earlier ones)",
                {{"mode", mode().str()},
                 {"compression", compression().str()},
                 {"boundaries", on_change_ ? "on-change" : "every-step"}});
    if (mode_info_ != nullptr && mode_info_ != &now) mode_info_->set(0);
    now.set(1);
    mode_info_ = &now;
  }
  if (const StragglerScore* s = stragglers_.find(peer_->endpoint().str())) {
    r.gauge("kf_straggler_samples_per_second",
            "this worker's samples per second of compute, over its window")
        .set(s->speed);
    r.gauge("kf_straggler_vs_fastest_ratio", "this worker's speed / the fastest worker's")
        .set(s->vs_fastest);
    r.gauge("kf_straggler_vs_own_best_ratio", "this worker's speed / the best its window has shown")
        .set(s->vs_own_best);
    r.gauge("kf_straggler_slow", "1 while this worker is a straggler, else 0")
        .set(s->slow ? 1.0 : 0.0);
  }
  for (const auto& [name, value] : metrics_) {
    const std::string m = exported_name(name);
    if (!monitor::is_valid_metric_name(m) || unexported_.count(name) > 0) continue;
    try {
      r.gauge(m, "step metric '" + name + "', averaged over the workers").set(value);
    } catch (const std::invalid_argument& e) {
      // A program's metric whose name another series holds already (kf_steps_total, say).
      KF_LOG(warn, "session", "{}: metric '{}' is not exported: {}", peer_->endpoint().str(), name,
             e.what());
      unexported_.insert(name);
    }
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

// The job's summary for the config service's dashboard (docs/monitoring.md, "The dashboard"):
// values every worker agreed at this boundary, so rank 0 alone sends them. At most one queued
// (ServiceLink::submit keeps one per key), and the service keeps a bounded number.
void Session::post_summary() {
  if (options_.summary_interval.count() <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (summary_at_ != std::chrono::steady_clock::time_point{} &&
      now - summary_at_ < options_.summary_interval) {
    return;
  }
  summary_at_ = now;
  const auto metric = [&](const char* name) -> nlohmann::json {
    const auto it = metrics_.find(name);
    if (it == metrics_.end() || !std::isfinite(it->second)) return nullptr;
    return it->second;
  };
  nlohmann::json s = {{"step", on_change_ ? job_step_ : *steps_},
                      {"version", peer_->version()},
                      {"workers", peer_->size()},
                      {"samples_per_second", metric("throughput")},
                      {"step_time_seconds", metric("step_time")},
                      {"gns", metric("gns.b_simple")},
                      {"mode", mode().str()},
                      {"compression", compression().str()},
                      {"boundaries", on_change_ ? "on-change" : "every-step"}};
  if (auto b = settings_.find("batch_size"); b != settings_.end() && b->is_number()) {
    s["global_batch"] = *b;
  }
  if (auto lr = settings_.find("lr"); lr != settings_.end() && lr->is_number()) s["lr"] = *lr;
  nlohmann::json members = nlohmann::json::array();
  for (const StragglerScore& score : stragglers_.scores()) {
    if (members.size() >= 256) break;  // the service takes summaries of at most 16 KiB
    members.push_back({{"worker", score.worker},
                       {"samples_per_second", std::isfinite(score.speed) ? score.speed : 0.0},
                       {"vs_fastest", std::isfinite(score.vs_fastest) ? score.vs_fastest : 0.0},
                       {"slow", score.slow}});
  }
  s["members"] = std::move(members);
  if (!changes_.empty()) {
    const ChangeRecord& c = changes_.back();
    const std::int64_t from = c.switch_us > 0 ? c.switch_us : c.agreed_us;
    s["last_change"] = {{"version", c.to_version},
                        {"kind", c.kind},
                        {"detect_ms", c.ms(c.detected_us, c.boundary_us)},
                        {"agree_ms", c.ms(c.boundary_us, c.agreed_us)},
                        {"connect_ms", c.ms(from, c.connected_us)},
                        {"sync_ms", c.ms(c.connected_us, c.synced_us)},
                        {"resume_ms", c.ms(c.synced_us, c.resumed_us)}};
  }
  link_->submit("summary", [body = s.dump()](ConfigClient& client) { client.post_summary(body); });
}

}  // namespace kf
