// SPDX-License-Identifier: Apache-2.0
// The metrics registry (docs/monitoring.md, "Metrics"): named counters, gauges, summaries and
// histograms with Prometheus labels. A metric is registered once and then updated through the
// reference that registration returns: an update takes no registry lock and allocates nothing.
// The exporters (prometheus_text.hpp, jsonl_writer.hpp, metrics_server.hpp) read a snapshot().
// Ownership: the registry owns its metrics; a returned reference stays valid until the registry
// is destroyed. Thread-safety: every member of MetricsRegistry, Counter, Gauge, Summary and
// Histogram may be called from any thread at any time.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kf::monitor {

/// Label (name, value) pairs of one series. Order does not matter on input; snapshots hold
/// them sorted by name.
using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { counter, gauge, summary, histogram };

/// "counter", "gauge", "summary" or "histogram": the Prometheus TYPE names.
std::string_view to_string(MetricType type) noexcept;

/// True when `name` matches [a-zA-Z_:][a-zA-Z0-9_:]* (a Prometheus metric name).
bool is_valid_metric_name(std::string_view name) noexcept;
/// True when `name` matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__" (reserved for
/// Prometheus itself).
bool is_valid_label_name(std::string_view name) noexcept;

/// A monotonic total (Prometheus counter): steps, samples, bytes, seconds spent.
/// Thread-safety: any thread; inc() is one relaxed atomic add.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  /// Adds `amount`. Throws: std::invalid_argument when amount is negative, NaN or infinite
  /// (a counter only goes up, and NaN or Inf would stick forever); the value is unchanged.
  void inc(double amount = 1.0);
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  friend class MetricsRegistry;
  std::atomic<double> value_{0.0};
  std::string series_;  // `name{labels}` for messages; set once by the registry
};

/// A value that goes up and down (Prometheus gauge): batch size, workers, B_simple.
/// Any double is accepted, NaN and ±Inf included (they are exported as NaN, +Inf, -Inf).
/// Thread-safety: any thread; set() is one relaxed atomic store, add() one atomic add.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void set(double value) noexcept { value_.store(value, std::memory_order_relaxed); }
  void add(double amount) noexcept { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// What a Summary has seen: the last observation, their sum and their count.
struct SummaryValue {
  double last = std::numeric_limits<double>::quiet_NaN();  ///< NaN before the first observation
  double sum = 0.0;
  std::uint64_t count = 0;
};

/// Last value, sum and count of an observed quantity (step time, loss): a Prometheus summary
/// without quantiles, plus the last value. sum/count over a scrape interval is the mean; the
/// last value is what a dashboard shows between scrapes. Any double is accepted (a NaN stays in
/// the sum, visibly). Thread-safety: any thread; observe() and value() take a per-summary mutex
/// for a few instructions, so that sum and count are always read together.
class Summary {
 public:
  Summary() = default;
  Summary(const Summary&) = delete;
  Summary& operator=(const Summary&) = delete;

  void observe(double value) noexcept;
  SummaryValue value() const noexcept;

 private:
  mutable std::mutex mutex_;  // guards value_
  SummaryValue value_;
};

/// Observations counted in buckets by upper bound (a Prometheus histogram): step and collective
/// durations, resize phases. The bounds are fixed at registration. A NaN is counted (in the
/// +Inf bucket, and in the sum, visibly). Thread-safety: any thread; observe() takes a
/// per-histogram mutex for a few instructions, so that a snapshot's buckets, sum and count agree.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;
  void observe(double value) noexcept;
  /// The upper bounds, ascending and finite (the +Inf bucket is implied).
  const std::vector<double>& bounds() const noexcept { return bounds_; }
  /// Per bound, the observations at most it (cumulative, as exported), then their sum and count.
  void read(std::vector<std::uint64_t>& cumulative, double& sum, std::uint64_t& count) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;           // guards counts_, sum_, count_
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; one more for +Inf
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// Bounds for durations in seconds, 100 µs to about 100 s in steps of about 2.5×.
std::vector<double> duration_buckets();

/// One series of a family in a snapshot.
struct MetricSample {
  Labels labels;            ///< sorted by label name
  double value = 0.0;       ///< counter, gauge; a summary's last observation (NaN before the first)
  double sum = 0.0;         ///< summary and histogram
  std::uint64_t count = 0;  ///< summary and histogram
  /// Histogram only: (upper bound, observations at most it), ascending, without +Inf (count).
  std::vector<std::pair<double, std::uint64_t>> buckets;
};

/// One metric family (one name) in a snapshot.
struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::gauge;
  std::vector<MetricSample> samples;  ///< sorted by label values (in label-name order)
};

/// The registry. A family is a name with a type, a help text and a set of label names; each
/// distinct set of label values is one series of it.
///
/// Registration rules (each broken rule throws std::invalid_argument naming the metric):
/// - the name is a valid metric name, every label name a valid label name, no label name twice;
/// - every label value and the help text are valid UTF-8 (any characters; the exporters escape);
/// - registering an existing series again returns the same object when the type and help match;
/// - all series of a family have the same label names;
/// - a summary `x` is exported as `x_sum`, `x_count` and the gauge `x_last`, so those names are
///   taken by it (in either order of registration), and it may not have a `quantile` label;
/// - a histogram `x` is exported as `x_bucket`, `x_sum` and `x_count`, may not have an `le`
///   label, and every series of it has the same bounds (ascending, finite, at least one).
///
/// Thread-safety: all members may be called from any thread. Registration and snapshot() take
/// the registry's mutex; updates through the returned references never do.
class MetricsRegistry {
 public:
  MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  ~MetricsRegistry();

  /// The counter `name` with `labels`, created at 0 if new. Throws: std::invalid_argument (see
  /// the class comment).
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  /// The gauge `name` with `labels`, created at 0 if new. Throws: std::invalid_argument.
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  /// The summary `name` with `labels`, created empty if new. Throws: std::invalid_argument.
  Summary& summary(std::string_view name, std::string_view help, const Labels& labels = {});
  /// The histogram `name` with `labels` and these bucket bounds, created empty if new.
  /// Throws: std::invalid_argument (see the class comment).
  Histogram& histogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                       const Labels& labels = {});

  /// Every family sorted by name, with the current values. Each value is read atomically, but
  /// updates that race with the snapshot may or may not be in it. Allocates (for exporters).
  std::vector<MetricFamily> snapshot() const;

 private:
  struct State;
  template <class Metric>
  Metric& find_or_add(MetricType type, std::string_view name, std::string_view help,
                      const Labels& labels, const std::vector<double>* bounds = nullptr);

  std::unique_ptr<State> state_;
};

}  // namespace kf::monitor
