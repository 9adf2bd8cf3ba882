// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/elastic_sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace kf {

ElasticSampler::ElasticSampler(std::size_t dataset_size, std::uint64_t seed, bool shuffle)
    : seed_(seed), shuffle_(shuffle), order_(dataset_size) {
  if (dataset_size == 0) throw std::invalid_argument("ElasticSampler: the data set is empty");
  std::iota(order_.begin(), order_.end(), std::size_t{0});
}

void ElasticSampler::start_epoch(std::int64_t epoch, std::size_t position) {
  if (position > order_.size()) {
    throw std::invalid_argument("ElasticSampler: position " + std::to_string(position) +
                                " is past the end of a data set of " +
                                std::to_string(order_.size()) + " samples");
  }
  std::iota(order_.begin(), order_.end(), std::size_t{0});
  if (shuffle_) {
    // mt19937_64 and a hand-rolled Fisher-Yates: std::shuffle's use of the engine is not
    // specified, and every worker (and every library version) must produce the same order.
    std::mt19937_64 rng(seed_ ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(epoch + 1)));
    for (std::size_t i = order_.size() - 1; i > 0; --i) {
      const std::size_t j = static_cast<std::size_t>(rng() % (i + 1));
      std::swap(order_[i], order_[j]);
    }
  }
  epoch_ = epoch;
  position_ = position;
}

std::size_t ElasticSampler::step_samples(std::size_t global_batch) const noexcept {
  return std::min(global_batch, order_.size() - std::min(position_, order_.size()));
}

std::vector<std::size_t> ElasticSampler::batch(int rank, int size, std::size_t global_batch) const {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("ElasticSampler: rank " + std::to_string(rank) +
                                " is not in a cluster of " + std::to_string(size));
  }
  const std::size_t take = step_samples(global_batch);
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  const std::size_t base = take / n, extra = take % n;
  const std::size_t begin = position_ + r * base + std::min(r, extra);
  const std::size_t count = base + (r < extra ? 1 : 0);
  return std::vector<std::size_t>(order_.begin() + static_cast<std::ptrdiff_t>(begin),
                                  order_.begin() + static_cast<std::ptrdiff_t>(begin + count));
}

std::vector<std::size_t> ElasticSampler::range(std::size_t first, std::size_t count) const {
  const std::size_t left = order_.size() - std::min(position_, order_.size());
  if (first > left || count > left - first) {
    throw std::invalid_argument("ElasticSampler: samples " + std::to_string(first) + " to " +
                                std::to_string(first + count) + " of the step pass the " +
                                std::to_string(left) + " left in the epoch");
  }
  const std::size_t begin = position_ + first;
  return std::vector<std::size_t>(order_.begin() + static_cast<std::ptrdiff_t>(begin),
                                  order_.begin() + static_cast<std::ptrdiff_t>(begin + count));
}

std::vector<std::size_t> ElasticSampler::split(std::size_t samples, std::span<const double> weights,
                                               int size) {
  if (size < 1) {
    throw std::invalid_argument("ElasticSampler::split: " + std::to_string(size) + " parts");
  }
  const auto n = static_cast<std::size_t>(size);
  if (!weights.empty() && weights.size() != n) {
    throw std::invalid_argument("ElasticSampler::split: " + std::to_string(weights.size()) +
                                " weights for " + std::to_string(n) + " parts");
  }
  std::vector<std::size_t> parts(n);
  bool weighted = !weights.empty() && samples >= n;
  double total = 0;
  for (double w : weights) {
    weighted = weighted && std::isfinite(w) && w > 0;
    total += w;
  }
  weighted = weighted && std::isfinite(total);
  if (!weighted) {
    for (std::size_t r = 0; r < n; ++r) parts[r] = samples / n + (r < samples % n ? 1 : 0);
    return parts;
  }
  // One sample each, then the rest by weight: floors first, the remainder by largest fraction.
  const std::size_t rest = samples - n;
  std::vector<double> fraction(n);
  std::size_t given = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const double share = static_cast<double>(rest) * weights[r] / total;
    const auto whole = std::min(rest, static_cast<std::size_t>(share));
    parts[r] = 1 + whole;
    fraction[r] = share - static_cast<double>(whole);
    given += whole;
  }
  std::vector<std::size_t> order(n);
  for (std::size_t r = 0; r < n; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return fraction[a] > fraction[b]; });
  for (std::size_t i = 0; given < rest; i = (i + 1) % n, ++given) ++parts[order[i]];
  // Rounding could, in principle, floor a share above its exact value: take any excess back
  // from the largest parts.
  while (given > rest) {
    --*std::max_element(parts.begin(), parts.end());
    --given;
  }
  return parts;
}

void ElasticSampler::advance(std::size_t global_batch) noexcept {
  position_ += step_samples(global_batch);
}

}  // namespace kf
