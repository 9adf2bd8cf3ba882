// SPDX-License-Identifier: Apache-2.0
// Straggler scores (docs/monitoring.md, "Stragglers"): each worker's speed, samples per second of
// compute over a window of step boundaries, against the job's fastest worker and against its own
// best, and which workers are slow, with hysteresis so that a worker near the line does not flap.
// A Session feeds it at every boundary from the allgathered reports in rank order, so every
// worker holds the same scores (the same bits) and policies that read them decide alike.
// Windows are kept per worker address, so they outlive resizes; a worker that leaves is
// forgotten. Thread-safety: a value type.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace kf {

struct StragglerOptions {
  /// Boundaries in a worker's window; a worker is scored once its window holds `min_boundaries`.
  std::size_t window = 20;
  std::size_t min_boundaries = 3;
  /// A worker turns slow when its speed falls below `slow_below` of the fastest worker's, and
  /// recovers once it is back above `recover_above` (> slow_below: the hysteresis).
  double slow_below = 0.7;
  double recover_above = 0.85;

  /// Throws: std::invalid_argument naming the option that is out of range (window or
  /// min_boundaries 0, min_boundaries > window, thresholds outside (0, 1] or not ordered).
  void check() const;
};

/// One worker's measurements at one boundary.
struct StragglerSample {
  std::string worker;  ///< its address (host:port)
  double samples = 0;  ///< samples it trained on in the step
  double compute = 0;  ///< seconds it computed (0: not reported; the step adds nothing)
};

struct StragglerScore {
  std::string worker;
  double speed = 0;        ///< samples per second of compute over its window
  double vs_fastest = 0;   ///< speed / the fastest scored worker's speed (1 for the fastest)
  double vs_own_best = 0;  ///< speed / the best speed its window has shown (1 at its best)
  bool slow = false;
};

/// A worker that turned slow (`slow` true) or recovered at a boundary, with its score then.
struct StragglerChange {
  StragglerScore score;
  bool slow = false;
};

class StragglerTracker {
 public:
  /// Throws: as StragglerOptions::check.
  explicit StragglerTracker(StragglerOptions options = {});

  /// One boundary: every worker of the cluster, in rank order. Workers not in `step` are
  /// forgotten. Returns the workers that turned slow or recovered here, in rank order.
  std::vector<StragglerChange> update(std::span<const StragglerSample> step);

  /// The scored workers (window full enough), in the rank order of the last update.
  const std::vector<StragglerScore>& scores() const noexcept { return scores_; }
  /// `worker`'s score; nullptr when it is not scored (yet).
  const StragglerScore* find(const std::string& worker) const noexcept;
  /// How many scored workers are slow.
  int slow_count() const noexcept;

 private:
  struct Window {
    std::deque<std::pair<double, double>> steps;  // (samples, compute), the newest last
    double best = 0;
    bool slow = false;
  };

  StragglerOptions options_;
  std::map<std::string, Window> windows_;
  std::vector<StragglerScore> scores_;
};

}  // namespace kf
