// SPDX-License-Identifier: Apache-2.0
#include "kf/common/log.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include <spdlog/sinks/stdout_sinks.h>

#include "kf/common/env.hpp"

namespace kf {

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l =
        std::make_shared<spdlog::logger>("kf", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%H:%M:%S.%e %^%l%$ %v");
    // spdlog reads an unknown name as "off", which would hide every message, the complaint
    // included: an unknown level is said and info is used.
    constexpr std::array<std::string_view, 9> kNames{
        "trace", "debug", "info", "warn", "warning", "err", "error", "critical", "off"};
    const auto lvl = env::get(env::kLogLevel);
    const bool known = lvl && std::find(kNames.begin(), kNames.end(), *lvl) != kNames.end();
    l->set_level(known ? spdlog::level::from_str(*lvl) : spdlog::level::info);
    l->flush_on(spdlog::level::warn);
    if (lvl && !known) {
      l->warn("{}='{}' is not one of trace, debug, info, warn, error, critical, off; using info",
              env::kLogLevel, *lvl);
    }
    return l;
  }();
  return *log;
}

std::string printable(std::string_view text, std::size_t max_bytes) {
  constexpr char kHex[] = "0123456789abcdef";
  const std::string_view shown = text.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (const char c : shown) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b < 0x7f && b != '\\') {
      out += c;
    } else {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  }
  if (shown.size() < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

bool LogLimiter::allow(std::uint64_t& left_out) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (in_window_ == 0 || now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++left_out_;
    return false;
  }
  ++in_window_;
  left_out = left_out_;
  left_out_ = 0;
  return true;
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  logger().critical("check failed at {}:{}: {}: {}", file, line, cond, msg);
  logger().flush();
  std::abort();
}

}  // namespace kf
