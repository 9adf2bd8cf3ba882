// SPDX-License-Identifier: Apache-2.0
// compression-by-bandwidth: turns gradient compression on when the network is slow and off when
// it is fast again (docs/policies.md, "compression-by-bandwidth").
//
// In sync-sgd without compression, the exchange moves every gradient value: algbw (bytes per
// second of the step's communication) measures the network. Once algbw < on_below at `patience`
// consecutive steps, the policy sets `compression`. With compression on, the bytes sent are far
// fewer and their algbw says little about the network, so the policy compares the uncompressed
// bytes it saw last (full) with the time the compressed exchange takes: once full / comm_time >
// off_above at `patience` consecutive steps, sending everything would be as fast as that, and it
// sets "none". Without an uncompressed measurement (the job started compressed), it never turns
// compression off. Other modes send models, not gradients: the policy leaves them alone. After a
// proposal, none for `cooldown` steps.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "builtin_factories.hpp"
#include "builtin_params.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf::detail {
namespace {

constexpr const char* kName = "compression-by-bandwidth";
constexpr std::int64_t kMaxSteps = 1'000'000'000;

struct Options {
  std::string compression = "topk:0.01";
  double on_below = 1e9;   // bytes per second
  double off_above = 4e9;  // bytes per second
  std::int64_t patience = 5;
  std::int64_t cooldown = 50;
};

std::string setting(const PolicyContext& c, const char* key, const char* fallback) {
  const auto& s = c.settings();
  return s.contains(key) && s[key].is_string() ? s[key].get<std::string>() : fallback;
}

class CompressionByBandwidth final : public Policy {
 public:
  explicit CompressionByBandwidth(Options o) : o_(std::move(o)) {}
  std::string name() const override { return kName; }

  void after_step(PolicyContext& c) override {
    CompressionSpec on;
    try {
      if (parse_mode(setting(c, "mode", "sync-sgd")).mode != TrainingMode::sync_sgd) return;
      on = parse_compression(setting(c, "compression", "none"));
    } catch (const std::invalid_argument&) {
      return;
    }
    const double bytes = c.metric("comm_bytes"), time = c.metric("comm_time");
    if (bytes <= 0 || time <= 0) return;
    if (on.kind == Compression::none) {
      full_bytes_ = bytes;
      count(c, bytes / time < o_.on_below, o_.compression, "algbw below on_below");
    } else if (full_bytes_ > 0) {
      count(c, full_bytes_ / time > o_.off_above, "none",
            "uncompressed bytes / exchange time above off_above");
    }
  }

 private:
  void count(PolicyContext& c, bool holds, const std::string& to, const char* why) {
    if (!holds) {
      run_ = 0;
      return;
    }
    if (++run_ < o_.patience || c.step() < quiet_until_) return;
    c.set_compression(to, why);
    run_ = 0;
    quiet_until_ = c.step() + o_.cooldown;
  }

  Options o_;
  double full_bytes_ = 0;  // comm_bytes of the last uncompressed step
  std::int64_t run_ = 0;
  std::int64_t quiet_until_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_compression_by_bandwidth_policy(const nlohmann::json& params) {
  ParamReader r(kName, params);
  Options o;
  CompressionSpec spec;
  try {
    spec = parse_compression(r.string("compression", o.compression));
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind(kName, 0) == 0) throw;  // the reader's own message
    r.fail("compression", e.what());
  }
  if (spec.kind == Compression::none) r.fail("compression", "must compress (not none)");
  o.compression = spec.str();
  o.on_below = r.number("on_below", o.on_below, {0.0, 1e15, true, false});
  o.off_above = r.number("off_above", o.off_above, {0.0, 1e15, true, false});
  o.patience = r.integer("patience", o.patience, 1, kMaxSteps);
  o.cooldown = r.integer("cooldown", o.cooldown, 0, kMaxSteps);
  r.reject_unknown();
  if (o.on_below >= o.off_above) r.fail("on_below", "must be below off_above");
  return std::make_unique<CompressionByBandwidth>(o);
}

}  // namespace kf::detail
