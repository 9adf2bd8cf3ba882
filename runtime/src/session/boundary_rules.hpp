// SPDX-License-Identifier: Apache-2.0
// The pure rules of the step boundary (docs/elastic.md). At the end of every step each worker
// packs a control record, the workers allgather them, and every worker runs the same rules over
// the same records in rank order, so every worker takes the same decision without talking again:
//
//   1. pack:     BoundaryRecord (newest version seen, commits, size of that version's document,
//                pending version whose joiners this worker has reached, steps), then the
//                monitors' words, then one word per registered metric (a double's bits);
//   2. exchange: allgather of every worker's record (kf::Session, step_boundary.cpp);
//   3. decide:   decide() below: stay, keep waiting for joiners, switch to the pending cluster, or
//                fetch a newer document from the worker that holds it (broadcast), after which
//                judge_newer() says whether to refuse it, switch at once or wait for its joiners;
//   4. apply:    kf::Session carries the decision out (membership.cpp).
//
// No I/O here: these functions have unit tests without sockets (tests/runtime/boundary_rules_test).
// Thread-safety: free functions and value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/cluster_settings.hpp"

namespace kf::detail {

/// The fixed fields of one worker's control record.
struct BoundaryRecord {
  std::uint64_t version_seen = 0;   ///< newest cluster version this worker's watch holds
  std::int64_t commits = 0;         ///< its commit count
  std::uint64_t doc_bytes = 0;      ///< size of that version's document (0: not newer)
  std::uint64_t ready_version = 0;  ///< pending version whose joiners it has reached (0: none)
  /// Its step count before this boundary's step is counted (with boundaries on change the
  /// workers' counts differ; rank 0's is the job's step the policies see).
  std::int64_t steps = 0;
};

/// Where the parts of a record lie, in 64-bit words.
struct RecordLayout {
  static constexpr std::size_t kFixedWords = 5;
  std::size_t monitor_words = 0;  ///< StepMonitor::kWords with the monitors on, else 0
  std::size_t metrics = 0;        ///< registered metrics

  std::size_t monitor_at() const noexcept { return kFixedWords; }
  std::size_t metrics_at() const noexcept { return kFixedWords + monitor_words; }
  std::size_t words() const noexcept { return metrics_at() + metrics; }
};

/// Writes `record` and `metrics` into `out` (layout.words() words; the monitor words are left as
/// they are for StepMonitor::pack).
void pack(const BoundaryRecord& record, std::span<const double> metrics, const RecordLayout& layout,
          std::span<std::int64_t> out);

/// The fixed fields of every worker's record, in rank order, from the allgathered words.
std::vector<BoundaryRecord> unpack(std::span<const std::int64_t> all, const RecordLayout& layout);

/// Each registered metric averaged over the workers, summed in rank order (the same bits on every
/// worker).
std::vector<double> average_metrics(std::span<const std::int64_t> all, const RecordLayout& layout);

/// Boundaries on change (settings "boundaries": "on-change", docs/elastic.md): the boundaries
/// of one cluster version are numbered 1, 2, ... A worker that needs the next one (its watch
/// holds a newer cluster, a peer is lost, joiners wait, the interval is up, the training loop
/// asked) sends every other worker a request naming it, and every worker takes it at the end
/// of the step in which it learns of it, by a reason of its own or by a request. The control
/// collective of boundary k cannot complete before every worker entered it, so nobody can ask
/// for k + 1 before everyone passed k: the numbers name the same boundary on every worker,
/// whatever order the news arrives in, and a request for a number already passed (a second
/// worker asked for it too) is old news. A failure ends the version and its numbering
/// (restart()); requests are messages of their version, so none crosses into the next one.
class BoundaryAgreement {
 public:
  struct Verdict {
    bool take = false;        ///< this step ends at boundary `index`
    bool ask_others = false;  ///< this worker asks for it: send `index` to every other worker
    std::uint64_t index = 0;
    friend bool operator==(const Verdict&, const Verdict&) = default;
  };
  /// A request for boundary `index` came (from any worker, in any order, any number of times).
  void heard(std::uint64_t index) noexcept;
  /// At the end of a step, with `own_reason` whether this worker needs a boundary itself.
  /// Nobody is asked twice: a worker that heard a request for the next boundary takes it
  /// without asking.
  Verdict at_step_end(bool own_reason) const noexcept;
  /// Boundary `index` was passed: its control collective completed.
  void passed(std::uint64_t index) noexcept;
  /// A new cluster version: numbering starts again at 1.
  void restart() noexcept;
  std::uint64_t passed_count() const noexcept { return passed_; }
  std::uint64_t heard_max() const noexcept { return heard_; }

 private:
  std::uint64_t passed_ = 0, heard_ = 0;
};

/// What the rules see besides the records: this worker's view before the boundary.
struct BoundaryView {
  const Cluster& current;         ///< the cluster the workers run now
  const Cluster* pending;         ///< a change that waits for its joiners; nullptr: none
  std::uint64_t refused_version;  ///< a version refused before (over max_workers); 0: none
};

struct BoundaryDecision {
  enum class Action {
    stay,               ///< nothing newer: go on with the current cluster
    wait_for_joiners,   ///< a pending change whose joiners some survivor has not reached yet
    switch_to_pending,  ///< every survivor reached every joiner of the pending change
    fetch_newer,        ///< a newer version exists: `root` broadcasts its document
  };
  Action action = Action::stay;
  int root = -1;              ///< fetch_newer: the lowest rank holding the newest version
  std::size_t doc_bytes = 0;  ///< fetch_newer: the size of that document
  friend bool operator==(const BoundaryDecision&, const BoundaryDecision&) = default;
};

/// The decision of one boundary from every worker's record (rank order of `view.current`).
/// Rules, in order: a pending change is applied once every survivor's ready_version equals its
/// version (a newer version than the pending one supersedes it); then a version newer than the
/// current one, and not refused before, is fetched from the lowest rank that has seen it.
BoundaryDecision decide(const BoundaryView& view, std::span<const BoundaryRecord> records);

struct NewerVerdict {
  enum class Action {
    refuse,            ///< over max_workers: stay, and do not fetch this version again
    switch_now,        ///< no joiners: every worker switches at this boundary
    wait_for_joiners,  ///< joiners: invite them, switch once every survivor reached them
  };
  Action action = Action::switch_now;
  std::string kind;    ///< "settings" (same workers) or "resize"
  std::string reason;  ///< refuse: why, for the log
};

/// What to do with the newer cluster `target` fetched at a boundary, whose settings read as
/// `settings` (a mistyped bound is absent there, so it bounds nothing).
NewerVerdict judge_newer(const Cluster& target, const ClusterSettings& settings,
                         const Cluster& current);

}  // namespace kf::detail
