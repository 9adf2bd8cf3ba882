// SPDX-License-Identifier: Apache-2.0
// The JSON-lines export of a MetricsRegistry: one object per call, appended to a file,
//   {"step": 120, "time": "2025-01-31T09:15:02.137Z", "metrics": {"kf_loss": 0.52, ...}}
// The keys of "metrics" are the series as the Prometheus text spells them (`name` or
// `name{label="value"}`), so that a series has one name in both exports. Finite values are JSON
// numbers, a summary's count an integer, and NaN, +Inf and -Inf the strings "NaN", "+Inf",
// "-Inf" (JSON has no such numbers; B_simple is +Inf when the noise dominates).
// Ownership: a JsonlWriter owns its file descriptor. Thread-safety: write() may be called from
// several threads; each line goes to the kernel in one write(2) on an O_APPEND descriptor, so
// lines do not interleave (not even with another process appending to the same file).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kf/monitor/metrics.hpp"

namespace kf::monitor {

/// `time` as RFC 3339 in UTC with milliseconds: "2025-01-31T09:15:02.137Z".
std::string format_rfc3339(std::chrono::system_clock::time_point time);

/// One line of the export (without the trailing newline).
std::string to_json_line(std::int64_t step, std::chrono::system_clock::time_point time,
                         const MetricsRegistry& registry);

class JsonlWriter {
 public:
  /// Opens `path` for appending, creating it (mode 0644 less the umask) if it does not exist.
  /// Throws: std::runtime_error naming the file and the reason when it cannot be opened.
  explicit JsonlWriter(std::string path);
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter();

  /// Appends to_json_line(step, time, registry) and a newline; it is in the file (the kernel's
  /// page cache, not necessarily the disk) when write() returns.
  /// Throws: std::runtime_error naming the file and the reason when the write fails (disk
  /// full, for example); part of the line may then be in the file.
  void write(std::int64_t step, const MetricsRegistry& registry,
             std::chrono::system_clock::time_point time = std::chrono::system_clock::now());

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace kf::monitor
