// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <variant>

#include "kf/common/utf8.hpp"
#include "kf/monitor/prometheus_text.hpp"

namespace kf::monitor {

namespace {

using SeriesPtr = std::variant<std::unique_ptr<Counter>, std::unique_ptr<Gauge>,
                               std::unique_ptr<Summary>, std::unique_ptr<Histogram>>;

struct Family {
  MetricType type;
  std::string help;
  std::vector<std::string> label_names;  // sorted
  std::vector<double> bounds;            // a histogram's
  // Key: the label values in label_names order; std::map keeps the export order stable.
  std::map<std::vector<std::string>, SeriesPtr> series;
};

bool is_name_char(char c, bool first, bool colon) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
         (!first && c >= '0' && c <= '9');
}

bool is_valid_name(std::string_view name, bool colon) noexcept {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (!is_name_char(name[i], i == 0, colon)) return false;
  }
  return true;
}

// The names a family puts into the exposition: a summary also writes _sum, _count and _last.
std::vector<std::string> exported_names(MetricType type, std::string_view name) {
  std::vector<std::string> names{std::string(name)};
  if (type == MetricType::summary) {
    for (const char* suffix : {"_sum", "_count", "_last"})
      names.push_back(std::string(name) + suffix);
  }
  if (type == MetricType::histogram) {
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      names.push_back(std::string(name) + suffix);
  }
  return names;
}

[[noreturn]] void reject(std::string_view name, const std::string& why) {
  throw std::invalid_argument("metric '" + std::string(name) + "': " + why);
}

// Checks name, help and labels; returns the labels sorted by name.
Labels checked_labels(MetricType type, std::string_view name, std::string_view help,
                      const Labels& labels) {
  if (!is_valid_metric_name(name)) {
    throw std::invalid_argument("metric name '" + std::string(name) +
                                "' is not valid: it must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  if (!is_valid_utf8(help)) reject(name, "the help text is not valid UTF-8");
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const auto& [label, value] = sorted[i];
    if (!is_valid_label_name(label)) {
      reject(name, "label name '" + label +
                       "' is not valid: it must match [a-zA-Z_][a-zA-Z0-9_]* and not start "
                       "with '__'");
    }
    if (i > 0 && sorted[i - 1].first == label) reject(name, "label '" + label + "' given twice");
    if (type == MetricType::summary && label == "quantile") {
      reject(name, "a summary may not have a 'quantile' label");
    }
    if (type == MetricType::histogram && label == "le") {
      reject(name, "a histogram may not have an 'le' label");
    }
    if (!is_valid_utf8(value))
      reject(name, "the value of label '" + label + "' is not valid UTF-8");
  }
  return sorted;
}

}  // namespace

std::string_view to_string(MetricType type) noexcept {
  switch (type) {
    case MetricType::counter: return "counter";
    case MetricType::gauge: return "gauge";
    case MetricType::summary: return "summary";
    case MetricType::histogram: return "histogram";
  }
  return "untyped";
}

bool is_valid_metric_name(std::string_view name) noexcept { return is_valid_name(name, true); }

bool is_valid_label_name(std::string_view name) noexcept {
  return is_valid_name(name, false) && !name.starts_with("__");
}

void Counter::inc(double amount) {
  if (!(amount >= 0.0) || std::isinf(amount)) {
    throw std::invalid_argument("counter '" + series_ + "': increment " + format_value(amount) +
                                " is not a finite number >= 0");
  }
  value_.fetch_add(amount, std::memory_order_relaxed);
}

void Summary::observe(double value) noexcept {
  std::lock_guard lock(mutex_);
  value_.last = value;
  value_.sum += value;
  ++value_.count;
}

SummaryValue Summary::value() const noexcept {
  std::lock_guard lock(mutex_);
  return value_;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) noexcept {
  // The first bucket whose bound is at least the value; NaN compares false, so +Inf.
  std::size_t i = 0;
  while (i < bounds_.size() && !(value <= bounds_[i])) ++i;
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::read(std::vector<std::uint64_t>& cumulative, double& sum,
                     std::uint64_t& count) const {
  cumulative.resize(bounds_.size());
  std::lock_guard lock(mutex_);
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    running += counts_[i];
    cumulative[i] = running;
  }
  sum = sum_;
  count = count_;
}

std::vector<double> duration_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
          0.25,   0.5,     1,      2.5,   5,      10,    25,   50,    100};
}

struct MetricsRegistry::State {
  mutable std::mutex mutex;  // guards families and taken (not the values: those are atomic)
  std::map<std::string, Family, std::less<>> families;
  std::map<std::string, std::string, std::less<>> taken;  // exported name → its family's name
};

MetricsRegistry::MetricsRegistry() : state_(std::make_unique<State>()) {}

MetricsRegistry::~MetricsRegistry() = default;

