// SPDX-License-Identifier: Apache-2.0
// Hot spares (docs/elastic.md, "Hot spares"): workers started and connected outside the cluster
// (Cluster::spares) that hold a recent commit, so that a loss or a notice moves one in at the
// next step boundary instead of waiting for a process to start and a state to arrive.
//   - Rank 0 sends each spare the last commit (State::snapshot) in the background, as
//     invitation frames of at most 1 MiB ("pieces"): at most once per
//     SessionOptions::spare_sync, one snapshot in flight at a time, and copied on at most a
//     tenth of its time, so that feeding spares costs the job little.
//   - A spare reassembles the pieces (SnapshotAssembler) and takes a whole snapshot into its
//     state; a partial one (its sender lost, a newer push begun) is dropped.
//   - Whoever removes workers that did not mean to leave (the survivors' recovery writer, an
//     agent on a notice) moves spares into the workers in the same compare-and-swap
//     (kf::promote_spares, kf/cluster/cluster.hpp).
// Thread-safety: free functions and single-threaded classes (the training thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/coll/handle.hpp"

namespace kf {
class Peer;
class State;
}  // namespace kf

namespace kf::detail {

/// One piece of a snapshot on its way to a spare.
struct SparePiece {
  std::uint64_t push = 0;   ///< which push it belongs to (the sender's count)
  std::int64_t commit = 0;  ///< the sender's kf.commits at the snapshot
  std::uint64_t offset = 0, total = 0;
  std::string_view data;  ///< bytes [offset, offset + data.size()) of the snapshot
};

/// Whether an invitation's payload is a snapshot piece (not a cluster invitation).
bool is_spare_piece(std::string_view payload) noexcept;
/// The pieces of `snapshot`, each a payload of at most kf's 1 MiB invitation limit.
std::vector<std::string> spare_pieces(std::uint64_t push, std::int64_t commit,
                                      std::string_view snapshot);
/// Throws: std::invalid_argument naming what is wrong (short, out of range).
SparePiece decode_spare_piece(std::string_view payload);

/// A spare's side: pieces in, whole snapshots out.
class SnapshotAssembler {
 public:
  /// Takes one piece from `from`. Returns true when it completes a snapshot (then take() it).
  /// A piece that does not continue the snapshot being assembled starts a new one if it is a
  /// first piece and is dropped otherwise. Throws: std::invalid_argument for a malformed piece.
  bool add(const Endpoint& from, std::string_view payload);
  /// The completed snapshot and its commit count.
  std::string take() noexcept { return std::move(bytes_); }
  std::int64_t commit() const noexcept { return commit_; }

 private:
  Endpoint from_;
  std::uint64_t push_ = 0, total_ = 0;
  std::int64_t commit_ = 0;
  std::string bytes_;
  bool active_ = false;
};

/// A greeting between a spare and the members: each ordered pair of workers has a connection of
/// its own, dialled on its first frame, so a spare and every member greet each other once while
/// it waits, and its move-in finds the connections open (a handshake each, otherwise, in the
/// survivors' pause). Whoever gets one drops it.
bool is_spare_hello(std::string_view payload) noexcept;

/// Sends one greeting to each endpoint it has not greeted yet.
class SpareGreeter {
 public:
  void greet(Peer& peer, const std::vector<WorkerSpec>& to);

 private:
  std::vector<std::string> greeted_;
  std::vector<Handle> pending_;
};

/// Rank 0's side: after each commit, push() begins sending the commit to every spare of
/// `formed` unless a push is still in flight, the last one began less than `interval` ago, or
/// its copy (on the training thread) took more than a tenth of the time since it began.
class SparePusher {
 public:
  explicit SparePusher(std::chrono::milliseconds interval) : interval_(interval) {}
  void push(Peer& peer, const State& state, const Cluster& formed, std::int64_t commit);
  /// Commits sent whole so far (for the logs and tests).
  std::uint64_t pushes_done() const noexcept { return done_; }

 private:
  std::vector<Handle> in_flight_;
  std::chrono::steady_clock::time_point began_{};
  std::chrono::steady_clock::duration copy_time_{};
  std::chrono::milliseconds interval_;
  std::uint64_t pushes_ = 0, done_ = 0;
  bool failed_said_ = false;
};

}  // namespace kf::detail
