// SPDX-License-Identifier: Apache-2.0
// RangeSet: which element ranges of a work buffer hold data yet (coll/exec). Pure data, no I/O.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

#include <boost/container/small_vector.hpp>

namespace kf::detail {

/// Disjoint half-open ranges of elements, merged on insertion: which parts of an out-of-place
/// allreduce's receive buffer hold data yet (the rest is still only in the send buffer). Kept
/// sorted by start in a small inline vector: a collective has a handful of ranges at most.
class RangeSet {
 public:
  void add(std::size_t b, std::size_t e) {
    if (b >= e) return;
    auto it = upper_bound(*this, b);
    if (it != r_.begin() && std::prev(it)->second >= b) --it;
    // [it, last) are the ranges that touch or overlap [b, e): merged into one.
    auto last = it;
    while (last != r_.end() && last->first <= e) {
      b = std::min(b, last->first);
      e = std::max(e, last->second);
      ++last;
    }
    if (it == last) {
      r_.insert(it, {b, e});
      return;
    }
    *it = {b, e};
    r_.erase(it + 1, last);
  }
  bool disjoint(std::size_t b, std::size_t e) const {
    auto it = upper_bound(*this, b);
    if (it != r_.begin() && std::prev(it)->second > b) return false;
    return it == r_.end() || it->first >= e;
  }
  /// Calls f(gb, ge) for every part of [b, e) not in the set.
  template <typename F>
  void for_gaps(std::size_t b, std::size_t e, F&& f) const {
    std::size_t at = b;
    auto it = upper_bound(*this, b);
    if (it != r_.begin()) --it;
    for (; it != r_.end() && it->first < e; ++it) {
      if (it->second <= at) continue;
      if (it->first > at) f(at, std::min(it->first, e));
      at = std::max(at, it->second);
      if (at >= e) return;
    }
    if (at < e) f(at, e);
  }

 private:
  using Ranges = boost::container::small_vector<std::pair<std::size_t, std::size_t>, 4>;
  /// The first range that starts after b (in r_, const or not).
  template <typename Self>
  static auto upper_bound(Self& self, std::size_t b) -> decltype(self.r_.begin()) {
    return std::upper_bound(self.r_.begin(), self.r_.end(), b,
                            [](std::size_t v, const auto& r) { return v < r.first; });
  }
  Ranges r_;
};

}  // namespace kf::detail
