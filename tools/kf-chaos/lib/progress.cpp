// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/progress.hpp"
#include "kf/common/json.hpp"

#include <algorithm>
#include <charconv>
#include <ctime>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kf::chaos {

namespace {

bool number_at(std::string_view s, std::size_t at, std::size_t len, int& out) {
  if (at + len > s.size()) return false;
  const auto [end, ec] = std::from_chars(s.data() + at, s.data() + at + len, out);
  return ec == std::errc() && end == s.data() + at + len;
}

}  // namespace

std::int64_t parse_utc_ms(std::string_view t) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, ms = 0;
  if (t.size() != 24 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' ||
      t[16] != ':' || t[19] != '.' || t[23] != 'Z' || !number_at(t, 0, 4, y) ||
      !number_at(t, 5, 2, mo) || !number_at(t, 8, 2, d) || !number_at(t, 11, 2, h) ||
      !number_at(t, 14, 2, mi) || !number_at(t, 17, 2, s) || !number_at(t, 20, 3, ms) || mo < 1 ||
      mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) {
    return -1;
  }
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return static_cast<std::int64_t>(::timegm(&tm)) * 1000 + ms;
}

Progress read_progress(std::string_view jsonl) {
  std::vector<ProgressPoint> points;
  std::vector<double> batches;
  bool every_batch = true;
  std::istringstream in{std::string(jsonl)};
  for (std::string line; std::getline(in, line);) {
    const auto j = parse_json_or_discard(line);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") ||
        !j["step"].is_number_integer() || !j.contains("time") || !j["time"].is_string() ||
        !j.contains("metrics") || !j["metrics"].is_object()) {
      continue;
    }
    const auto& m = j["metrics"];
    ProgressPoint p;
    p.time_ms = parse_utc_ms(j["time"].get<std::string>());
    if (p.time_ms < 0) continue;
    p.step = j["step"].get<std::int64_t>();
    const double workers = m.contains("kf_cluster_size") && m["kf_cluster_size"].is_number()
                               ? m["kf_cluster_size"].get<double>()
                               : 0;
    p.workers = workers >= 0 && workers <= 1e6 ? static_cast<int>(workers) : 0;
    const double batch = m.contains("kf_global_batch_size") && m["kf_global_batch_size"].is_number()
                             ? m["kf_global_batch_size"].get<double>()
                             : 0;
    every_batch = every_batch && batch > 0;
    points.push_back(p);
    batches.push_back(batch);
  }
  Progress out;
  out.in_samples = every_batch && !points.empty();
  for (std::size_t i = 1; i < points.size(); ++i) {
    const double steps = static_cast<double>(points[i].step - points[i - 1].step);
    points[i].work = points[i - 1].work + steps * (out.in_samples ? batches[i] : 1.0);
  }
  out.points = std::move(points);
  return out;
}

std::int64_t steps_rolled_back(const Progress& p, std::int64_t t0_ms, std::int64_t t1_ms) {
  std::int64_t lost = 0;
  for (std::size_t i = 1; i < p.points.size(); ++i) {
    const auto& now = p.points[i];
    if (now.time_ms <= t0_ms || now.time_ms > t1_ms) continue;
    lost += std::max<std::int64_t>(0, p.points[i - 1].step - now.step);
  }
  return lost;
}

double work_between(const Progress& p, std::int64_t t0_ms, std::int64_t t1_ms) {
  const auto at = [&](std::int64_t t) {
    double w = 0;
    for (const auto& point : p.points) {
      if (point.time_ms > t) break;
      w = point.work;
    }
    return w;
  };
  return at(t1_ms) - at(t0_ms);
}

double work_at_sizes(const Progress& p, const std::map<int, double>& rate, std::int64_t t0_ms,
                     std::int64_t t1_ms) {
  double work = 0;
  for (std::size_t i = 1; i < p.points.size(); ++i) {
    const std::int64_t from = std::max(p.points[i - 1].time_ms, t0_ms);
    const std::int64_t to = std::min(p.points[i].time_ms, t1_ms);
    const auto r = rate.find(p.points[i].workers);
    if (to > from && r != rate.end()) work += r->second * static_cast<double>(to - from) / 1000.0;
  }
  return work;
}

std::optional<std::int64_t> in_effect_after(const Progress& p, std::int64_t from_ms,
                                            std::int64_t until_ms, int workers) {
  for (const auto& point : p.points) {
    if (point.time_ms > until_ms) break;
    if (point.time_ms >= from_ms && point.workers == workers) return point.time_ms - from_ms;
  }
  return std::nullopt;
}

}  // namespace kf::chaos
