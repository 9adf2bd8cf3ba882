// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/slots.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace kf::tools::bench {

namespace {

// The buffers rotated through total at least this much: more than any cache level holds.
constexpr std::size_t kRotationBytes = std::size_t{64} << 20;
constexpr std::size_t kPageBytes = 4096;

std::size_t round_to_page(std::size_t bytes) {
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

}  // namespace

Slots::Slots(std::size_t send_bytes, std::size_t recv_bytes, int iterations,
             const Allocate& allocate)
    : send_stride_(round_to_page(send_bytes)), stride_(send_stride_ + round_to_page(recv_bytes)) {
  if (stride_ == 0) return;  // barrier: nothing to rotate
  const std::size_t wanted = (kRotationBytes + stride_ - 1) / stride_;
  count_ = std::clamp<std::size_t>(wanted, 2, std::max(2, iterations));
  if (allocate) {
    memory_ = allocate(count_ * stride_);
  } else {
    memory_.reset(static_cast<std::byte*>(std::aligned_alloc(kPageBytes, count_ * stride_)),
                  [](std::byte* p) { std::free(p); });
  }
  if (!memory_) throw std::bad_alloc();
  warm(memory_.get(), count_ * stride_);
}

// The timed iterations should find their buffers out of cache, as a training step does, but
// otherwise as a job has them after its first steps: mapped, and written before both by the
// kernel (a socket receive, process_vm_readv) and by user code (a reduction, a shared-memory
// copy). A first write inside the timed region costs a page fault per 4 KiB, and on this
// project's VM, whose hypervisor keeps separate shadow page tables for kernel and user mode, a
// first write from each mode costs about 2.7 us per page even when the page is mapped: a
// 256 KiB process_vm_readv into pages only user code had written took 160-260 us, and 20-30 us
// once the kernel had written them before (a memcpy the other way round the same). Neither is
// paid by a training loop, which reuses its buffers, so both modes write every page here.
void Slots::warm(std::byte* p, std::size_t bytes) {
  const int zero = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
  if (zero >= 0) {
    constexpr std::size_t kChunk = std::size_t{1} << 20;
    for (std::size_t at = 0; at < bytes;) {
      const ssize_t n = ::read(zero, p + at, std::min(kChunk, bytes - at));
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    ::close(zero);
  }
  std::memset(p, 0, bytes);
}

}  // namespace kf::tools::bench
