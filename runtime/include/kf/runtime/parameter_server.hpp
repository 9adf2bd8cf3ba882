// SPDX-License-Identifier: Apache-2.0
// Parameter-server training (the async-ps mode, docs/training-modes.md) over the star shape:
// rank 0 hosts the server's parameters beside its own worker, every worker (rank 0 too) pushes
// its own update of each step to the server and keeps training on its own model, into which
// the server's parameters come as they arrive. Every worker holds one ParameterServer; rank 0's
// also serves.
//
//   worker r, step t:  trains on its model, then pushes δ_r(t) (what its own optimizer changed
//                      this step) with the server version v_r of the view it holds and a weight;
//   server:            takes pushes in the order it serves them; every c of them (soft_sync)
//                      make one update, their mean weighted by each push's weight a_i (its
//                      samples, say; 1 by default):
//                        w_s += Σ a_i δ_i (1/τ_i with scale_lr, else 1) / Σ a_i,
//                      with τ_i = (the version this update makes) − v_i its staleness;
//                      then sends its parameters w_s, with the last step it applied of each
//                      worker, to the workers whose pushes it took;
//   worker r, later:   its model becomes  w_s + Σ its pushes the server has not applied yet.
//
// Two paces, after the session's boundaries (docs/elastic.md):
//
// - In lockstep (a boundary at every step, or no Session given), the server at its step t takes
//   the pushes of step t in rank order and answers every worker. A worker waits only when the
//   view it holds is more than max_staleness steps old: after step t it holds the parameters
//   the server sent at step t − max_staleness or later (0: at step t). The boundary, which every
//   worker passes together, makes the waits safe. With soft_sync = the workers' number,
//   max_staleness 0, plain SGD and each push weighted by its samples, this is synchronous SGD
//   (with any split of the batch).
// - Asynchronously (boundaries on change, Session::boundaries_on_change), every worker counts its
//   own steps and nobody waits for another worker's step. Rank 0 serves, at each of its own
//   steps, the pushes that have come since, and answers their senders. A worker waits only when
//   the server has not applied its own pushes of the last max_staleness steps or more (0: its
//   push of this step); so it waits for rank 0's next step at most. Before rank 0 takes a
//   boundary it answers every worker with a mark that names the boundary: a worker waiting
//   stops waiting and takes that boundary at the end of its step (its waits must not hold the
//   boundary up), and waits no more until it passed it. So a worker's view may be up to two
//   steps staler than the bound in the steps just before a boundary. Messages carry the number of
//   the boundary at which their exchange began, so that a restart drops what was in flight.
//
// Memory: the server keeps its parameters (rank 0); each worker keeps its pushes until the
// server's answer shows them applied (at most max_staleness + 1 of them, two more before a
// boundary, more with soft_sync groups that span steps), and the parameters it has not taken
// yet wait in its mailbox, so a job needs max_unexpected_bytes of at least (max_staleness + 3)
// model sizes on workers, and on rank 0 (size − 1) in lockstep, (max_staleness + 3) per worker
// asynchronously.
//
// Thread-safety: one thread per ParameterServer (the training thread), like Peer's collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "kf/peer.hpp"

namespace kf {

class Session;

class ParameterServer {
 public:
  struct Options {
    int max_staleness = 4;  ///< steps the server's view in a worker's model may lag, >= 0
    int soft_sync = 1;      ///< pushes per server update, >= 1
    bool scale_lr = true;   ///< each push divided by its staleness τ
    bool operator==(const Options&) const = default;
  };

  /// One step's exchange.
  struct Report {
    std::uint64_t bytes_sent = 0;  ///< payload bytes this step sent (pushes, and parameters)
    /// Steps between this step and the one whose server parameters this worker now holds.
    std::int64_t staleness = 0;
    bool waited = false;  ///< whether it waited for the server's parameters
    /// On rank 0: updates the server applied this step, and the largest τ among their pushes.
    int updates = 0;
    std::int64_t max_tau = 0;
  };

