// SPDX-License-Identifier: Apache-2.0
// kf::JobFile: the job's YAML file (docs/job-file.md): job name, worker bounds, algorithm, batch
// size, learning rate, timeouts, ports, commit and checkpoint intervals, metrics outputs, and the
// policies (with their parameters, kept as JSON for the policy to validate) and plugins to load.
// Loading validates every key and value and throws a JobFileError that names the file, the line,
// the key path and what was expected. yaml-cpp stays in the .cpp.
// Thread-safety: free functions and value types.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kf/coll/types.hpp"
#include "kf/policies/training_spec.hpp"
#include "kf/runtime/cluster_settings.hpp"

namespace kf {

/// A job file that cannot be read or is not valid. what() is "FILE:LINE: KEY: what was expected,
/// got what", e.g. "job.yaml:7: workers.max: must be an integer >= workers.min (2), got 1".
/// Malformed YAML and a top level that is not a mapping have no key: "FILE:LINE: reason". A file
/// that cannot be read has neither line (0) nor key: "FILE: reason".
class JobFileError : public std::runtime_error {
 public:
  JobFileError(std::string source, int line, std::string key, const std::string& reason);
  const std::string& source() const noexcept { return source_; }
  int line() const noexcept { return line_; }  ///< 1-based; 0 when the file was not read
  const std::string& key() const noexcept { return key_; }  ///< e.g. "policies[1].name"

 private:
  std::string source_;
  int line_ = 0;
  std::string key_;
};

/// One entry of `policies:`: a policy name (built in or registered by a plugin) and its
/// parameters, converted from YAML to JSON (ints stay ints, floats floats, and so on).
struct PolicySpec {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  int line = 0;  ///< 1-based line of the entry, for messages about its parameters
};

/// A validated job file. Every key but `job` is optional; the defaults are those below.
struct JobFile {
  struct Workers {
    int min = 1;
    int max = 64;
    int initial = 1;  ///< min when not given
  };
  struct Timeouts {
    std::chrono::milliseconds collective{3000};  ///< collective deadline (PeerOptions::timeout)
    std::chrono::milliseconds heartbeat{750};    ///< silent-peer timeout; zero disables
    std::chrono::milliseconds connect{20000};    ///< opening and authenticating a connection
  };
  /// Inclusive TCP port range for the workers of a static job, 1 <= first <= last <= 65535.
  struct Ports {
    std::uint16_t first = 10000;
    std::uint16_t last = 32767;  // below the ephemeral range (kfrun ports.hpp)
  };
  struct Checkpoint {
    std::string path;
    std::int64_t every = 100;  ///< commits between saves
  };
  struct Metrics {
    std::uint16_t port = 0;            ///< Prometheus text endpoint; 0 = off
    std::optional<std::string> jsonl;  ///< JSON-lines file
  };

  std::string source;  ///< the file name (or the name given to parse_job_file), for messages
  std::string name = "kf";
  Workers workers;
  Algorithm algorithm = Algorithm::auto_select;
  std::optional<ModeSpec> mode;                ///< "mode" (docs/training-modes.md)
  std::optional<CompressionSpec> compression;  ///< "compression"
  std::int64_t batch_size = 32;                ///< global batch (sum over the workers)
  double learning_rate = 0.01;
  Timeouts timeouts;
  Ports ports;
  std::int64_t commit_every = 1;
  std::optional<Checkpoint> checkpoint;
  std::optional<Metrics> metrics;
  std::optional<AutoscaleSettings> autoscale;  ///< "autoscale" (docs/autoscale.md)
  std::int64_t spares = 0;  ///< "spares": hot spares kept on offered slots (docs/elastic.md)
  std::vector<PolicySpec> policies;  ///< in the order of the file (later ones win on merge)
  /// Policy plugins (PolicyRegistry::load_plugin): load_job_file makes a relative path absolute,
  /// relative to the job file's directory; parse_job_file keeps them as written.
  std::vector<std::string> plugins;

  /// The cluster settings kf-config-server holds for the job: {"algorithm", "batch_size", "lr",
  /// "min_workers", "max_workers"}, and "mode", "compression", "autoscale" and "spares" when
  /// the file has them.
  nlohmann::json to_settings() const;
};

/// Reads and validates the job file at `path` (named `path` in messages).
/// Throws: JobFileError when the file cannot be read or is not valid.
JobFile load_job_file(const std::string& path);

/// Validates `yaml_text`; `source_name` names it in messages.
/// Throws: JobFileError when it is not valid.
JobFile parse_job_file(const std::string& yaml_text, const std::string& source_name);

}  // namespace kf
