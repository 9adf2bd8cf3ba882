// SPDX-License-Identifier: Apache-2.0
// The staging backend: collectives on device buffers run by the host engine through page-locked
// host buffers. Copies to the host are enqueued at once on a copy stream (after the caller's
// stream); a staging thread starts each chunk's host collective as soon as its data is on the
// host, and enqueues its copy back to the device as soon as it is done, so that one chunk's
// copies overlap another's transfer. Allreduce and broadcast go in chunks of
// PeerOptions::staging_chunk_bytes; the other operations in one piece.
// Thread-safety: run() may be called from any thread; the rest is the staging thread's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "device/device_api.hpp"
#include "kf/coll/handle.hpp"

namespace kf::detail {

struct CollCtx;

/// Page-locked host blocks, kept for reuse: a training job stages the same few sizes every
/// step, and cudaHostAlloc costs milliseconds. Blocks come back from any thread (a copy's
/// callback); memory is allocated and freed only by take() and the destructor.
class PinnedPool {
 public:
  /// Free blocks beyond `keep_bytes` in all are given back to the device runtime.
  PinnedPool(DeviceApi& api, std::size_t keep_bytes) : api_(api), keep_(keep_bytes) {}
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  class Block {
   public:
    Block() = default;
    Block(PinnedPool* pool, std::byte* data, std::size_t capacity)
        : pool_(pool), data_(data), capacity_(capacity) {}
    Block(Block&& o) noexcept { *this = std::move(o); }
    Block& operator=(Block&& o) noexcept {
      if (this != &o) {
        reset();
        pool_ = std::exchange(o.pool_, nullptr);
        data_ = std::exchange(o.data_, nullptr);
        capacity_ = std::exchange(o.capacity_, 0);
      }
      return *this;
    }
    ~Block() { reset(); }
    std::byte* data() const noexcept { return data_; }
    void reset() noexcept;

   private:
    PinnedPool* pool_ = nullptr;
    std::byte* data_ = nullptr;
    std::size_t capacity_ = 0;
  };
  /// A block of at least `bytes` bytes. Throws: kf::Error(errc::device_error).
  Block take(std::size_t bytes);
  /// Bytes held by the pool, in use or free (tests).
  std::size_t held_bytes() const;

 private:
  void give(std::byte* data, std::size_t capacity) noexcept;
  DeviceApi& api_;
  const std::size_t keep_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, std::byte*> free_;  // by capacity
  std::size_t free_bytes_ = 0, held_bytes_ = 0;
};

class StagingBackend {
 public:
  /// Starts a host collective over host buffers (PeerImpl::submit).
  using HostSubmit = std::function<Handle(std::shared_ptr<CollCtx>)>;
  StagingBackend(std::shared_ptr<DeviceApi> api, std::size_t chunk_bytes, HostSubmit submit);
  /// Fails the collectives not started yet (errc::closed), waits for those running, and stops
  /// the staging thread.
  ~StagingBackend();
  StagingBackend(const StagingBackend&) = delete;
  StagingBackend& operator=(const StagingBackend&) = delete;

  /// Runs `c`, whose arguments were checked and whose state is set: sets c->state->device and
  /// enqueues its copies to the host. Completes the state with errc::device_error when CUDA
  /// refuses.
  void run(std::shared_ptr<CollCtx> c);
  DeviceApi& api() const noexcept { return *api_; }
  const PinnedPool& pool() const noexcept { return pool_; }

  struct Op;

 private:
  void start(std::shared_ptr<CollCtx> c);  // run()'s work; throws what CUDA throws
  void loop();
  void process(const std::shared_ptr<Op>& op);
  void finish(const std::shared_ptr<Op>& op, std::error_code ec, std::string why);

  std::shared_ptr<DeviceApi> api_;
  const std::size_t chunk_bytes_;
  HostSubmit submit_;
  PinnedPool pool_;
  void* to_host_ = nullptr;    // copies in (device to host)
  void* to_device_ = nullptr;  // copies out (host to device)
  std::mutex enqueue_mu_;      // an op's copies in and its place in the queue go together
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kf::detail
