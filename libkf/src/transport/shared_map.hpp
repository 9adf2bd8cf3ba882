// SPDX-License-Identifier: Apache-2.0
// A receiver's mappings of one same-host sender's kf::SharedMemory regions: a single-copy frame
// that names a region (transport::kFlagShared) is read, or reduced, straight from the mapping
// instead of being copied out with process_vm_readv first. The region's memory file is taken
// from the sender with pidfd_getfd (Linux 5.6; the kernel checks the same ptrace rights as for
// process_vm_readv) and mapped read-only, once per region.
// Thread-safety: one connection's, I/O context only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

namespace kf::transport {

class SharedMappings {
 public:
  /// Regions mapped from one sender, at most: a further one unmaps the oldest.
  static constexpr std::size_t kMaxRegions = 8;

  explicit SharedMappings(pid_t pid) noexcept : pid_(pid) {}
  ~SharedMappings();
  SharedMappings(const SharedMappings&) = delete;
  SharedMappings& operator=(const SharedMappings&) = delete;

  /// The sender's bytes [offset, offset + n) of region `id`, whose memory file is descriptor
  /// `fd` in the sender, mapped on first use. Errors: one copy_refused() takes for "not allowed
  /// here" (fall back to copying), or protocol_error with `why` set when the descriptor is not
  /// a memory file sealed against shrinking or the bytes lie past its end.
  std::error_code view(int fd, std::uint64_t id, std::uint64_t offset, std::size_t n,
                       const std::byte*& out, std::string& why);

 private:
  struct Region {
    std::uint64_t id;
    const std::byte* base;
    std::size_t bytes;
  };
  std::error_code map(int fd, Region& r, std::string& why);

  pid_t pid_;
  int pidfd_ = -1;
  std::vector<Region> regions_;  // oldest first
};

}  // namespace kf::transport
