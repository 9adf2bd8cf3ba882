// SPDX-License-Identifier: Apache-2.0
// algorithm-selection: picks the job's allreduce algorithm from the α–β–γ prior, then keeps or
// abandons it by the measured algorithm bandwidth (KungFu's 0.8 ×
// reference rule).
//
// 1. Prior. For the cluster size p and the message size n in use (message_bytes, else the
//    step's comm_bytes), the candidates are ranked by coll::predict_seconds(allreduce, ·, p, n)
//    with the link parameters alpha/beta/gamma (ties keep the order of `algorithms`). The first
//    is the preferred algorithm, proposed when the setting differs. p and the size bucket
//    ⌊log2 n⌋ form the configuration; a new configuration ranks again.
// 2. Measure. Per algorithm and configuration, the achieved algbw is Σ comm_bytes / Σ comm_time
//    over windows of `window` steps (ratio of sums), after warmup_steps discarded steps at
//    every switch or change of configuration. An algorithm's reference is its first window,
//    raised by every healthy window above it.
// 3. Degrade. When `patience` consecutive windows fall below threshold × reference, the next
//    algorithm of the prior not yet tried in this episode runs for one probation window. If it
//    beats the degraded value it stays; otherwise the old algorithm returns (its reference is
//    kept) and a further bad window tries the next one. When every candidate was tried, the
//    degraded value becomes the old algorithm's reference (a new normal).
// 4. Switch back. While a substitute runs, the preferred algorithm is probed again for one
//    window every retry_windows windows: it stays when it reaches threshold × its kept
//    reference or beats the substitute's last window, otherwise the substitute returns.
// With one worker there is no allreduce and nothing is decided.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"
#include "kf/coll/cost_model.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "algorithm-selection";
constexpr std::int64_t kMaxSteps = 1'000'000'000;

struct Options {
  std::int64_t window = 50;
  std::int64_t warmup_steps = 2;
  double threshold = 0.8;
  std::int64_t patience = 1;
  std::int64_t retry_windows = 20;
  std::vector<std::string> algorithms{"ring", "rhd", "clique", "tree", "star"};
  std::int64_t message_bytes = 0;
  coll::LinkParams link;
};

Options read_options(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  o.window = r.integer("window", o.window, 1, kMaxSteps);
  o.warmup_steps = r.integer("warmup_steps", o.warmup_steps, 0, kMaxSteps);
  o.threshold = r.number("threshold", o.threshold, {0.0, 1.0, true, true});
  o.patience = r.integer("patience", o.patience, 1, 1'000'000);
  o.retry_windows = r.integer("retry_windows", o.retry_windows, 0, kMaxSteps);
  o.algorithms =
      r.choice_list("algorithms", o.algorithms, {"ring", "rhd", "clique", "tree", "star"});
  o.message_bytes = r.integer("message_bytes", o.message_bytes, 0, std::int64_t{1} << 50);
  o.link.alpha_s = r.number("alpha", o.link.alpha_s, {0.0, 1.0, false, false});
  o.link.beta_s_per_byte = r.number("beta", o.link.beta_s_per_byte, {0.0, 1.0, false, false});
  o.link.gamma_s_per_byte = r.number("gamma", o.link.gamma_s_per_byte, {0.0, 1.0, false, false});
  r.reject_unknown();
  if (o.link.alpha_s == 0.0 && o.link.beta_s_per_byte == 0.0) {
    r.fail("beta", "and alpha cannot both be 0 (the prior would predict no time)");
  }
  return o;
}

std::string rate(double bytes_per_second) { return short_number(bytes_per_second / 1e9) + " GB/s"; }

class AlgorithmSelection final : public Policy {
 public:
  explicit AlgorithmSelection(Options o) : o_(std::move(o)) {}

  std::string name() const override { return kName; }

  void on_membership_change(PolicyContext&) override { restart_window(); }

