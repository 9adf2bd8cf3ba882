// SPDX-License-Identifier: Apache-2.0
// The values kf-bench puts in its buffers, and the checks of the results. Every value is a small
// non-negative integer chosen so that every reduction over the job's workers stays exact in every
// dtype (bf16 holds integers up to 256 exactly, u8 up to 255): sums stay at or below 254, min
// and max see values 0-250, and products (values 1 and 2, the 2s only on workers 0-6) stay at
// or below 128. The value of element e of worker r in iteration t depends on (e + t) modulo a
// prime period, so the checks compare bytes against a precomputed table, consecutive iterations
// expect different values, and a block at the wrong offset does not match.
// A receive buffer is poisoned with all-ones bytes before each use: NaN for the float types, -1
// for the signed ones and 255 for u8, none of which is ever a valid result.
// Thread-safety: immutable after construction; const methods may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kf/common/dtype.hpp"

namespace kf::tools::bench {

class Pattern {
 public:
  /// Tables for `workers` workers reducing with `op` (any op for the non-reducing collectives).
  /// Throws: std::invalid_argument when workers < 1.
  Pattern(DType dtype, ReduceOp op, int workers);

  /// Writes worker `rank`'s values of elements [first, first + count) for iteration `iter`.
  void fill(void* dst, std::size_t count, int rank, std::size_t first, std::uint64_t iter) const;
  /// Whether `got` holds worker `rank`'s values of elements [first, first + count).
  bool matches_rank(const void* got, std::size_t count, int rank, std::size_t first,
                    std::uint64_t iter) const;
  /// Whether `got` holds the reduction over all workers of elements [first, first + count).
  bool matches_reduced(const void* got, std::size_t count, std::size_t first,
                       std::uint64_t iter) const;

  /// Writes the poison (all-ones bytes) over `count` elements.
  void poison(void* dst, std::size_t count) const;

 private:
  // Tables hold 2 * length_ elements so that any start offset below length_ is followed by
  // length_ contiguous elements.
  std::size_t offset(std::size_t first, std::uint64_t iter) const noexcept;
  bool matches(const std::vector<std::byte>& table, const void* got, std::size_t count,
               std::size_t first, std::uint64_t iter) const;

  std::size_t element_bytes_;
  std::size_t length_;                         // a multiple of the values' period
  std::vector<std::vector<std::byte>> ranks_;  // one table per worker
  std::vector<std::byte> reduced_;
};

}  // namespace kf::tools::bench
