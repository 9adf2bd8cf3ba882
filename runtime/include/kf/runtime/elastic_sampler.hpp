// SPDX-License-Identifier: Apache-2.0
// The elastic sampler: splits each epoch of a data set over the workers so that, across any
// sequence of resizes, every sample of the epoch is used exactly once. The epoch is one
// permutation of [0, N) (shuffled from seed and epoch, the same on every worker); a global
// position walks it; each step takes the next global batch from the position and gives rank r
// of n its contiguous share (equal, or by weights: split() and range()). Only the position has to
// survive a resize (it lives in kf::State).
// Thread-safety: a value type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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
  /// The `count` sample indices at `first` in the next step (a part from split()). Does not
  /// advance. Throws: std::invalid_argument when the part passes the step's end (the epoch's).
  std::vector<std::size_t> range(std::size_t first, std::size_t count) const;
  /// Splits a step of `samples` samples into `size` parts in rank order. With no weights (or
  /// any not positive and finite), equal parts as batch() takes them; with a weight per rank,
  /// parts proportional to them, each at least 1 sample while there are `size` or more, the
  /// remainder going to the largest fractions (ties to the lower rank). The same on every
  /// worker for the same arguments. Throws: std::invalid_argument when size < 1 or the weights
  /// are neither empty nor one per rank.
  static std::vector<std::size_t> split(std::size_t samples, std::span<const double> weights,
                                        int size);
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
