// SPDX-License-Identifier: Apache-2.0
// The NCCL backend: collectives on device buffers enqueued by NCCL on a stream of kf's own, after
// the work enqueued on the caller's stream (a side stream: they overlap the caller's next work).
// One communicator per cluster version, made when the version's first device collective is
// submitted: a version that only lost members shrinks the previous one (ncclCommShrink,
// NCCL >= 2.27), any other makes a new one from a unique id that rank 0 broadcasts over kf's
// own transport (docs/gpu.md). Communicators are non-blocking (config.blocking = 0), so that no
// NCCL call can hang: a watcher thread looks at the communicator's asynchronous error and at the
// mesh's lost peers while collectives run, and revokes (NCCL >= 2.28) or aborts the communicator
// when a peer is gone, which ends the collectives running on it with errc::peer_lost. Built only
// with NCCL (KF_HAVE_NCCL). Thread-safety: run() may be called from any thread; calls are
// serialised, and must be made in the same order on every worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/device_api.hpp"
#include "kf/cluster/cluster.hpp"
#include "kf/coll/handle.hpp"

namespace kf::detail {

struct CollCtx;

class NcclBackend {
 public:
  /// What the backend needs of its peer: a host collective (for the unique id), the members of
  /// the current version that are lost, and how long a communicator may take to form.
  struct PeerHooks {
    std::function<Handle(std::shared_ptr<CollCtx>)> host_submit;
    std::function<std::vector<Endpoint>()> lost_peers;
    std::chrono::milliseconds init_timeout{20000};
  };
  /// Throws: kf::Error(errc::device_error) when NCCL cannot be used here.
  NcclBackend(std::shared_ptr<DeviceApi> api, PeerHooks hooks);
  /// Aborts the communicator (collectives still running on it fail) and stops the watcher.
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  /// Enqueues `c` (arguments checked, state set, consensus excluded) on its stream, with the
  /// communicator of `cluster` (the version `c` was submitted in), making that first if need
  /// be. Completes c's state with an error when it cannot.
  void run(std::shared_ptr<CollCtx> c, const Cluster& cluster);
  /// "NCCL 2.28.9".
  std::string name() const;

  /// Timings of the last communicator change, for kf-bench (milliseconds).
  struct Timings {
    double init_ms = 0;    // a fresh communicator: unique id broadcast and init
    double shrink_ms = 0;  // ncclCommShrink
    bool last_was_shrink = false;
  };
  Timings timings() const;

  struct Comm;

 private:
  /// The communicator of `cluster`'s version; made if need be. Called under mu_.
  /// Throws: kf::Error naming why it could not be made.
  std::shared_ptr<Comm> comm_for(const Cluster& cluster, int rank);
  std::shared_ptr<Comm> fresh(const Cluster& cluster, int rank);
  std::shared_ptr<Comm> shrunk(Comm& old, const Cluster& cluster, int rank);
  /// Waits until a non-blocking call on `c` is done; gives up early when one of c's members is
  /// lost (`watch_members`). Throws: kf::Error.
  void settle(Comm& c, const char* what, std::chrono::milliseconds limit,
              bool watch_members = true);
  /// settle() for a communicator being made: aborted when it does not form.
  void settle_new(Comm& c, const char* what);
  std::shared_ptr<Comm> current() const;
  /// Marks `c` failed and stops what runs on it (revoke or abort).
  void fail_comm(Comm& c, std::error_code ec, const std::string& why);
  void watch();

  std::shared_ptr<DeviceApi> api_;
  PeerHooks hooks_;
  void* comm_stream_ = nullptr;  // NCCL's collectives run here, after the caller's stream
  std::mutex mu_;                // serialises run(), communicator changes and failures
  mutable std::mutex comm_mu_;   // comm_ itself, which the watcher reads
  std::shared_ptr<Comm> comm_;
  Timings timings_;
  std::atomic<int> running_{0};  // collectives enqueued and not yet completed
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stop_ = false;
  std::thread watcher_;
};

}  // namespace kf::detail
