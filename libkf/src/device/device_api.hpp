// SPDX-License-Identifier: Apache-2.0
// The few CUDA runtime calls that kf's device backends make, behind one interface: the CUDA
// runtime itself (device/cuda_api.cpp, in builds with CUDA), or host memory standing in for a
// device (device/standin.cpp), so that the staging backend's logic runs where no GPU is.
// Thread-safety: every method may be called from any thread whose current CUDA device is the
// API's (bind_thread); the callbacks of call_after run on a thread of the API's.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace kf::detail {

/// A mark in a stream: done once everything enqueued on the stream before it is done.
using DeviceEvent = std::shared_ptr<void>;

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  /// "CUDA device 0 (NVIDIA H100 80GB HBM3)", or "host stand-in".
  virtual std::string name() const = 0;
  /// Whether this is a real CUDA device (NCCL can use it), not the stand-in.
  virtual bool is_cuda() const noexcept = 0;
  /// Page-locked host memory, which copies to and from the device read and write directly.
  /// Throws: kf::Error(errc::device_error).
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* p) noexcept = 0;
  /// Device memory (tests and benchmarks). Throws: kf::Error(errc::device_error).
  virtual void* alloc_device(std::size_t bytes) = 0;
  virtual void free_device(void* p) noexcept = 0;
  /// A stream of kf's own that does not wait for the legacy default stream.
  virtual void* create_stream() = 0;
  virtual void destroy_stream(void* stream) noexcept = 0;
  /// Enqueues a copy of `bytes` bytes; either side may be in host or in device memory.
  virtual void copy(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  /// Enqueues a call of `f` once the work enqueued before it is done, on a thread of the API's
  /// that runs such calls in order. `f` must return quickly; it may release events and
  /// page-locked memory, but must not wait for a stream.
  virtual void call_after(void* stream, std::function<void()> f) = 0;
  /// A mark after the work enqueued on `stream` so far.
  virtual DeviceEvent record(void* stream) = 0;
  /// Work enqueued on `stream` from now on waits for `e` first.
  virtual void wait(void* stream, const DeviceEvent& e) = 0;
  /// Whether `e` is done; never blocks. Throws: kf::Error(errc::device_error) on a device fault.
  virtual bool done(const DeviceEvent& e) = 0;
  /// Blocks until the work enqueued on `stream` is done.
  virtual void synchronize(void* stream) = 0;
  /// Makes the calling thread use the API's device (for kf's own threads).
  virtual void bind_thread() = 0;
};

/// A thread of kf's own that works with `api`: named `name` (at most 15 characters) and bound
/// to the API's device; a failure to bind is logged (the thread's calls then fail and say why).
void start_device_thread(DeviceApi& api, const char* name) noexcept;

/// The CUDA runtime on the calling thread's current device; nullptr, with the reason in `why`,
/// when this build has no CUDA or no device can be used.
std::shared_ptr<DeviceApi> cuda_device_api(std::string& why);
/// Host memory standing in for a device: "device" memory is host memory, and each stream is a
/// thread that runs its work in order. The staging backend's tests run on it.
std::shared_ptr<DeviceApi> standin_device_api();

/// The API that peers created from now on use for device buffers: the one set by
/// set_device_api_for_tests, else cuda_device_api.
std::shared_ptr<DeviceApi> device_api(std::string& why);
/// Tests: makes peers created from now on use `api` (nullptr: back to CUDA).
void set_device_api_for_tests(std::shared_ptr<DeviceApi> api);

}  // namespace kf::detail
