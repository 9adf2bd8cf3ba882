// SPDX-License-Identifier: Apache-2.0
// Pair averaging (the pair-avg mode, docs/training-modes.md): after its own update, a worker
// averages its model with one peer's, chosen by a seeded schedule, without waiting for that
// peer or any other. The exchange is two one-way messages (Peer::send), each applied by its
// receiver whenever it next looks:
//
//   worker a, step s:  pushes a copy m of its model to peer p = schedule(seed, s, a), unless its
//                      last push has not been answered yet (then it skips this step's push);
//   peer p, later:     d = (m - w_p) / 2;  w_p += d;  answers -d to a;
//   worker a, later:   w_a += -d.
//
// Both end at the pair's average when neither moved meanwhile, and whatever they did meanwhile,
// the two additions cancel: the sum of the workers' models changes only by their own updates
// (pair averaging conserves the sum of parameters). What each applies may be stale by the
// steps between the push and its use; the exchange records how many.
//
// Thread-safety: one thread per PairAverager (the training thread), like Peer's collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kf/peer.hpp"

namespace kf {

class PairAverager {
 public:
  /// One step's exchange.
  struct Report {
    int pushed_to = -1;            ///< the rank this step's push went to, or -1 (none)
    int models_averaged = 0;       ///< pushes from others averaged into this worker's model
    int corrections = 0;           ///< answers to this worker's pushes applied
    std::uint64_t bytes_sent = 0;  ///< payload bytes this step sent
    /// Largest |this worker's step − the step a message was sent at| among what it applied.
    std::int64_t max_staleness = 0;
  };

  /// `name` prefixes the messages' names (distinct per model); `seed` the schedule's.
  PairAverager(Peer& peer, std::string name, std::uint64_t seed);
  /// Waits for its own sends to be written (their buffers are its own).
  ~PairAverager();
  PairAverager(const PairAverager&) = delete;
  PairAverager& operator=(const PairAverager&) = delete;

  /// The rank that worker `rank` of `size` pushes to at job step `step` (never itself).
  static int partner(std::uint64_t seed, std::int64_t step, int rank, int size) noexcept;

  /// One step's exchange for this worker's model `w` (float32, host memory) at job step
  /// `step`: applies what came (pushes from others, answers to its own), then pushes to this
  /// step's partner unless its last push is unanswered. Never waits for another worker. The
  /// peer's cluster version changing (a resize, a recovery) drops everything in flight: the
  /// caller makes the models one again then (docs/training-modes.md, "Switching").
  /// With `push` false it only applies what came (to let the exchanges in flight settle).
  /// Throws: std::invalid_argument when w's size changed; kf::Error from Peer's messages.
  Report exchange(std::span<float> w, std::int64_t step, bool push = true);
  /// Whether this worker's last push is still unanswered (in this cluster version).
  bool waiting() const noexcept { return waiting_on_ >= 0 && version_ == peer_.version(); }

 private:
  void start_version();
  void reap_sends(bool wait);

  Peer& peer_;
  std::string model_name_, answer_name_;
  std::uint64_t seed_;
  std::uint64_t version_ = 0;
  std::size_t count_ = 0;
  int waiting_on_ = -1;  // the rank whose answer this worker waits for, or -1
  // Messages are an 8-byte step, then the floats. Buffers of sends in flight stay here.
  std::vector<std::byte> push_, incoming_;
  struct Sending {
    Handle handle;
    std::vector<std::byte> bytes;
  };
  std::vector<Sending> answers_;
  Handle push_handle_;
  bool push_in_flight_ = false;
};

}  // namespace kf
