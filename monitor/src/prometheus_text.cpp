// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/prometheus_text.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

namespace kf::monitor {

namespace {

void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

void append_header(std::string& out, std::string_view name, std::string_view help,
                   MetricType type) {
  if (!help.empty()) {
    out.append("# HELP ").append(name).append(" ");
    append_escaped(out, help, false);
    out += '\n';
  }
  out.append("# TYPE ").append(name).append(" ").append(to_string(type)) += '\n';
}

void append_line(std::string& out, std::string_view name, const Labels& labels,
                 std::string_view value) {
  out.append(series_name(name, labels)).append(" ").append(value) += '\n';
}

}  // namespace

std::string series_name(std::string_view name, const Labels& labels) {
  std::string out(name);
  if (labels.empty()) return out;
  out += '{';
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out.append(labels[i].first).append("=\"");
    append_escaped(out, labels[i].second, true);
    out += '"';
  }
  out += '}';
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc{}) return "NaN";  // unreachable: 32 bytes hold any shortest double
  return std::string(buffer, end);
}

std::string to_prometheus_text(const MetricsRegistry& registry) {
  std::string out;
  for (const MetricFamily& family : registry.snapshot()) {
    append_header(out, family.name, family.help, family.type);
    if (family.type == MetricType::histogram) {
      for (const auto& s : family.samples) {
        for (const auto& [bound, count] : s.buckets) {
          Labels with_le = s.labels;
          with_le.emplace_back("le", format_value(bound));
          append_line(out, family.name + "_bucket", with_le, std::to_string(count));
        }
        Labels with_inf = s.labels;
        with_inf.emplace_back("le", "+Inf");
        append_line(out, family.name + "_bucket", with_inf, std::to_string(s.count));
        append_line(out, family.name + "_sum", s.labels, format_value(s.sum));
        append_line(out, family.name + "_count", s.labels, std::to_string(s.count));
      }
      continue;
    }
    if (family.type != MetricType::summary) {
      for (const auto& s : family.samples)
        append_line(out, family.name, s.labels, format_value(s.value));
      continue;
    }
    for (const auto& s : family.samples) {
      append_line(out, family.name + "_sum", s.labels, format_value(s.sum));
      append_line(out, family.name + "_count", s.labels, std::to_string(s.count));
    }
    const std::string last = family.name + "_last";
    append_header(out, last, family.help.empty() ? "" : family.help + " (last observation)",
                  MetricType::gauge);
    for (const auto& s : family.samples) append_line(out, last, s.labels, format_value(s.value));
  }
  return out;
}

}  // namespace kf::monitor
