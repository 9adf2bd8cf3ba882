// SPDX-License-Identifier: Apache-2.0
// kf::Session's metrics: the registered per-step scalars, the monitors' reports of the current
// step, and their export (Prometheus gauges, rank 0's JSON lines).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

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
  if (const StragglerScore* s = stragglers_.find(peer_->endpoint().str())) {
    r.gauge("kf_straggler_speed", "this worker's samples per second of compute, over its window")
        .set(s->speed);
    r.gauge("kf_straggler_vs_fastest", "this worker's speed / the fastest worker's")
        .set(s->vs_fastest);
    r.gauge("kf_straggler_vs_own_best", "this worker's speed / the best its window has shown")
        .set(s->vs_own_best);
    r.gauge("kf_straggler_slow", "1 while this worker is a straggler, else 0")
        .set(s->slow ? 1.0 : 0.0);
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

}  // namespace kf
