// SPDX-License-Identifier: Apache-2.0
// kf::ClusterSettings: the typed view of the "settings" object of a cluster document
// (docs/configuration.md). The config service stores the settings as JSON, so a writer may add
// keys kf does not read; they are kept as they are. The keys kf reads are parsed here, once, into
// typed fields. A known key of the wrong type or out of range is an error that names the key and
// the expected type: the config service refuses a document holding one (HTTP 400), and a worker
// that meets one anyway (a state file edited by hand, another writer) logs it and ignores that
// key, so that one bad write never ends a running job.
// Thread-safety: value types and free functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kf/coll/types.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf {

/// "autoscale": the job places workers on the slots its agents offer by itself
/// (docs/autoscale.md). Every count is of workers in the whole job.
struct AutoscaleSettings {
  std::int64_t min = 1;                  ///< "min": fewest workers kept, >= 1
  std::optional<std::int64_t> max;       ///< "max": most workers, >= min; unset: no bound
  std::optional<std::int64_t> target;    ///< "target": an integer in [min, max]; unset: "all"
  double cooldown_s = 30;                ///< "cooldown_s": seconds between placements, >= 0
  std::optional<std::int64_t> per_host;  ///< "per_host": most workers on one host, >= 1

  /// The object as it is written in the settings (every key, target "all" when unset).
  nlohmann::json to_json() const;
  bool operator==(const AutoscaleSettings&) const = default;
};

/// Reads an "autoscale" value. Returns nullopt and sets `why` (e.g. "min 4 is greater than max
/// 2", "cooldown_s: expected a number >= 0, got -1", "unknown key \"traget\"") when it is not
/// valid.
std::optional<AutoscaleSettings> parse_autoscale(const nlohmann::json& value, std::string& why);

/// The settings kf itself reads. An optional field is unset when its key is absent or invalid.
struct ClusterSettings {
  std::optional<Algorithm>
      algorithm;  ///< "algorithm": auto, star, ring, tree, clique, rhd, hierarchical
  std::optional<std::int64_t> batch_size;   ///< "batch_size": global batch, an integer >= 1
  std::optional<double> learning_rate;      ///< "lr": a number
  std::optional<std::int64_t> min_workers;  ///< "min_workers": an integer >= 0 (0: no bound)
  std::optional<std::int64_t> max_workers;  ///< "max_workers": an integer >= 0 (0: no bound)
  /// "spares": hot spares the agents keep started on offered slots (docs/elastic.md), 0-1024.
  std::int64_t spares = 0;
  std::optional<ModeSpec> mode;                ///< "mode": e.g. "sma:period=4" (training_spec.hpp)
  std::optional<CompressionSpec> compression;  ///< "compression": e.g. "topk:0.01"
  bool balance = false;  ///< "balance": batch parts by measured speed (Session::batch_part)
  /// "boundaries": "on-change" (true) or "every-step" (false, the default): in pair-avg and
  /// async-ps, a step ends at a boundary only when something changes; in sma (period above 1),
  /// only at its averaging steps (docs/elastic.md, "Boundaries on change").
  bool on_change = false;
  bool finished = false;  ///< "finished": true once Session::finish() ended the job
  bool stop = false;      ///< "stop": true once a policy (or anyone) asked the job to stop
  /// "suspended": true while the job is suspended: its workers wrote a checkpoint and left, and
  /// the next agent that starts workers for it resumes it from there (docs/elastic.md).
  bool suspended = false;
  std::optional<AutoscaleSettings> autoscale;  ///< "autoscale": see AutoscaleSettings
};

/// The outcome of reading a settings object.
struct ParsedSettings {
  ClusterSettings typed;
  /// `settings` without the keys in `errors`: what a worker adopts.
  nlohmann::json valid = nlohmann::json::object();
  /// One message per rejected key, naming it and the expected type, e.g.
  /// "settings.max_workers: expected an integer >= 0, got \"8\"". A settings value that is not an
  /// object gives one message, "settings: expected an object, got ...".
  std::vector<std::string> errors;
};

/// `settings.autoscale` (which must be set) held within the job's own bounds, min_workers and
/// max_workers (each when set and > 0), which every worker enforces: max at most max_workers,
/// min and target within them.
AutoscaleSettings autoscale_within_bounds(const ClusterSettings& settings);

/// Reads `settings` (the "settings" member of a cluster document). Never throws for bad input:
/// every problem is in `errors`.
ParsedSettings parse_cluster_settings(const nlohmann::json& settings);

}  // namespace kf
