// SPDX-License-Identifier: Apache-2.0
// The elastic sampler: splits each epoch of a data set over the workers so that, across any
// sequence of resizes, every sample of the epoch is used exactly once. The epoch is one
// permutation of [0, N) (shuffled from seed and epoch, the same on every worker); a global
// position walks it; each step takes the next global batch from the position and gives rank r
// of n its contiguous share. Only the position has to survive a resize (it lives in kf::State).
// Thread-safety: a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kf {

class ElasticSampler {
 public:
  /// Throws: std::invalid_argument when dataset_size is 0.
  ElasticSampler(std::size_t dataset_size, std::uint64_t seed, bool shuffle = true);

  /// Starts `epoch` at `position` (0 for a fresh epoch, the committed one after a restore).
  /// Throws: std::invalid_argument when position > dataset size.
  void start_epoch(std::int64_t epoch, std::size_t position = 0);

  /// The sample indices rank `rank` of `size` takes for the next step of `global_batch`
  /// samples (fewer at the end of the epoch; possibly none for some ranks). Does not advance.
  std::vector<std::size_t> batch(int rank, int size, std::size_t global_batch) const;
  /// How many samples the next step consumes in total: min(global_batch, remaining).
  std::size_t step_samples(std::size_t global_batch) const noexcept;
  /// Moves the position past the step just taken.
  void advance(std::size_t global_batch) noexcept;

  std::int64_t epoch() const noexcept { return epoch_; }
  std::size_t position() const noexcept { return position_; }
  std::size_t size() const noexcept { return order_.size(); }
  bool epoch_done() const noexcept { return position_ >= order_.size(); }

 private:
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t epoch_ = -1;
  std::size_t position_ = 0;
  std::vector<std::size_t> order_;
};

}  // namespace kf
