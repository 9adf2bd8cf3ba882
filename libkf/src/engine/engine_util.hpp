// SPDX-License-Identifier: Apache-2.0
// What the engine's files share: the collective's label in messages, the lazy fill of an
// out-of-place work buffer, and the reason a silent peer counts as lost.
// Thread-safety: I/O context only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>

#include "engine/collective.hpp"

namespace kf::detail {

// Copies the parts of [off, off+count) of an out-of-place collective's work buffer that are
// still only in the send buffer.
inline void fill(CollCtx& c, std::size_t es, std::size_t off, std::size_t count) {
  if (!c.lazy_src) return;
  c.filled.for_gaps(off, off + count, [&](std::size_t b, std::size_t e) {
    std::memcpy(c.work + b * es, c.lazy_src + b * es, (e - b) * es);
  });
  c.filled.add(off, off + count);
}

inline std::string label(const CollCtx& c) {
  return std::string(to_string(c.op)) + " '" + c.name + "'";
}

// Why a peer that a timed-out wait depended on counts as lost.
inline std::string no_progress(std::chrono::milliseconds timeout) {
  return "no progress for " + std::to_string(timeout.count()) + " ms";
}

}  // namespace kf::detail
