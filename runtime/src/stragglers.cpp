// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/stragglers.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace kf {

void StragglerOptions::check() const {
  if (window == 0) throw std::invalid_argument("stragglers: window must be >= 1");
  if (min_boundaries == 0 || min_boundaries > window) {
    throw std::invalid_argument("stragglers: min_boundaries must be in 1-window (" +
                                std::to_string(window) + ")");
  }
  if (!(slow_below > 0 && slow_below <= 1)) {
    throw std::invalid_argument("stragglers: slow_below must be in (0, 1]");
  }
  if (!(recover_above >= slow_below && recover_above <= 1)) {
    throw std::invalid_argument("stragglers: recover_above must be in [slow_below, 1]");
  }
}

StragglerTracker::StragglerTracker(StragglerOptions options) : options_(options) {
  options_.check();
}

std::vector<StragglerChange> StragglerTracker::update(std::span<const StragglerSample> step) {
  std::set<std::string> present;
  for (const auto& s : step) present.insert(s.worker);
  std::erase_if(windows_, [&](const auto& entry) { return !present.contains(entry.first); });

  // Each window takes the step, and its speed is the ratio of its sums (recomputed, in order,
  // so that every worker gets the same bits).
  std::vector<std::pair<const StragglerSample*, double>> speeds;
  double fastest = 0;
  for (const auto& s : step) {
    Window& w = windows_[s.worker];
    const bool measured = s.compute > 0 && s.samples >= 0 && std::isfinite(s.samples / s.compute);
    if (measured) {
      w.steps.emplace_back(s.samples, s.compute);
      if (w.steps.size() > options_.window) w.steps.pop_front();
    }
    if (w.steps.size() < options_.min_boundaries) continue;
    double samples = 0;
    double compute = 0;
    for (const auto& [n, seconds] : w.steps) {
      samples += n;
      compute += seconds;
    }
    const double speed = samples / compute;
    w.best = std::max(w.best, speed);
    fastest = std::max(fastest, speed);
    speeds.emplace_back(&s, speed);
  }

  scores_.clear();
  std::vector<StragglerChange> changes;
  for (const auto& [s, speed] : speeds) {
    Window& w = windows_[s->worker];
    StragglerScore score;
    score.worker = s->worker;
    score.speed = speed;
    score.vs_fastest = fastest > 0 ? speed / fastest : 1.0;
    score.vs_own_best = w.best > 0 ? speed / w.best : 1.0;
    const bool was_slow = w.slow;
    if (!was_slow && score.vs_fastest < options_.slow_below) w.slow = true;
    if (was_slow && score.vs_fastest > options_.recover_above) w.slow = false;
    score.slow = w.slow;
    if (w.slow != was_slow) changes.push_back({score, w.slow});
    scores_.push_back(std::move(score));
  }
  return changes;
}

const StragglerScore* StragglerTracker::find(const std::string& worker) const noexcept {
  for (const auto& s : scores_) {
    if (s.worker == worker) return &s;
  }
  return nullptr;
}

int StragglerTracker::slow_count() const noexcept {
  return static_cast<int>(
      std::count_if(scores_.begin(), scores_.end(), [](const auto& s) { return s.slow; }));
}

}  // namespace kf
