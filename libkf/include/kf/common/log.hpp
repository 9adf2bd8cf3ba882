// SPDX-License-Identifier: Apache-2.0
// Logging: spdlog, one line per event, prefixed with the subsystem; the peer adds its rank and
// cluster version to every message it logs. KF_CHECK is for broken invariants (bugs): it logs
// file and line and aborts. Thread-safety: spdlog loggers are thread-safe.
#pragma once

#include <spdlog/spdlog.h>

namespace kf {

/// The process-wide kf logger (stderr), level from KF_LOG_LEVEL (default info).
spdlog::logger& logger();

[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);

}  // namespace kf

#define KF_LOG(lvl, subsystem, ...) \
  ::kf::logger().log(::spdlog::level::lvl, "[" subsystem "] " __VA_ARGS__)

#define KF_CHECK(cond, msg)                                            \
  do {                                                                 \
    if (!(cond)) ::kf::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
