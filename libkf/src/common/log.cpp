// SPDX-License-Identifier: Apache-2.0
#include "kf/common/log.hpp"

#include <cstdlib>

#include <spdlog/sinks/stdout_sinks.h>

#include "kf/common/env.hpp"

namespace kf {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = std::make_shared<spdlog::logger>("kf",
                                              std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%H:%M:%S.%e %^%l%$ %v");
    const char* lvl = std::getenv(env::kLogLevel);
    l->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
    l->flush_on(spdlog::level::warn);
    return l;
  }();
  return *log;
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  logger().critical("check failed at {}:{}: {}: {}", file, line, cond, msg);
  logger().flush();
  std::abort();
}

}  // namespace kf
