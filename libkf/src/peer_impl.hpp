// SPDX-License-Identifier: Apache-2.0
// Private side of kf::Peer: composes the driver (who runs the I/O context), the mailbox, the
// mesh and the host engine, and owns the io_context and its I/O thread (kf-io). The user-thread
// side (the current cluster and rank) is set by start() and update() before collectives use it;
// everything else runs on the I/O context. Asio lives only in private headers like this one.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/asio.hpp"
#include "driver/driver.hpp"
#include "engine/collective.hpp"
#include "engine/engine.hpp"
#include "kf/coll/cost_model.hpp"
#include "kf/peer.hpp"
#include "mailbox/mailbox.hpp"
#include "mesh/mesh.hpp"

namespace kf::detail {

class PeerImpl {
 public:
  explicit PeerImpl(PeerOptions opts);
  ~PeerImpl();

  // ---- called from user threads ----
  Endpoint endpoint() const { return mesh_.self(); }
  void start(const Cluster& c);
  void update(const Cluster& c);
  std::vector<Endpoint> lost_peers();
  void watch_arrivals(std::string name);
  bool version_broken() const noexcept {
    const std::uint64_t v = mesh_.broken_version();
    return v != 0 && v == cluster_.version;
  }
  /// Checks a collective's arguments and hands it to the backend of its buffers' device
  /// (backend/submit.cpp).
  Handle submit(std::shared_ptr<CollCtx> ctx);
  Handle invite(const Endpoint& to, std::string payload) {
    return mesh_.invite(to, std::move(payload));
  }
  std::optional<Invitation> wait_invitation(std::chrono::milliseconds timeout) {
    return mesh_.wait_invitation(timeout);
  }
  /// Point-to-point messages (messages.cpp).
  Handle send(int to, std::string_view name, Buffer buf);
  bool try_receive(int from, std::string_view name, Buffer buf);
  Handle receive(int from, std::string_view name, Buffer buf);
  Algorithm resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept;
  /// The device backends in use: "nccl", "staging", "none" or "unavailable: REASON"
  /// (backend/device.cpp).
  std::string device_backend();
  const Mailbox& mailbox() const noexcept { return mailbox_; }
  const Mesh::Counters& counters() const noexcept { return mesh_.counters(); }

  std::atomic<Algorithm> default_algorithm_;  // the job's default, changeable at run time
  // Immutable after start() (set before any collective is submitted).
  Cluster cluster_;
  int rank_ = 0;
  // Every worker on this host and the default transport: `auto` prices messages by
  // coll::kSameHostLink instead of the TCP-sized defaults.
  bool same_host_link_ = false;
  std::shared_ptr<const std::vector<int>> rank_to_peer_;
  // The host of each rank (equal numbers: one host; this host is 0), for hierarchical plans,
  // and how the workers spread over hosts, for `auto`.
  std::shared_ptr<const std::vector<int>> host_of_rank_;
  coll::Topology topology_;
  // Names what resolve() decides from (the worker count, topology_, same_host_link_): a number
  // (from 1) that no other peer of this process had, taken anew at each update().
  static std::uint64_t next_resolve_key() noexcept;
  std::uint64_t resolve_key_ = next_resolve_key();

 private:
  /// Completes `c` at once with invalid_argument and `why`; its handle.
  Handle fail_request(CollCtx& c, const std::string& why);
  /// What is wrong with a collective's arguments, or nothing.
  std::string check_arguments(const CollCtx& c) const;
  /// What is wrong with a message's arguments (`what`: "send to", "receive from"; `role`: the
  /// rank's name in the reason), or nothing.
  std::string check_message(const char* what, int rank, std::string_view name, const Buffer& buf,
                            const char* role) const;
  /// A collective on device buffers, to NCCL or the staging backend (backend/device.cpp).
  Handle submit_device(std::shared_ptr<CollCtx> ctx);
  struct DeviceBackends;
  DeviceBackends& device_backends();
  /// Stops the device backends (their threads submit host collectives): first in ~PeerImpl.
  void close_device();
  void io_loop();
  /// From a user thread: runs the coroutine function `f` on the I/O context and returns what it
  /// returns. Started here when the I/O thread is parked on a waiter's lease (Driver::run_ready).
  template <typename F>
  auto on_io(F&& f) {
    auto done = asio::co_spawn(ioc_, std::forward<F>(f), asio::use_future);
    driver_->run_ready();
    return done.get();
  }

  PeerOptions opts_;
  std::mutex device_mu_;
  std::shared_ptr<DeviceBackends> device_;  // made on the first device collective
  asio::io_context ioc_{1};
  std::shared_ptr<Driver> driver_;
  Mailbox mailbox_{*driver_, ioc_.get_executor(), opts_.max_unexpected_bytes,
                   opts_.max_unexpected_bytes_per_peer};
  Mesh mesh_{opts_, ioc_, *driver_, mailbox_};
  Engine engine_{opts_, ioc_, *driver_, mailbox_, mesh_};
  std::thread io_thread_;
};

}  // namespace kf::detail