  /// `name` prefixes the messages' names (distinct per model). Throws: std::invalid_argument
  /// for max_staleness < 0 or soft_sync < 1. Lockstep only: every step is called between two
  /// boundaries every worker passes together.
  ParameterServer(Peer& peer, std::string name, Options options);
  /// Follows `session`'s pace: asynchronous while its boundaries are on change, else lockstep.
  /// The session outlives the server; step() is called inside Session::step's body.
  ParameterServer(Session& session, std::string name, Options options);
  /// Waits for its own sends to be written (their buffers are its own).
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  /// Step `step` of this worker's model: `w` after its own update, `w_start` before it (float32,
  /// host memory, one size throughout), `weight` the push's weight in its group (its samples).
  /// Pushes w − w_start; on rank 0 serves the pushes (of this step in lockstep, those that came
  /// asynchronously); takes the server's parameters that came (waiting as the staleness bound
  /// requires) and puts them into `w`. Called at every step of the mode, by every worker, with
  /// the session's step count (the job's in lockstep, this worker's own asynchronously). A new
  /// cluster version, or a step that does not follow the last one (the mode was left and taken
  /// again, a rollback), starts afresh from `w_start`, which every worker then holds alike
  /// (docs/training-modes.md, "Switching").
  /// Throws: std::invalid_argument when the sizes differ or change or the weight is not positive
  /// and finite; kf::Error from Peer's messages (a lost worker: Session::step recovers).
  Report step(std::span<float> w, std::span<const float> w_start, std::int64_t step,
              double weight = 1.0);

  /// The server's update count in this version (rank 0), and the server version of the
  /// parameters this worker holds.
  std::uint64_t server_version() const noexcept { return version_; }
  std::uint64_t view_version() const noexcept { return view_version_; }

 private:
  struct Push {  // one of this worker's pushes: [step, view version, weight, epoch] then δ
    std::int64_t step = 0;
    std::vector<std::byte> bytes;
    Handle sent;
    bool in_flight = false;
  };

  void restart(std::span<const float> w_start, std::int64_t step);
  void wait_sends();
  void serve(std::int64_t step, Report& rep);
  void serve_async(std::int64_t step, bool boundary_follows, Report& rep);
  void send_parameters(const std::vector<bool>& to, std::uint64_t mark, Report& rep);
  void take_async(const std::vector<std::byte>& message, std::span<float> w);
  void adopt(const std::vector<std::byte>& message, std::span<float> w);
  void accumulate(int rank, std::int64_t step, std::uint64_t view, double weight,
                  const float* delta, Report& rep);
  void take_parameters(const std::vector<std::byte>& message, std::span<float> w);

  Peer& peer_;
  Session* session_ = nullptr;  // the pace: asynchronous while its boundaries are on change
  std::string push_name_, params_name_;
  Options options_;
  std::size_t count_ = 0;
  std::uint64_t cluster_version_ = 0;
  std::int64_t last_step_ = -2;
  std::int64_t first_step_ = 0;  // of this run of the mode: parameters sent before it are old
  int size_ = 0, rank_ = 0;
  bool async_ = false;       // since the last restart
  std::uint64_t epoch_ = 0;  // asynchronously: the boundary in this version it restarted after

  // Worker side.
  std::deque<Push> pushes_;         // not yet applied by the server, as far as this worker knows
  std::int64_t view_step_ = 0;      // the step whose server parameters this worker holds
  std::uint64_t view_version_ = 0;  // and their server version
  std::vector<std::byte> incoming_;
  std::int64_t applied_mine_ = 0;  // asynchronously: this worker's last push the view holds
  std::uint64_t marked_ = 0;       // asynchronously: the boundary rank 0 announced last

  // Server side (rank 0). Its parameters message: [step, version, epoch, boundary mark (0 or
  // the boundary rank 0 is about to take), applied step per rank (size values)] then w_s, one
  // buffer sent to every worker.
  std::vector<std::byte> params_;
  std::vector<Handle> params_sent_;
  double group_weight_ = 0;                          // Σ of the pending group's weights
  std::vector<float> group_sum_;                     // Σ of the pending group's scaled pushes
  std::vector<std::pair<int, std::int64_t>> group_;  // their (rank, step)
  std::vector<std::int64_t> applied_;  // per rank: the last step whose push is applied
  std::uint64_t version_ = 0;
  std::vector<std::byte> push_in_;
};

}  // namespace kf
