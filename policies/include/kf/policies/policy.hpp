// SPDX-License-Identifier: Apache-2.0
// The C++ policy API (docs/policies.md). A policy is a class with hooks
// that the runtime calls on every worker with the same inputs: the step, the cluster, its
// settings and the step's metrics averaged over all workers (they travel in the step's control
// collective). A hook reads them and proposes changes through its PolicyContext; the runtime
// merges the proposals of all policies and applies them on every worker at one step boundary,
// or not at all. Because every worker computes the same proposal, a policy must be
// deterministic: no clocks, no random numbers it does not seed from its inputs, no I/O.
//
// A policy that throws is logged and disabled; the job goes on without it.
// Thread-safety: hooks are called from the training thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kf {

/// One worker's straggler score (kf::Session::straggler_scores; docs/monitoring.md,
/// "Stragglers").
struct WorkerSpeed {
  std::string worker;      ///< host:port
  double vs_fastest = 1;   ///< its speed / the fastest worker's (1: the fastest)
  double vs_own_best = 1;  ///< its speed / the best its window has shown
  bool slow = false;       ///< below 0.7 of the fastest, until back above 0.85
  friend bool operator==(const WorkerSpeed&, const WorkerSpeed&) = default;
};

/// What a hook may read. Identical on every worker at a given step.
struct PolicyInputs {
  std::int64_t step = 0;      ///< steps finished by the job
  std::int64_t epoch = -1;    ///< the epoch (before_epoch/after_epoch), else the last one set
  int workers = 0;            ///< current cluster size
  std::uint64_t version = 0;  ///< current cluster version
  nlohmann::json settings = nlohmann::json::object();  ///< batch_size, lr, algorithm, ...
  std::map<std::string, double> metrics;  ///< this step's scalars, averaged over the workers
  /// The scored workers' straggler scores, in rank order (empty until a few boundaries measured
  /// compute times, and with the monitors off).
  std::vector<WorkerSpeed> speeds;

  nlohmann::json to_json() const;
  /// Throws: std::invalid_argument naming the missing or malformed field.
  static PolicyInputs from_json(const nlohmann::json& j);
};

/// Changes asked for at one step; each field left empty is not changed.
struct Proposal {
  std::optional<int> workers;
  std::optional<std::int64_t> batch_size;
  std::optional<double> learning_rate;
  std::optional<std::string> algorithm;
  std::optional<std::string> mode;         ///< canonical text (ModeSpec::str())
  std::optional<std::string> compression;  ///< canonical text (CompressionSpec::str())
  std::optional<bool> balance;             ///< the setting "balance" (balanced batches)
  /// Workers (host:port) to take out of the cluster, with notice: each finishes its step and
  /// leaves at the boundary; a hot spare takes its place where there is one, and under
  /// autoscale the agents place a replacement on an offered slot.
  std::vector<std::string> revoke;
  bool stop = false;
  std::vector<std::string> reasons;  ///< "policy: why" for each field set, in order

  bool empty() const noexcept {
    return !workers && !batch_size && !learning_rate && !algorithm && !mode && !compression &&
           !balance && revoke.empty() && !stop;
  }
  /// Fields set in `later` replace ours (later policies in the job file win); workers to revoke
  /// add up.
  void merge(const Proposal& later);
  /// True when applying it to `workers` and `settings` would change nothing (a revoke always
  /// changes something).
  bool changes_nothing(int current_workers, const nlohmann::json& settings) const;
  /// {"workers": 3, "batch_size": 128, ..., "reasons": [...]}, fields that are set only.
  nlohmann::json to_json() const;
};

/// The handle a hook receives: read the inputs, propose changes.
class PolicyContext {
 public:
  PolicyContext(const PolicyInputs& inputs, std::string policy_name)
      : inputs_(inputs), policy_(std::move(policy_name)) {}

  const PolicyInputs& inputs() const noexcept { return inputs_; }
  std::int64_t step() const noexcept { return inputs_.step; }
  int workers() const noexcept { return inputs_.workers; }
  const nlohmann::json& settings() const noexcept { return inputs_.settings; }
  /// The workers' straggler scores (PolicyInputs::speeds).
  const std::vector<WorkerSpeed>& speeds() const noexcept { return inputs_.speeds; }
  /// The averaged metric `name`, or `fallback` when this step did not report it.
  double metric(std::string_view name, double fallback = 0.0) const;
  bool has_metric(std::string_view name) const;

