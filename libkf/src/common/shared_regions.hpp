// SPDX-License-Identifier: Apache-2.0
// The process's kf::SharedMemory regions, by address: a single-copy send looks up whether its
// payload lies in one, and names it to the receiver (the memory file's descriptor number in this
// process, the region's id and the payload's offset in it) so that the receiver can map it.
// Thread-safety: thread-safe (a mutex; looked up once per single-copy frame, >= 512 KiB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kf::detail {

struct SharedRegionRef {
  int fd = -1;
  /// Unique within this process for its lifetime: a descriptor number may be reused by a later
  /// region, an id never is.
  std::uint64_t id = 0;
  std::uint64_t offset = 0;  ///< of the payload, from the start of the memory file
};

/// The region that holds all of [p, p + n), if one does.
std::optional<SharedRegionRef> find_shared_region(const void* p, std::size_t n);

void add_shared_region(const std::byte* base, std::size_t bytes, int fd);
void remove_shared_region(const std::byte* base);

}  // namespace kf::detail
