// SPDX-License-Identifier: Apache-2.0
// The buffers of a benchmark's iterations, used in rotation so that each iteration's buffers
// were last touched (refilled) tens of MiB of traffic earlier: out of every cache level, as a
// training step's gradients are; mapped and written in advance, as after a job's first step.
// Shared by kf-bench and its baselines (tools/bench/baselines), so that all of them measure
// with equally cold buffers. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>

namespace kf::tools::bench {

class Slots {
 public:
  /// Page-aligned memory of the given size, freed when the last copy of the pointer goes.
  using Allocate = std::function<std::shared_ptr<std::byte>(std::size_t bytes)>;

  /// Room for `iterations` pairs of a send buffer of `send_bytes` and a receive buffer of
  /// `recv_bytes` (either may be 0), each page-aligned; at most as many pairs as make 64 MiB,
  /// at least 2. The memory comes from `allocate` (default: the heap). Throws: std::bad_alloc,
  /// or what `allocate` throws.
  Slots(std::size_t send_bytes, std::size_t recv_bytes, int iterations,
        const Allocate& allocate = {});

  /// How many pairs there are; iteration i uses pair i % count().
  std::size_t count() const noexcept { return count_; }
  std::byte* send(std::size_t iteration) const noexcept { return at(iteration); }
  std::byte* recv(std::size_t iteration) const noexcept { return at(iteration) + send_stride_; }

 private:
  std::byte* at(std::size_t iteration) const noexcept {
    return memory_ ? memory_.get() + iteration % count_ * stride_ : nullptr;
  }

  /// Writes every page of [p, p + bytes) from the kernel and from user code (see slots.cpp).
  static void warm(std::byte* p, std::size_t bytes);

  std::size_t send_stride_;
  std::size_t stride_;
  std::size_t count_ = 1;
  std::shared_ptr<std::byte> memory_;
};

}  // namespace kf::tools::bench
