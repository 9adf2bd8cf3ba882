// SPDX-License-Identifier: Apache-2.0
// Benchmark helper: a series of times in milliseconds, printed as p50, p95 and max.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace kf::test {

struct Series {
  std::vector<double> ms;
  void add(double v) { ms.push_back(v); }
  /// "p50 X  p95 Y  max Z  (n=N)", or "n/a" when empty.
  std::string str() const {
    if (ms.empty()) return "n/a";
    auto s = ms;
    std::sort(s.begin(), s.end());
    const auto q = [&](double p) {
      return s[std::min(s.size() - 1, static_cast<std::size_t>(p * static_cast<double>(s.size())))];
    };
    char buf[128];
    std::snprintf(buf, sizeof buf, "p50 %8.2f  p95 %8.2f  max %8.2f  (n=%zu)", q(0.5), q(0.95),
                  s.back(), s.size());
    return buf;
  }
};

}  // namespace kf::test
