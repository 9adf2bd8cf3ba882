// SPDX-License-Identifier: Apache-2.0
// Vocabulary of the collective engine: operations, algorithms, per-call options and the raw
// buffer view. Thread-safety: value types.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

#include "kf/common/dtype.hpp"

namespace kf {

/// Where a buffer's memory is: host memory, or the memory of the calling thread's current CUDA
/// device (cudaSetDevice; kf uses the device that is current when a peer's first device
/// collective is submitted).
enum class Device : std::uint8_t { cpu, cuda };

/// A view of a caller-owned buffer: pointer, element count, element type, device.
/// The caller keeps the memory alive and untouched until the collective's handle completes.
/// A collective may mix a CUDA and a host buffer (send on the device, recv on the host).
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  std::size_t bytes() const noexcept { return count * dtype_bytes(dtype); }
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}

/// A Buffer over a typed array. The const overload is for send buffers: kf never writes to a
/// send buffer unless it is also the receive buffer.
template <typename T>
Buffer buffer(T* p, std::size_t count) {
  return Buffer{p, count, dtype_of<T>(), Device::cpu};
}
template <typename T>
Buffer buffer(const T* p, std::size_t count) {
  return Buffer{const_cast<T*>(p), count, dtype_of<T>(), Device::cpu};
}
/// A Buffer over a typed array in CUDA device memory.
template <typename T>
Buffer cuda_buffer(T* p, std::size_t count) {
  return Buffer{p, count, dtype_of<T>(), Device::cuda};
}
template <typename T>
Buffer cuda_buffer(const T* p, std::size_t count) {
  return Buffer{const_cast<T*>(p), count, dtype_of<T>(), Device::cuda};
}

/// Copies src's bytes into dst, wherever each is: memcpy between host buffers; the CUDA runtime
/// when either is on a device, after the work enqueued on the legacy default stream and before
/// returning. Throws: std::invalid_argument when they differ in bytes;
/// kf::Error(errc::device_error) when CUDA refuses or this build has none.
void copy_buffer(const Buffer& dst, const Buffer& src);

enum class CollOp : std::uint8_t {
  allreduce,
  broadcast,
  allgather,
  reduce_scatter,
  gather,
  barrier,
  consensus
};

/// Algorithms (docs/design.md, "Collectives and algorithms"). job_default takes the job's setting
/// (KF_ALGORITHM or the cluster settings' "algorithm"), whose own default is auto.
/// hierarchical runs an allreduce per host first (docs/design.md, "Hierarchical allreduce"); the
/// other operations run it as ring.
enum class Algorithm : std::uint8_t {
  job_default,
  auto_select,
  star,
  ring,
  tree,
  clique,
  rhd,
  hierarchical
};

std::string_view to_string(CollOp op) noexcept;
std::string_view to_string(Algorithm a) noexcept;
/// Parses "star", "ring", "tree", "clique", "rhd", "hierarchical", "auto"; nullopt otherwise.
std::optional<Algorithm> parse_algorithm(std::string_view s) noexcept;

/// Per-call options (gloo's AllreduceOptions style).
struct CollOptions {
  Algorithm algorithm = Algorithm::job_default;
  ReduceOp op = ReduceOp::sum;  ///< allreduce and reduce_scatter
  int root = 0;                 ///< broadcast and gather
  /// No progress from a peer for this long fails the collective; zero takes the peer's default.
  std::chrono::milliseconds timeout{0};
  /// Device buffers: the CUDA stream (a cudaStream_t) whose work produces the send buffer and
  /// consumes the result. The collective starts after the work enqueued on it so far, without
  /// blocking the host; nullptr is the legacy default stream. Handle::order_on() makes later
  /// work on a stream wait for the result. Ignored for host buffers.
  void* stream = nullptr;
};

}  // namespace kf
