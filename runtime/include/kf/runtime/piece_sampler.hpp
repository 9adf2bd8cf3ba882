// SPDX-License-Identifier: Apache-2.0
// kf::PieceSampler: the data plan of a training loop under boundaries on change (settings
// "boundaries": "on-change", docs/elastic.md). Workers that step at their own pace have no common
// step number, so they cannot take "step s of the epoch's order" as ElasticSampler's loops do.
// Instead, at each boundary, the samples of the epoch not used yet are cut into one piece per
// worker (in the epoch's shuffled order, equal counts in rank order), and each worker takes its
// batches from its own piece, at its own pace:
//
//   - what a worker used is one byte per sample in the kf::State ("<name>.used"), so it follows
//     commits, rollbacks and syncs exactly as the model does;
//   - right after a boundary that changed nothing, every worker is at the same point: one
//     allreduce (max) joins the workers' used sets, and the next plan is cut from the union;
//   - after a change the workers hold one worker's state (the session's sync), with the samples
//     that worker used: those the others used since the last plan are used again, since their
//     training is not in that state either;
//   - a worker through its piece asks for a boundary (Session::request_boundary) and takes no
//     samples until it comes; the epoch ends at the first plan that finds every sample used.
//
// The loop calls settle() before each step, outside Session::step (right after the boundary, where
// every worker is), and take() for the step's samples. With boundaries at every step it works too
// (a plan at every boundary), but ElasticSampler is cheaper there.
// Thread-safety: one thread (the training loop's), like the session.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/state.hpp"

namespace kf {

class PieceSampler {
 public:
  /// Registers its buffer and counters in `state` (before Session::join). Throws:
  /// std::invalid_argument when dataset_size is 0.
  PieceSampler(std::size_t dataset_size, std::uint64_t seed, State& state,
               const std::string& name = "kf.pieces");

  /// Before each step: when the session passed a boundary or changed since the last plan, joins
  /// the used sets (after a boundary without a change), ends the epoch when nothing is left, and
  /// cuts the next plan. Returns the session's outcome when that allreduce failed and the session
  /// recovered (rolled_back: call settle() again; left: this worker leaves), nullopt otherwise.
  /// Throws what Session::recover throws.
  std::optional<Session::Outcome> settle(Session& session);

  /// This worker's next `count` samples of its piece (fewer at its end, none once through),
  /// marked used; asks for a boundary when they end the piece. Call after settle().
  std::vector<std::size_t> take(Session& session, std::size_t count);

  /// What the last settle() did: kept the plan (no boundary since), or cut a new one after a
  /// boundary without a change (the used sets joined) or after a change (or the first).
  enum class Settled { kept, after_boundary, after_change };
  Settled last_settle() const noexcept { return settled_; }
  std::int64_t epoch() const noexcept { return *epoch_; }  ///< epochs completed
  /// Whether the last plan began a new epoch (every sample of the one before was used).
  bool epoch_ended() const noexcept { return epoch_ended_; }
  /// Samples of the current epoch used by the job, as of the last plan (the same on every
  /// worker).
  std::size_t used_at_plan() const noexcept { return used_at_plan_; }
  /// Samples left in this worker's piece.
  std::size_t left() const noexcept;
  std::size_t size() const noexcept { return used_.size(); }

  /// The piece of `rank` of `size`: the samples of `order` (an epoch's order) whose `used` byte
  /// is 0, cut into `size` runs of equal length (the first ones shorter by at most one), in
  /// rank order. The same on every worker for the same arguments.
  static std::vector<std::size_t> cut(std::span<const std::size_t> order,
                                      std::span<const std::uint8_t> used, int rank, int size);

 private:
  ElasticSampler order_;
  std::vector<std::uint8_t> used_;
  std::int64_t* epoch_;
  std::int64_t* plan_version_;
  std::int64_t* plan_index_;
  std::int64_t* cursor_;
  std::vector<std::size_t> piece_;  // this worker's piece of the plan
  std::int64_t piece_version_ = -1, piece_index_ = -1, piece_epoch_ = -1;
  bool epoch_ended_ = false;
  Settled settled_ = Settled::kept;
  std::size_t used_at_plan_ = 0;
  void cut_piece(const Session& session);
};

}  // namespace kf
