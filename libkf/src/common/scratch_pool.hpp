// SPDX-License-Identifier: Apache-2.0
// Reusable buffers for collectives' work space and for frames that arrive early.
// Thread-safety: none (each pool belongs to the I/O context).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace kf::detail {

/// Reusable buffers, so that large collectives do not page-fault fresh memory on every call: at
/// most kMaxBlocks blocks and `max_bytes` are kept, the ones given back last. I/O thread only.
class ScratchPool {
 public:
  static constexpr std::size_t kMaxBlocks = 8;
  explicit ScratchPool(std::size_t max_bytes = SIZE_MAX) : max_bytes_(max_bytes) {}
  struct Block {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
  };
  /// The smallest kept block of at least `bytes`, or a new one (not zeroed).
  Block acquire(std::size_t bytes) {
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes)) {
        best = i;
      }
    }
    if (best == free_.size()) {
      return Block{std::make_unique_for_overwrite<std::byte[]>(bytes), bytes};
    }
    Block b = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    held_ -= b.bytes;
    return b;
  }
  /// Keeps `b` for reuse. When the pool is full, the blocks it has kept longest make room: a job
  /// whose sizes change (a larger bucket, another batch size) then keeps blocks of the sizes it
  /// uses now. Keeping the old ones instead left a pool of blocks all too small for it, and every
  /// call page-faulted fresh memory (4 workers, tree allreduce of 64 MiB after 16 MiB: 244
  /// against 99 ms).
  void release(Block b) {
    if (!b.data || b.bytes > max_bytes_) return;
    std::size_t drop = 0;  // the oldest blocks, at the front
    while (drop < free_.size() &&
           (free_.size() - drop >= kMaxBlocks || b.bytes > max_bytes_ - held_)) {
      held_ -= free_[drop++].bytes;
    }
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(drop));
    held_ += b.bytes;
    free_.push_back(std::move(b));
  }
  /// Blocks kept, and their bytes.
  std::size_t blocks() const noexcept { return free_.size(); }
  std::size_t bytes_held() const noexcept { return held_; }

 private:
  std::vector<Block> free_;  // oldest first
  std::size_t held_ = 0;     // bytes in free_
  std::size_t max_bytes_;
};

}  // namespace kf::detail