template <class Metric>
Metric& MetricsRegistry::find_or_add(MetricType type, std::string_view name, std::string_view help,
                                     const Labels& labels, const std::vector<double>* bounds) {
  const Labels sorted = checked_labels(type, name, help, labels);
  if (bounds != nullptr) {
    if (bounds->empty()) reject(name, "a histogram needs at least one bucket bound");
    for (std::size_t i = 0; i < bounds->size(); ++i) {
      if (!std::isfinite((*bounds)[i]) || (i > 0 && !((*bounds)[i - 1] < (*bounds)[i]))) {
        reject(name, "the bucket bounds must be finite and strictly ascending");
      }
    }
  }
  std::vector<std::string> label_names;
  std::vector<std::string> label_values;
  for (const auto& [label, value] : sorted) {
    label_names.push_back(label);
    label_values.push_back(value);
  }

  std::lock_guard lock(state_->mutex);
  auto family = state_->families.find(name);
  if (family == state_->families.end()) {
    const auto names = exported_names(type, name);
    for (const auto& exported : names) {
      const auto owner = state_->taken.find(exported);
      if (owner != state_->taken.end()) {
        reject(name, "the name '" + exported + "' is already exported by '" + owner->second + "'");
      }
    }
    family =
        state_->families
            .emplace(std::string(name), Family{type,
                                               std::string(help),
                                               label_names,
                                               bounds != nullptr ? *bounds : std::vector<double>{},
                                               {}})
            .first;
    for (const auto& exported : names) state_->taken.emplace(exported, std::string(name));
  } else {
    const Family& f = family->second;
    if (f.type != type) {
      reject(name, "already registered as a " + std::string(to_string(f.type)) + ", not a " +
                       std::string(to_string(type)));
    }
    if (f.help != help) reject(name, "already registered with the help '" + f.help + "'");
    if (f.label_names != label_names) {
      reject(name,
             "already registered with other label names (every series of a metric has "
             "the same label names)");
    }
    if (bounds != nullptr && f.bounds != *bounds) {
      reject(name, "already registered with other bucket bounds");
    }
  }

  auto& series = family->second.series;
  auto found = series.find(label_values);
  if (found == series.end()) {
    std::unique_ptr<Metric> metric;
    if constexpr (std::is_same_v<Metric, Histogram>) {
      metric = std::make_unique<Histogram>(family->second.bounds);
    } else {
      metric = std::make_unique<Metric>();
    }
    if constexpr (std::is_same_v<Metric, Counter>) metric->series_ = series_name(name, sorted);
    found = series.emplace(std::move(label_values), std::move(metric)).first;
  }
  return *std::get<std::unique_ptr<Metric>>(found->second);
}

Counter& MetricsRegistry::counter(std::string_view name, std::string_view help,
                                  const Labels& labels) {
  return find_or_add<Counter>(MetricType::counter, name, help, labels);
}

Gauge& MetricsRegistry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  return find_or_add<Gauge>(MetricType::gauge, name, help, labels);
}

Summary& MetricsRegistry::summary(std::string_view name, std::string_view help,
                                  const Labels& labels) {
  return find_or_add<Summary>(MetricType::summary, name, help, labels);
}

Histogram& MetricsRegistry::histogram(std::string_view name, std::string_view help,
                                      std::vector<double> bounds, const Labels& labels) {
  return find_or_add<Histogram>(MetricType::histogram, name, help, labels, &bounds);
}

std::vector<MetricFamily> MetricsRegistry::snapshot() const {
  std::vector<MetricFamily> out;
  std::lock_guard lock(state_->mutex);
  out.reserve(state_->families.size());
  for (const auto& [name, family] : state_->families) {
    MetricFamily f{name, family.help, family.type, {}};
    f.samples.reserve(family.series.size());
    for (const auto& [values, metric] : family.series) {
      MetricSample sample;
      for (std::size_t i = 0; i < values.size(); ++i) {
        sample.labels.emplace_back(family.label_names[i], values[i]);
      }
      if (const auto* c = std::get_if<std::unique_ptr<Counter>>(&metric)) {
        sample.value = (*c)->value();
      } else if (const auto* g = std::get_if<std::unique_ptr<Gauge>>(&metric)) {
        sample.value = (*g)->value();
      } else if (const auto* h = std::get_if<std::unique_ptr<Histogram>>(&metric)) {
        std::vector<std::uint64_t> cumulative;
        (*h)->read(cumulative, sample.sum, sample.count);
        for (std::size_t i = 0; i < cumulative.size(); ++i) {
          sample.buckets.emplace_back((*h)->bounds()[i], cumulative[i]);
        }
      } else {
        const SummaryValue s = std::get<std::unique_ptr<Summary>>(metric)->value();
        sample.value = s.last;
        sample.sum = s.sum;
        sample.count = s.count;
      }
      f.samples.push_back(std::move(sample));
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace kf::monitor
