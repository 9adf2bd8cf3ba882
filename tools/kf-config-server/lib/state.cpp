// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/state.hpp"

#include "kf-config-server/lib/job_metrics.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
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

// Whether `e` is an event as the state holds them: an object with an unsigned seq and a type.
bool is_event(const nlohmann::json& e) {
  return e.is_object() && e.contains("seq") && e["seq"].is_number_unsigned() &&
         e.contains("type") && e["type"].is_string();
}

// The content of a regular file; nullopt when there is none.
std::optional<std::string> read_if_present(const std::filesystem::path& file) {
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (status.type() == std::filesystem::file_type::not_found) return std::nullopt;
  if (ec) fail(file, "cannot stat: " + ec.message());
  if (status.type() != std::filesystem::file_type::regular) fail(file, "not a regular file");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail_errno(file, "cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(file, "cannot read");
  return text.str();
}

// Applies FILE.log's records to `s`.
void replay_log(const std::filesystem::path& log, const std::string& text, State& s) {
  std::size_t at = 0;
  for (int line_no = 1; at < text.size(); ++line_no) {
    const auto nl = text.find('\n', at);
    const bool complete = nl != std::string::npos;
    const std::string_view line(text.data() + at, (complete ? nl : text.size()) - at);
    at = complete ? nl + 1 : text.size();
    const auto j = parse_json_or_discard(line);
    const bool record = !j.is_discarded() && j.is_object() && j.contains("event") &&
                        is_event(j["event"]) &&
                        (!j.contains("cluster") || j["cluster"].is_object());
    if (!record) {
      if (!complete) {
        s.torn = true;  // the last append, cut short by a crash: never answered
        return;
      }
      fail(log, "corrupt: line " + std::to_string(line_no) + " is not a record");
    }
    const auto seq = j["event"]["seq"].get<std::uint64_t>();
    if (seq < s.next_seq) {
      // In the snapshot already (a log kept when the snapshot's directory could not be synced);
      // a record the log itself gave before is corruption.
      if (s.logged > 0) {
        fail(log, "corrupt: line " + std::to_string(line_no) + " repeats event " +
                      std::to_string(seq) + " (" + std::to_string(s.next_seq) + " comes next)");
      }
      continue;
    }
    if (seq > s.next_seq) {
      fail(log, "corrupt: line " + std::to_string(line_no) + " has event " + std::to_string(seq) +
                    " where " + std::to_string(s.next_seq) + " comes next (a record is missing)");
    }
    if (j.contains("cluster")) {
      try {
        s.cluster = Cluster::from_json(j["cluster"]);
      } catch (const std::invalid_argument& e) {
        fail(log, "corrupt: line " + std::to_string(line_no) + ": " + e.what());
      }
    }
    s.note_base_lr();
    s.events.push_back(j["event"]);
    ++s.next_seq;
    ++s.logged;
  }
}

}  // namespace

std::filesystem::path log_file(const std::filesystem::path& file) {
  return std::filesystem::path(file.string() + ".log");
}

nlohmann::json State::to_json() const {
  nlohmann::json j = {{"format", kFormat},
                      {"cluster", cluster.to_json()},
                      {"events", events},
                      {"next_seq", next_seq}};
  if (base_lr) j["base_lr"] = *base_lr;
  return j;
}

void State::note_base_lr() {
  if (!base_lr) base_lr = learning_rate_of(cluster.settings);
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
    if (!is_event(e)) {
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
  if (j.contains("base_lr")) {
    const auto& b = j["base_lr"];
    if (!b.is_number() || !std::isfinite(b.get<double>()) || !(b.get<double>() > 0.0)) {
      throw std::invalid_argument("base_lr must be a positive number");
    }
    s.base_lr = b.get<double>();
  }
  s.note_base_lr();
  return s;
}

State load_state(const std::filesystem::path& file) {
  State s;
  if (const auto text = read_if_present(file)) {
    const auto j = parse_json_or_discard(*text);
    if (j.is_discarded()) fail(file, "corrupt: not valid JSON (or nested deeper than 64 levels)");
    try {
      s = State::from_json(j);
    } catch (const std::invalid_argument& e) {
      fail(file, std::string("corrupt: ") + e.what());
    }
  }
  const auto log = log_file(file);
  if (const auto text = read_if_present(log)) replay_log(log, *text, s);
  return s;
}

void save_state(const std::filesystem::path& file, const State& state) {
  const std::string text = state.to_json().dump(2) + "\n";
  bool durable = true;
  try {
    write_file_atomically(file.string(), {text}, 0600, [&](const std::string& why) {
      durable = false;
      KF_LOG(warn, "config-server", "state file: {}; the log of changes is kept", why);
    });
  } catch (const std::runtime_error& e) {
    fail(file, e.what());
  }
  // A crash may still bring back the old snapshot, and with it the changes since are in the
  // log alone: keep it (a replay skips the records the new snapshot holds).
  if (!durable) return;
  const auto log = log_file(file);
  const int fd = ::open(log.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno != ENOENT) {
      KF_LOG(warn, "config-server", "state file {}: cannot empty it: {}", log.string(),
             std::strerror(errno));
    }
    return;
  }
  if (::fsync(fd) != 0) {
    KF_LOG(warn, "config-server", "state file {}: cannot sync it: {}", log.string(),
           std::strerror(errno));
  }
  ::close(fd);
}

void append_record(const std::filesystem::path& file, const nlohmann::json& event,
                   const Cluster* cluster) {
  const auto log = log_file(file);
  nlohmann::json record = {{"event", event}};
  if (cluster != nullptr) record["cluster"] = cluster->to_json();
  const std::string line = record.dump() + "\n";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) fail_errno(log, "cannot open");
  const off_t before = ::lseek(fd, 0, SEEK_END);
  const auto undo = [&](const std::string& what) {
    const int saved = errno;
    if (before >= 0) [[maybe_unused]]
      const int r = ::ftruncate(fd, before);
    ::close(fd);
    errno = saved;
    fail_errno(log, what);
  };
  for (std::size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) undo("cannot append");
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) undo("cannot sync");
  ::close(fd);
  if (before == 0) {
    // The log may be new: its directory entry must last too.
    const auto dir = log.has_parent_path() ? log.parent_path() : std::filesystem::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
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
