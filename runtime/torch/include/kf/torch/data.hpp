// SPDX-License-Identifier: Apache-2.0
// kf::ElasticSampler over a torch::data dataset: the sampler says which examples this worker
// takes at this step (a share of the global batch that follows the cluster's size and the
// settings' batch_size), and elastic_batch() fetches and stacks them. Any
// torch::data::datasets::Dataset<Self, Example<>> works (get(i) and size()).
//
//   kf::ElasticSampler sampler(*dataset.size(), seed);
//   sampler.start_epoch(epoch, position);
//   auto mine = sampler.batch(session->rank(), session->size(), global_batch);
//   torch::data::Example<> b = kf::elastic_batch(dataset, mine);   // b.data, b.target
#pragma once

#include <cstddef>
#include <vector>

#include <torch/torch.h>

#include "kf/runtime/elastic_sampler.hpp"

namespace kf {

/// The examples `indices` of `dataset`, stacked along a new first dimension. An empty list gives
/// an empty Example (undefined tensors).
template <class Dataset>
torch::data::Example<> elastic_batch(Dataset& dataset, const std::vector<std::size_t>& indices) {
  if (indices.empty()) return {};
  std::vector<torch::data::Example<>> examples;
  examples.reserve(indices.size());
  for (std::size_t i : indices) examples.push_back(dataset.get(i));
  return torch::data::transforms::Stack<>().apply_batch(std::move(examples));
}

}  // namespace kf
