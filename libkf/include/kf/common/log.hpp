// SPDX-License-Identifier: Apache-2.0
// Logging: spdlog, one line per event, prefixed with the subsystem; the peer adds its rank and
// cluster version to every message it logs. KF_CHECK is for broken invariants (bugs): it logs
// file and line and aborts. Thread-safety: spdlog loggers are thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace kf {

/// The process-wide kf logger (stderr), level from KF_LOG_LEVEL (default info).
spdlog::logger& logger();

/// Text from outside (a peer's hello, a request's field) made safe to put in a log line: every
/// byte outside printable ASCII, and the backslash, written as \xNN, and anything past
/// `max_bytes` of the input cut off with a note of the full length. Pure function.
std::string printable(std::string_view text, std::size_t max_bytes = 160);

/// Bounds how often one kind of complaint about outside input is logged, so that whoever sends
/// garbage cannot fill the disk or drown the other lines: at most `burst` lines per `window`;
/// the first line after a quiet spell says how many were left out. Thread-safe.
class LogLimiter {
 public:
  LogLimiter(int burst, std::chrono::milliseconds window) : burst_(burst), window_(window) {}
  /// Whether to log this occurrence; if so, `left_out` is the number not logged since the last
  /// line that was.
  bool allow(std::uint64_t& left_out);

 private:
  std::mutex mu_;
  const int burst_;
  const std::chrono::milliseconds window_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  std::uint64_t left_out_ = 0;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);

}  // namespace kf

#define KF_LOG(lvl, subsystem, ...) \
  ::kf::logger().log(::spdlog::level::lvl, "[" subsystem "] " __VA_ARGS__)

#define KF_CHECK(cond, msg)                                            \
  do {                                                                 \
    if (!(cond)) ::kf::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
