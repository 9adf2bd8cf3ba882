// SPDX-License-Identifier: Apache-2.0
// kf::SharedMemory: host memory that other workers on this host read in place. A collective
// whose buffer lies in one is not copied out of this process by its same-host peers
// (process_vm_readv, then a second pass to reduce): a peer maps the memory once and reduces or
// copies straight from it, which is what a large allreduce between workers on one host is
// bounded by (docs/performance.md, "What bounds 64 MiB"). Buffers anywhere else work as before.
//
// Ownership: the object owns the mapping and the anonymous memory file (memfd) behind it. A peer
// that mapped it keeps its mapping, and with it the memory, until its connection from this
// worker closes or it has mapped 8 newer ones from this worker: free and allocate such buffers
// rarely (a gradient bucket, a fusion buffer), not per step.
// Thread-safety: the object is not synchronised; its memory is ordinary memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kf {

class SharedMemory {
 public:
  SharedMemory() noexcept = default;
  /// At least `bytes` of zeroed memory (whole pages), page-aligned. Throws std::system_error
  /// naming the call the kernel refused (memfd_create, ftruncate, mmap).
  explicit SharedMemory(std::size_t bytes);
  ~SharedMemory();
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  std::byte* data() const noexcept { return data_; }
  /// The bytes asked for (the mapping may be larger, up to a whole page).
  std::size_t size() const noexcept { return size_; }
  /// The memory as `size() / sizeof(T)` elements of T.
  template <class T>
  std::span<T> as() const noexcept {
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
  int fd_ = -1;
};

}  // namespace kf
