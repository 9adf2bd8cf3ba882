// SPDX-License-Identifier: Apache-2.0
// What the units of kf::DistributedOptimizer share: its Slot and Bucket, and the LibTorch helpers
// both use (distributed_optimizer.cpp: construction, state, model exchange; step.cpp: the step
// and its gradient exchange). Private to the adapter. Thread-safety: free functions.
#pragma once

#include "config.hpp"
#if KF_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstddef>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kf/peer.hpp"
#include "kf/shared_memory.hpp"
#include "kf/torch/distributed_optimizer.hpp"

namespace kf {

struct DistributedOptimizer::Slot {
  torch::Tensor param;
  std::size_t bucket = 0;
  std::size_t offset = 0;  // in the bucket, in floats
  std::size_t numel = 0;
  bool ready = false;  // its gradient is in the bucket for this step
  unsigned hook = 0;
};

struct DistributedOptimizer::Bucket {
  std::size_t index = 0;
  // CPU parameters: the bucket, in memory that same-host peers reduce from in place
  // (kf/shared_memory.hpp), `count` floats of `memory`.
  SharedMemory memory;
  std::span<float> data;
  torch::Tensor dev;  // CUDA parameters: the bucket on their device
  std::size_t count = 0;
  std::vector<std::size_t> slots;
  std::size_t ready = 0;
  bool started = false;
  Handle handle;
  std::unique_ptr<GradientCompressor> compressor;  // while the job's compression is on
};

namespace detail {

// The key of a parameter in Optimizer::state(): the address of its TensorImpl, as text in the
// LibTorch of Debian 12 and as the pointer itself in newer releases (2.11 has void*).
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = StateKey>
Key key_of(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// The stream LibTorch's work on `device` runs on: the collectives start after it and the
// averaged gradients are used on it. Without LibTorch's CUDA headers in the build, the legacy
// default stream (nullptr), which is LibTorch's unless a program picks another.
inline void* torch_stream([[maybe_unused]] const torch::Device& device) {
#if KF_HAVE_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  return nullptr;
#endif
}

inline torch::Tensor sum_of_squares(const torch::Tensor& t) {
  return t.square().sum(torch::kDouble);
}

}  // namespace detail
}  // namespace kf
