// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/slots.hpp"

#include <algorithm>
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

Slots::Slots(std::size_t send_bytes, std::size_t recv_bytes, int iterations)
    : send_stride_(round_to_page(send_bytes)), stride_(send_stride_ + round_to_page(recv_bytes)) {
  if (stride_ == 0) return;  // barrier: nothing to rotate
  const std::size_t wanted = (kRotationBytes + stride_ - 1) / stride_;
  count_ = std::clamp<std::size_t>(wanted, 2, std::max(2, iterations));
  memory_.reset(static_cast<std::byte*>(std::aligned_alloc(kPageBytes, count_ * stride_)));
  if (!memory_) throw std::bad_alloc();
}

}  // namespace kf::tools::bench
