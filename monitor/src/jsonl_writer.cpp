// SPDX-License-Identifier: Apache-2.0
#include "kf/monitor/jsonl_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kf/monitor/prometheus_text.hpp"

namespace kf::monitor {

namespace {

nlohmann::ordered_json json_value(double value) {
  if (std::isfinite(value)) return value;
  return format_value(value);  // "NaN", "+Inf", "-Inf"
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw std::runtime_error("metrics file '" + path + "': " + what + ": " + std::strerror(error));
}

}  // namespace

std::string format_rfc3339(std::chrono::system_clock::time_point time) {
  using namespace std::chrono;
  const auto ms = floor<milliseconds>(time);
  const auto secs = floor<seconds>(ms);
  const std::time_t t = system_clock::to_time_t(secs);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buffer[128];  // room for any int, so that -Wformat-truncation has nothing to say
  std::snprintf(buffer, sizeof buffer, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>((ms - secs).count()));
  return buffer;
}

std::string to_json_line(std::int64_t step, std::chrono::system_clock::time_point time,
                         const MetricsRegistry& registry) {
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
  for (const MetricFamily& family : registry.snapshot()) {
    for (const MetricSample& s : family.samples) {
      if (family.type == MetricType::histogram) {
        for (const auto& [bound, count] : s.buckets) {
          Labels with_le = s.labels;
          with_le.emplace_back("le", format_value(bound));
          metrics[series_name(family.name + "_bucket", with_le)] = count;
        }
        Labels with_inf = s.labels;
        with_inf.emplace_back("le", "+Inf");
        metrics[series_name(family.name + "_bucket", with_inf)] = s.count;
        metrics[series_name(family.name + "_sum", s.labels)] = json_value(s.sum);
        metrics[series_name(family.name + "_count", s.labels)] = s.count;
        continue;
      }
      if (family.type != MetricType::summary) {
        metrics[series_name(family.name, s.labels)] = json_value(s.value);
        continue;
      }
      metrics[series_name(family.name + "_sum", s.labels)] = json_value(s.sum);
      metrics[series_name(family.name + "_count", s.labels)] = s.count;
      metrics[series_name(family.name + "_last", s.labels)] = json_value(s.value);
    }
  }
  nlohmann::ordered_json line;
  line["step"] = step;
  line["time"] = format_rfc3339(time);
  line["metrics"] = std::move(metrics);
  // Label values are checked UTF-8 at registration, so replace never fires; it keeps dump() from
  // throwing all the same.
  return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

JsonlWriter::JsonlWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open for appending", path_, errno);
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(std::int64_t step, const MetricsRegistry& registry,
                        std::chrono::system_clock::time_point time) {
  const std::string line = to_json_line(step, time, registry) + "\n";
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write step " + std::to_string(step), path_, errno);
    if (n == 0) fail("cannot write step " + std::to_string(step), path_, EIO);  // never spin
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace kf::monitor
