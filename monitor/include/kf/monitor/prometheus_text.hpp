// SPDX-License-Identifier: Apache-2.0
// The Prometheus text exposition format 0.0.4 of a MetricsRegistry, and its pieces: a series'
// name with escaped labels (also the keys of the JSON-lines export) and the spelling of a value.
// https://prometheus.io/docs/instrumenting/exposition_formats/ ("Text-based format").
// Thread-safety: pure functions; to_prometheus_text reads the registry through snapshot().
#pragma once

#include <string>
#include <string_view>

#include "kf/monitor/metrics.hpp"

namespace kf::monitor {

/// The whole exposition, deterministic: families sorted by name, each with `# HELP` (when the
/// help is not empty; `\` and newline escaped) and `# TYPE`, then one line per series sorted by
/// label values. A summary `x` gives `x_sum` and `x_count` lines, then a gauge family `x_last`
/// with its last observation. Ends with a newline (empty when the registry is).
std::string to_prometheus_text(const MetricsRegistry& registry);

/// `name` or `name{a="1",b="x"}` with the labels in the given order and each value escaped
/// (`\` → `\\`, `"` → `\"`, newline → `\n`).
std::string series_name(std::string_view name, const Labels& labels);

/// A sample value as Prometheus spells it: the shortest decimal that reads back as the same
/// double ("0.1", "3", "1e+21"), or "NaN", "+Inf", "-Inf".
std::string format_value(double value);

}  // namespace kf::monitor
