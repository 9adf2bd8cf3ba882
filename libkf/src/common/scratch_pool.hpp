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
/// most 8 blocks and `max_bytes` are kept. I/O thread only.
class ScratchPool {
 public:
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
  void release(Block b) {
    if (!b.data || free_.size() >= 8 || b.bytes > max_bytes_ - held_) return;
    held_ += b.bytes;
    free_.push_back(std::move(b));
  }

 private:
  std::vector<Block> free_;
  std::size_t held_ = 0;  // bytes in free_
  std::size_t max_bytes_;
};

}  // namespace kf::detail
