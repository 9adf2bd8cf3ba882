// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/state.hpp"

#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace kf::config_server {

namespace {

constexpr int kFormat = 1;

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw std::runtime_error("state file " + file.string() + ": " + what);
}

[[noreturn]] void fail_errno(const std::filesystem::path& file, const std::string& what) {
  fail(file, what + ": " + std::strerror(errno));
}

}  // namespace

nlohmann::json State::to_json() const {
  return {{"format", kFormat},
          {"cluster", cluster.to_json()},
          {"events", events},
          {"next_seq", next_seq}};
}

State State::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) {
    throw std::invalid_argument("format must be " + std::to_string(kFormat));
  }
  State s;
  if (!j.contains("cluster")) throw std::invalid_argument("cluster is missing");
  s.cluster = Cluster::from_json(j["cluster"]);
  if (!j.contains("events") || !j["events"].is_array()) {
    throw std::invalid_argument("events must be an array");
  }
  std::uint64_t last = 0;
  for (const auto& e : j["events"]) {
    if (!e.is_object() || !e.contains("seq") || !e["seq"].is_number_unsigned() ||
        !e.contains("type") || !e["type"].is_string()) {
      throw std::invalid_argument("events[" + std::to_string(s.events.size()) +
                                  "] must be an object with seq and type");
    }
    const auto seq = e["seq"].get<std::uint64_t>();
    if (seq <= last)
      throw std::invalid_argument("event seq " + std::to_string(seq) + " is out of order");
    last = seq;
    s.events.push_back(e);
  }
  if (!j.contains("next_seq") || !j["next_seq"].is_number_unsigned() ||
      j["next_seq"].get<std::uint64_t>() <= last) {
    throw std::invalid_argument("next_seq must be an integer above the last event's seq");
  }
  s.next_seq = j["next_seq"].get<std::uint64_t>();
  return s;
}

State load_state(const std::filesystem::path& file) {
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (status.type() == std::filesystem::file_type::not_found) return State{};
  if (ec) fail(file, "cannot stat: " + ec.message());
  if (status.type() != std::filesystem::file_type::regular) fail(file, "not a regular file");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail_errno(file, "cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(file, "cannot read");
  const auto j = parse_json_or_discard(text.str());
  if (j.is_discarded()) fail(file, "corrupt: not valid JSON (or nested deeper than 64 levels)");
  try {
    return State::from_json(j);
  } catch (const std::invalid_argument& e) {
    fail(file, std::string("corrupt: ") + e.what());
  }
}

void save_state(const std::filesystem::path& file, const State& state) {
  const std::string text = state.to_json().dump(2) + "\n";
  try {
    write_file_atomically(file.string(), {text}, 0600, [](const std::string& why) {
      KF_LOG(warn, "config-server", "state file: {}", why);
    });
  } catch (const std::runtime_error& e) {
    fail(file, e.what());
  }
}

std::string format_rfc3339_ms(std::chrono::system_clock::time_point t) {
  const auto ms = std::chrono::time_point_cast<std::chrono::milliseconds>(t);
  const std::time_t secs = std::chrono::system_clock::to_time_t(ms);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[40];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  const auto millis = (ms.time_since_epoch().count() % 1000 + 1000) % 1000;
  char frac[8];
  std::snprintf(frac, sizeof frac, ".%03dZ", static_cast<int>(millis));
  return std::string(buf, n) + frac;
}

}  // namespace kf::config_server
