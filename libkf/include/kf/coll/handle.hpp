// SPDX-License-Identifier: Apache-2.0
// The handle of an asynchronous collective: a shared completion state that the engine's I/O
// thread completes and any thread may wait on. Thread-safety: all methods may be called from
// any thread, concurrently.
#pragma once

#include <memory>
#include <string>
#include <system_error>

#include "kf/common/error.hpp"

namespace kf {

namespace detail {
struct OpState;
}

class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::OpState> s) : state_(std::move(s)) {}

  /// True once the collective has finished (successfully or not). Never blocks.
  bool ready() const noexcept;
  /// Blocks until the collective finishes. Throws: kf::Error with the failure's code
  /// (errc::peer_lost, errc::timeout, errc::invalid_argument, ...) and a message naming the
  /// collective and the reason.
  void wait() const;
  /// Blocks until the collective finishes and returns its status instead of throwing.
  std::error_code wait_status() const noexcept;
  /// Makes the work enqueued on the CUDA stream `stream` (a cudaStream_t; nullptr is the
  /// legacy default stream) after this call wait for the collective's result, so that a
  /// training step can go on enqueueing work without blocking the host. The NCCL backend
  /// orders without blocking; the staging backend blocks until the result's last copy to the
  /// device has been enqueued; a host collective is waited for. A failure is still reported by
  /// wait(), which must be called (the result's memory is undefined after one).
  /// Throws: kf::Error(errc::device_error) when CUDA refuses; a host collective's failure.
  void order_on(void* stream) const;
  /// The failure's description ("allreduce 'grad#3': peer 127.0.0.1:10002 lost: ..."), or
  /// empty. Valid after completion.
  std::string message() const;

 private:
  std::shared_ptr<detail::OpState> state_;
};

}  // namespace kf