  /// Throws: std::invalid_argument for n < 1.
  void resize(int n, std::string_view why = {});
  /// Throws: std::invalid_argument for b < 1.
  void set_batch_size(std::int64_t b, std::string_view why = {});
  /// Throws: std::invalid_argument for a learning rate that is not finite and > 0.
  void set_learning_rate(double lr, std::string_view why = {});
  /// Throws: std::invalid_argument for a name that is not an algorithm (auto, star, ...).
  void set_algorithm(std::string_view algorithm, std::string_view why = {});
  /// The training mode, e.g. "sync-sgd", "sma:period=4" (kf/policies/training_spec.hpp). Every
  /// worker switches at the same step boundary, like a resize.
  /// Throws: std::invalid_argument naming what is wrong with `mode`.
  void set_mode(std::string_view mode, std::string_view why = {});
  /// The compression of what the mode sends, e.g. "none", "fp16", "topk:0.01".
  /// Throws: std::invalid_argument naming what is wrong with `compression`.
  void set_compression(std::string_view compression, std::string_view why = {});
  void stop(std::string_view why = {});
  /// Turns balanced batches on or off (the setting "balance"; docs/training-modes.md).
  void set_balance(bool on, std::string_view why = {});
  /// Takes `worker` (host:port) out of the cluster with notice (Proposal::revoke).
  /// Throws: std::invalid_argument when `worker` is not host:port.
  void revoke(std::string_view worker, std::string_view why = {});

  const Proposal& proposal() const noexcept { return proposal_; }

 private:
  void note(std::string_view field, std::string_view why);

  const PolicyInputs& inputs_;
  std::string policy_;
  Proposal proposal_;
};

class Policy {
 public:
  virtual ~Policy() = default;
  /// The name used in logs (and in the job file).
  virtual std::string name() const = 0;
  virtual void before_train(PolicyContext&) {}
  virtual void before_epoch(PolicyContext&) {}
  virtual void after_step(PolicyContext&) {}
  virtual void after_epoch(PolicyContext&) {}
  /// Called on every worker after the cluster changed (inputs show the new size).
  virtual void on_membership_change(PolicyContext&) {}
};

/// Makes a policy from its job-file parameters. Throws std::invalid_argument naming a bad
/// parameter.
using PolicyFactory = std::function<std::unique_ptr<Policy>(const nlohmann::json& params)>;

/// Policy names to factories. The built-ins are registered by register_builtin_policies()
/// (kf/policies/builtin.hpp); a plugin registers more from its entry point (see
/// kf_register_policies below).
class PolicyRegistry {
 public:
  /// Throws: std::invalid_argument when `name` is empty or already registered.
  void add(const std::string& name, PolicyFactory factory);
  bool contains(const std::string& name) const { return factories_.count(name) > 0; }
  /// Throws: std::invalid_argument naming an unknown policy (and the known ones) or a bad
  /// parameter.
  std::unique_ptr<Policy> make(const std::string& name, const nlohmann::json& params) const;
  std::vector<std::string> names() const;

  /// Loads a shared library made with KF_POLICY_PLUGIN (below) and calls its entry point. The
  /// path must be absolute (a job file's plugins are made so, relative to the job file). The
  /// file must be a regular file owned by this user or root that its group and other users
  /// cannot write, in a directory they cannot write either (unless it is sticky, like /tmp):
  /// whoever can change the library runs code in every worker. The file is opened once, checked
  /// and loaded through that descriptor, so that it cannot be swapped in between. Its plugin API
  /// version must be this kf's (kPolicyPluginApi).
  /// Throws: std::runtime_error naming the file and what failed (not absolute, cannot be opened,
  /// its owner or permissions, dlopen, no or another API version, an exception from the entry
  /// point).
  void load_plugin(const std::string& path);

 private:
  std::map<std::string, PolicyFactory> factories_;
};

}  // namespace kf

/// A policy plugin's entry point, with the plugin API version it was built for:
///   KF_POLICY_PLUGIN(registry) {
///     registry->add("my-policy", [](const nlohmann::json& p) { return std::make_unique<My>(p); });
///   }
/// It defines two extern "C" functions (names not mangled): kf_policy_plugin_api_version(),
/// which returns KF_POLICY_PLUGIN_API as the plugin was compiled, and
/// kf_register_policies(kf::PolicyRegistry*), whose body follows the macro. A kf whose plugin
/// API differs refuses the plugin, naming both versions, instead of calling into code built
/// against other types. Build it against the kf it runs with (pkg-config --cflags --libs kf).
#define KF_POLICY_PLUGIN_API 1
#define KF_POLICY_PLUGIN(registry)                                               \
  extern "C" int kf_policy_plugin_api_version() { return KF_POLICY_PLUGIN_API; } \
  extern "C" void kf_register_policies(kf::PolicyRegistry* registry)

extern "C" {
using kf_register_policies_fn = void (*)(kf::PolicyRegistry*);
using kf_policy_plugin_api_version_fn = int (*)();
}
inline constexpr const char* kKfRegisterPoliciesSymbol = "kf_register_policies";
inline constexpr const char* kKfPolicyPluginApiSymbol = "kf_policy_plugin_api_version";
/// The plugin API of this kf (KF_POLICY_PLUGIN_API when it was built).
inline constexpr int kPolicyPluginApi = KF_POLICY_PLUGIN_API;