  void after_step(PolicyContext& ctx) override {
    if (ctx.workers() < 2) return;
    const double bytes = ctx.metric("comm_bytes");
    const double seconds = ctx.metric("comm_time");
    const bool measured = ctx.has_metric("comm_bytes") && ctx.has_metric("comm_time") &&
                          std::isfinite(bytes) && bytes > 0.0 && std::isfinite(seconds) &&
                          seconds > 0.0;
    const double n = o_.message_bytes > 0 ? static_cast<double>(o_.message_bytes) : bytes;
    if (!(n > 0.0)) return;  // no message size yet: no prior
    const Config config{ctx.workers(), static_cast<int>(std::floor(std::log2(n)))};
    if ((!config_ || *config_ != config) && enter(ctx, config, n)) return;
    if (!follow_setting(ctx)) return;
    if (!measured) return;
    if (discard_ > 0) {
      --discard_;
      return;
    }
    window_bytes_ += bytes;
    window_seconds_ += seconds;
    if (++window_steps_ < o_.window) return;
    const double w = window_bytes_ / window_seconds_;
    restart_window(0);
    on_window(ctx, w);
  }

 private:
  using Config = std::tuple<int, int>;  // workers, ⌊log2 bytes⌋
  enum class Mode { steady, probation, retry };

  void restart_window(std::int64_t discard = -1) {
    window_bytes_ = 0.0;
    window_seconds_ = 0.0;
    window_steps_ = 0;
    discard_ = discard < 0 ? o_.warmup_steps : discard;
  }

  static std::string setting(const PolicyContext& ctx) {
    const auto& s = ctx.settings();
    return s.contains("algorithm") && s["algorithm"].is_string() ? s["algorithm"].get<std::string>()
                                                                 : std::string("auto");
  }

  void propose(PolicyContext& ctx, const std::string& algorithm, const std::string& why) {
    ctx.set_algorithm(algorithm, why);
    pending_ = algorithm;
    pending_since_ = ctx.step();
    restart_window();
  }

  // Step 1: rank the candidates for this configuration and propose the first. True when it
  // proposed; otherwise this step is the first (warm-up) one of the configuration.
  bool enter(PolicyContext& ctx, const Config& config, double bytes) {
    config_ = config;
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& name : o_.algorithms) {
      const auto a = parse_algorithm(name);
      ranked.emplace_back(coll::predict_seconds(CollOp::allreduce, *a, ctx.workers(),
                                                static_cast<std::size_t>(bytes), o_.link),
                          name);
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    ranking_.clear();
    std::string why =
        "prior for " + std::to_string(ctx.workers()) + " workers, " + short_number(bytes) + " B:";
    for (const auto& [t, name] : ranked) {
      ranking_.push_back(name);
      why += " " + name + " " + short_number(t * 1e6) + " us";
    }
    preferred_ = ranking_.front();
    mode_ = Mode::steady;
    bad_windows_ = 0;
    displaced_windows_ = 0;
    tried_.clear();
    pending_.reset();
    active_ = setting(ctx);
    restart_window();
    if (active_ == preferred_) return false;
    propose(ctx, preferred_, why);
    return true;
  }

  // Which algorithm runs: ours once a proposal took effect, or one set from outside (which
  // this policy then measures from a fresh window). False while a proposal is on its way.
  bool follow_setting(const PolicyContext& ctx) {
    const std::string s = setting(ctx);
    if (pending_) {
      if (s != *pending_ && ctx.step() - pending_since_ <= o_.window + o_.warmup_steps) {
        return false;
      }
      if (s == *pending_) {
        active_ = s;
        pending_.reset();
        restart_window();
        return true;
      }
      pending_.reset();  // not applied: go on with what runs, outside any probation
      mode_ = Mode::steady;
      bad_windows_ = 0;
    }
    if (s != active_) {
      active_ = s;
      mode_ = Mode::steady;
      bad_windows_ = 0;
      tried_.clear();
      restart_window();
    }
    return true;
  }

  double* reference(const std::string& algorithm) {
    auto it = references_.find({*config_, algorithm});
    return it == references_.end() ? nullptr : &it->second;
  }

