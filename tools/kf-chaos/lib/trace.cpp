// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/trace.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <string_view>

namespace kf::chaos {

namespace {

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> f;
  for (;;) {
    const auto comma = line.find(',');
    f.push_back(line.substr(0, comma));
    if (comma == std::string_view::npos) return f;
    line.remove_prefix(comma + 1);
  }
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

std::vector<TraceEvent> parse_trace(std::istream& in, const std::string& name) {
  std::vector<TraceEvent> events;
  std::set<std::string> up;
  bool header_allowed = true;
  int line_no = 0;
  constexpr std::size_t kMaxLine = 4096;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const auto fail = [&](const std::string& what) {
      return TraceError(name + ":" + std::to_string(line_no) + ": " + what);
    };
    if (raw.size() > kMaxLine) throw fail("line longer than 4096 bytes");
    const std::string_view line = trimmed(raw);
    if (line.empty() || line.front() == '#') continue;
    const auto f = fields_of(line);
    if (f.size() != 3) {
      throw fail("expected 3 fields (t_ms,add|remove,node), found " + std::to_string(f.size()));
    }
    const std::string_view t = trimmed(f[0]), action = trimmed(f[1]), node = trimmed(f[2]);
    std::int64_t t_ms = -1;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), t_ms);
    const bool number = ec == std::errc() && end == t.data() + t.size() && !t.empty();
    if (!number && header_allowed) {
      header_allowed = false;
      continue;
    }
    header_allowed = false;
    if (!number || t_ms < 0) {
      throw fail("time '" + std::string(t) + "' is not a number of milliseconds >= 0");
    }
    if (!events.empty() && t_ms < events.back().t_ms) {
      throw fail("time " + std::to_string(t_ms) + " comes before the row above (" +
                 std::to_string(events.back().t_ms) + ")");
    }
    if (action != "add" && action != "remove") {
      throw fail("action '" + std::string(action) + "' is neither add nor remove");
    }
    if (node.empty() ||
        !std::all_of(node.begin(), node.end(), [](char c) { return c > ' ' && c < 0x7f; })) {
      throw fail("node name '" + std::string(node) + "' is empty or not printable ASCII");
    }
    TraceEvent e{t_ms, action == "add", std::string(node)};
    if (e.add && !up.insert(e.node).second) throw fail("node " + e.node + " is up already");
    if (!e.add && up.erase(e.node) == 0) throw fail("node " + e.node + " is not up");
    events.push_back(std::move(e));
  }
  if (events.empty()) throw TraceError(name + ": no rows");
  if (peak_nodes(events) == 0) throw TraceError(name + ": no node is ever up");
  return events;
}

int peak_nodes(const std::vector<TraceEvent>& trace) {
  int up = 0, peak = 0;
  for (const auto& e : trace) {
    up += e.add ? 1 : -1;
    peak = std::max(peak, up);
  }
  return peak;
}

std::vector<SizeStep> size_steps(const std::vector<TraceEvent>& trace, int max_workers,
                                 double speed) {
  if (max_workers < 1) throw std::invalid_argument("the most workers must be at least 1");
  if (!(speed > 0)) throw std::invalid_argument("the speed must be more than 0");
  const int peak = peak_nodes(trace);
  const auto scaled = [&](int nodes) {
    const double w =
        peak > max_workers
            ? std::round(static_cast<double>(nodes) * max_workers / static_cast<double>(peak))
            : nodes;
    return std::max(1, static_cast<int>(w));
  };
  std::vector<SizeStep> steps;
  int up = 0;
  for (std::size_t i = 0; i < trace.size(); ++i) {
    up += trace[i].add ? 1 : -1;
    // Rows of one time make one change, seen after the last of them.
    if (i + 1 < trace.size() && trace[i + 1].t_ms == trace[i].t_ms) continue;
    const auto at = steps.empty()
                        ? 0
                        : static_cast<std::int64_t>(std::llround(
                              static_cast<double>(trace[i].t_ms - trace.front().t_ms) / speed));
    const int w = scaled(up);
    if (!steps.empty() && steps.back().workers == w) continue;
    if (!steps.empty() && steps.back().at_ms == at) {
      steps.back() = SizeStep{at, w, up};
    } else {
      steps.push_back(SizeStep{at, w, up});
    }
  }
  return steps;
}

}  // namespace kf::chaos
