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

/// The settings kf itself reads. An optional field is unset when its key is absent or invalid.
struct ClusterSettings {
  std::optional<Algorithm>
      algorithm;  ///< "algorithm": auto, star, ring, tree, clique, rhd, hierarchical
  std::optional<std::int64_t> batch_size;      ///< "batch_size": global batch, an integer >= 1
  std::optional<double> learning_rate;         ///< "lr": a number
  std::optional<std::int64_t> min_workers;     ///< "min_workers": an integer >= 0 (0: no bound)
  std::optional<std::int64_t> max_workers;     ///< "max_workers": an integer >= 0 (0: no bound)
  std::optional<ModeSpec> mode;                ///< "mode": e.g. "sma:period=4" (training_spec.hpp)
  std::optional<CompressionSpec> compression;  ///< "compression": e.g. "topk:0.01"
  bool balance = false;   ///< "balance": batch parts by measured speed (Session::batch_part)
  bool finished = false;  ///< "finished": true once Session::finish() ended the job
  bool stop = false;      ///< "stop": true once a policy (or anyone) asked the job to stop
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

/// Reads `settings` (the "settings" member of a cluster document). Never throws for bad input:
/// every problem is in `errors`.
ParsedSettings parse_cluster_settings(const nlohmann::json& settings);

}  // namespace kf