  void on_window(PolicyContext& ctx, double w) {
    double* ref = reference(active_);
    if (mode_ == Mode::retry) {
      mode_ = Mode::steady;
      if ((ref != nullptr && w >= o_.threshold * *ref) || w > back_level_) {
        // Recovered, or at least better than the substitute: the preferred algorithm stays.
        if (ref == nullptr) {
          references_[{*config_, active_}] = w;
        } else {
          *ref = std::max(*ref, w);
        }
        bad_windows_ = 0;
        tried_.clear();
        return;
      }
      propose(ctx, back_to_,
              active_ + " probed again: " + rate(w) + " < " + short_number(o_.threshold) +
                  " x its " + "reference " + (ref ? rate(*ref) : "(none)") + " and <= " + back_to_ +
                  "'s " + rate(back_level_) + ": back to " + back_to_);
      return;
    }
    if (ref == nullptr) ref = &(references_[{*config_, active_}] = w);
    if (mode_ == Mode::probation) {
      mode_ = Mode::steady;
      if (w > back_level_) {
        bad_windows_ = 0;
        displaced_windows_ = 0;
        return;  // the substitute is better than the degraded one: it stays
      }
      bad_windows_ = o_.patience - 1;  // one more bad window tries the next candidate
      propose(ctx, back_to_,
              active_ + " on probation: " + rate(w) + " <= " + back_to_ + "'s " +
                  rate(back_level_) + ": back to " + back_to_ + " (its reference " +
                  rate(*reference(back_to_)) + " kept)");
      return;
    }
    steady_window(ctx, w, *ref);
  }

  void steady_window(PolicyContext& ctx, double w, double& ref) {
    if (w < o_.threshold * ref) {
      ++bad_windows_;
    } else {
      ref = std::max(ref, w);
      bad_windows_ = 0;
      tried_.clear();
    }
    if (bad_windows_ >= o_.patience) {
      tried_.insert(active_);
      const std::string why = active_ + ": algbw " + rate(w) + " < " + short_number(o_.threshold) +
                              " x reference " + rate(ref) + " for " + std::to_string(bad_windows_) +
                              " windows";
      bad_windows_ = 0;
      for (const auto& candidate : ranking_) {
        if (tried_.count(candidate) > 0) continue;
        tried_.insert(candidate);
        mode_ = Mode::probation;
        back_to_ = active_;
        back_level_ = w;
        propose(ctx, candidate, why + ": try " + candidate + " (next by the prior) for a window");
        return;
      }
      ref = w;  // every candidate was tried: the degraded value is the new normal
      tried_.clear();
      return;
    }
    if (active_ == preferred_ || o_.retry_windows == 0) return;
    if (++displaced_windows_ < o_.retry_windows) return;
    displaced_windows_ = 0;
    mode_ = Mode::retry;
    back_to_ = active_;
    back_level_ = w;
    const double* pref = reference(preferred_);
    propose(ctx, preferred_,
            active_ + " has run for " + std::to_string(o_.retry_windows) + " windows at " +
                rate(w) + ": probe " + preferred_ + " again (reference " +
                (pref ? rate(*pref) : "none") + ")");
  }

  Options o_;
  std::optional<Config> config_;
  std::vector<std::string> ranking_;    // the prior's order for config_
  std::string preferred_;               // ranking_.front(): where a substitute switches back to
  std::string active_;                  // the algorithm that runs (the setting)
  std::optional<std::string> pending_;  // proposed, not yet in the settings
  std::int64_t pending_since_ = 0;
  std::map<std::pair<Config, std::string>, double> references_;  // algbw, bytes/s
  Mode mode_ = Mode::steady;
  std::string back_to_;          // probation or retry: the algorithm to return to
  double back_level_ = 0;        // ... and its last window
  std::set<std::string> tried_;  // this degradation episode
  std::int64_t bad_windows_ = 0;
  std::int64_t displaced_windows_ = 0;
  double window_bytes_ = 0;
  double window_seconds_ = 0;
  std::int64_t window_steps_ = 0;
  std::int64_t discard_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_algorithm_selection_policy(const nlohmann::json& params) {
  return std::make_unique<AlgorithmSelection>(read_options(params));
}

}  // namespace kf::detail
