// SPDX-License-Identifier: Apache-2.0
// The built-in policies without a cluster: synthetic PolicyInputs sequences go through each
// policy's hooks the way PolicyRunner calls them, and the tests assert the decisions (step and
// values), the gates (nothing before the inputs are valid or sufficient), hysteresis and
// cool-down, bounds, the LR rules (KAT-EFF numbers of adaptation-math.md §3.5), Or et al.'s rule
// (KAT-THR-3), the algorithm switch and switch-back, and every bad-parameter message.
#include "kf/policies/builtin.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kf {
namespace {

PolicyRegistry& builtins() {
  static PolicyRegistry* r = [] {
    auto* reg = new PolicyRegistry;
    register_builtin_policies(*reg);
    return reg;
  }();
  return *r;
}

/// Runs one policy like the runtime does: the same inputs object for every hook, the settings
/// and worker count changed by applying each proposal at once (what the runtime does at the next
/// step boundary).
class Driver {
 public:
  Driver(const std::string& name, const nlohmann::json& params, nlohmann::json settings,
         int workers)
      : policy_(builtins().make(name, params)), name_(name) {
    in_.settings = std::move(settings);
    in_.workers = workers;
    in_.version = 1;
  }

  Proposal before_train() {
    PolicyContext ctx(in_, name_);
    policy_->before_train(ctx);
    return ctx.proposal();
  }

  /// after_step at `step` with these metrics; applies the proposal when `apply`.
  Proposal step(std::int64_t step, std::map<std::string, double> metrics, bool apply = true) {
    in_.step = step;
    in_.metrics = std::move(metrics);
    PolicyContext ctx(in_, name_);
    policy_->after_step(ctx);
    const Proposal p = ctx.proposal();
    if (apply) this->apply(p);
    return p;
  }

  void apply(const Proposal& p) {
    if (p.batch_size) in_.settings["batch_size"] = *p.batch_size;
    if (p.learning_rate) in_.settings["lr"] = *p.learning_rate;
    if (p.algorithm) in_.settings["algorithm"] = *p.algorithm;
    if (p.workers && *p.workers != in_.workers) {
      in_.workers = *p.workers;
      ++in_.version;
      PolicyContext ctx(in_, name_);
      policy_->on_membership_change(ctx);
      EXPECT_TRUE(ctx.proposal().empty());
    }
  }

  PolicyInputs& inputs() { return in_; }

 private:
  std::unique_ptr<Policy> policy_;
  std::string name_;
  PolicyInputs in_;
};

/// The message of the std::invalid_argument that making `name` from `params` throws.
std::string make_error(const std::string& name, const nlohmann::json& params) {
  try {
    builtins().make(name, params);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

bool mentions(const Proposal& p, const std::string& text) {
  for (const auto& r : p.reasons) {
    if (r.find(text) != std::string::npos) return true;
  }
  return false;
}

// ---- registration ---------------------------------------------------------------------------

TEST(BuiltinPolicies, RegistersEachNameAndMakesItFromEmptyParams) {
  PolicyRegistry r;
  register_builtin_policies(r);
  for (const char* name : {"gns-batch-size"}) {
    ASSERT_TRUE(r.contains(name)) << name;
    auto p = r.make(name, nlohmann::json::object());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), name);
    EXPECT_EQ(r.make(name, nullptr)->name(), name) << "a job file entry without params";
  }
  EXPECT_THROW(register_builtin_policies(r), std::invalid_argument) << "registered twice";
}

TEST(BuiltinPolicies, RejectParamsThatAreNotAMapping) {
  EXPECT_EQ(make_error("gns-batch-size", nlohmann::json::array({1})),
            "gns-batch-size: params must be a mapping of parameters (got [1])");
}

// ---- gns-batch-size -----------------------------------------------------------------------

std::map<std::string, double> gns(double b_simple, bool valid = true) {
  std::map<std::string, double> m{{"gns.valid", valid ? 1.0 : 0.0},
                                  {"gns.noise_dominated", 0.0}};
  m["gns.b_simple"] = b_simple;
  return m;
}

std::map<std::string, double> noise_dominated() {
  return {{"gns.valid", 1.0}, {"gns.noise_dominated", 1.0}, {"gns.sqr", 0.0},
          {"gns.tr_sigma", 1000.0}};
}

nlohmann::json base_settings() {
  return {{"batch_size", 128}, {"lr", 0.1}, {"algorithm", "ring"}};
}

TEST(GnsBatchSize, DecidesNothingUntilTheEstimateIsValid) {
  Driver d("gns-batch-size", {{"every", 10}, {"patience", 1}, {"max_batch", 100000}},
           base_settings(), 4);
  EXPECT_TRUE(d.before_train().empty());
  for (std::int64_t s = 1; s <= 200; ++s) {
    EXPECT_TRUE(d.step(s, gns(5000.0, false)).empty()) << "invalid at step " << s;
  }
  for (std::int64_t s = 201; s <= 220; ++s) {
    auto m = gns(5000.0);
    m.erase("gns.b_simple");  // valid but no B_simple and not noise-dominated: no data
    EXPECT_TRUE(d.step(s, m).empty()) << "step " << s;
  }
  EXPECT_TRUE(d.step(221, gns(5000.0)).empty()) << "not an evaluation step (every 10)";
  const Proposal p = d.step(230, gns(5000.0));
  EXPECT_EQ(p.batch_size, 128 + 5000 + 128) << "M* = M0 + (1/e - 1)(phi + M0) with e = 0.5";
}

// KAT-EFF: phi = 1000 at M0 = 128, S = 8 (max_batch 1024), eta0 = 0.1.
TEST(GnsBatchSize, SetsTheLearningRateOfEachRuleWithTheBatch) {
  const std::map<std::string, double> expected{
      {"linear", 0.8}, {"sqrt", 0.282842712}, {"adascale", 0.445849802},
      {"adamscale", 0.211151558}};
  for (const auto& [rule, lr] : expected) {
    Driver d("gns-batch-size",
             {{"every", 10}, {"patience", 3}, {"max_batch", 1024}, {"lr_rule", rule}},
             base_settings(), 4);
    d.before_train();
    EXPECT_TRUE(d.step(10, gns(1000.0)).empty()) << rule;
    EXPECT_TRUE(d.step(20, gns(1000.0)).empty()) << rule;
    const Proposal p = d.step(30, gns(1000.0));
    ASSERT_EQ(p.batch_size, 1024) << rule;
    ASSERT_TRUE(p.learning_rate) << rule;
    EXPECT_NEAR(*p.learning_rate, lr, 1e-9) << rule;
    EXPECT_TRUE(mentions(p, "B_simple=1000")) << p.to_json().dump();
    EXPECT_TRUE(mentions(p, "+700% from 128 for 3 evaluations")) << p.to_json().dump();
    EXPECT_TRUE(mentions(p, rule + ": S=8")) << p.to_json().dump();
  }
  Driver none("gns-batch-size", {{"every", 10}, {"patience", 1}, {"lr_rule", "none"}},
              {{"batch_size", 128}}, 4);
  const Proposal p = none.step(10, gns(1000.0));
  EXPECT_EQ(p.batch_size, 1256);
  EXPECT_FALSE(p.learning_rate) << "lr_rule none leaves the LR alone (and needs no lr setting)";
}

TEST(GnsBatchSize, TargetFollowsMinEfficiencyBoundsAndMultiple) {
  // e = 0.8: M* = 128 + 0.25·(1000 + 128) = 410, rounded down to a multiple of 64: 384.
  Driver d("gns-batch-size",
           {{"every", 1}, {"patience", 1}, {"min_efficiency", 0.8}, {"multiple_of", 64}},
           base_settings(), 4);
  d.before_train();
  EXPECT_EQ(d.step(1, gns(1000.0)).batch_size, 384);
  // Noise-dominated: every batch is efficient, so the target is max_batch = 32·M0.
  Driver nd("gns-batch-size", {{"every", 1}, {"patience", 1}}, base_settings(), 4);
  nd.before_train();
  const Proposal p = nd.step(1, noise_dominated());
  EXPECT_EQ(p.batch_size, 4096);
  ASSERT_TRUE(p.learning_rate);
  EXPECT_NEAR(*p.learning_rate, 0.1 * 32, 1e-12) << "r(S) = S when noise-dominated";
  EXPECT_TRUE(mentions(p, "noise-dominated")) << p.to_json().dump();
  // min_batch above the target, and a multiple that rounds up to stay within the bounds.
  Driver lo("gns-batch-size",
            {{"every", 1}, {"patience", 1}, {"min_batch", 300}, {"max_batch", 1000},
             {"multiple_of", 256}, {"lr_rule", "linear"}},
            base_settings(), 4);
  lo.before_train();
  const Proposal q = lo.step(1, gns(0.0));
  EXPECT_EQ(q.batch_size, 512) << "M* = 2·M0 = 256 < min_batch 300: the next multiple, 512";
  EXPECT_NEAR(*q.learning_rate, 0.4, 1e-12);
}

TEST(GnsBatchSize, HysteresisNeedsTheSameDirectionBeyondTheMarginForPatienceEvaluations) {
  Driver d("gns-batch-size",
           {{"every", 10}, {"patience", 3}, {"margin", 0.25}, {"base_batch", 100}},
           {{"batch_size", 1000}, {"lr", 0.1}}, 4);
  d.before_train();  // M0 = 100: M* = phi + 200, current 1000
  // M* = 1200: +20%, inside the margin of 25%, however often.
  for (std::int64_t s = 10; s <= 100; s += 10) EXPECT_TRUE(d.step(s, gns(1000.0)).empty());
  // Beyond the margin twice, then an invalid evaluation: the streak starts over.
  EXPECT_TRUE(d.step(110, gns(2800.0)).empty());
  EXPECT_TRUE(d.step(120, gns(2800.0)).empty());
  EXPECT_TRUE(d.step(130, gns(2800.0, false)).empty());
  EXPECT_TRUE(d.step(140, gns(2800.0)).empty());
  EXPECT_TRUE(d.step(150, gns(2800.0)).empty());
  // Down (M* = 500, -50%) breaks the upward streak; a step between evaluations changes nothing.
  EXPECT_TRUE(d.step(160, gns(300.0)).empty());
  EXPECT_TRUE(d.step(170, gns(2800.0)).empty());
  EXPECT_TRUE(d.step(175, gns(2800.0)).empty());
  EXPECT_TRUE(d.step(180, gns(2800.0)).empty());
  const Proposal p = d.step(190, gns(2800.0));
  EXPECT_EQ(p.batch_size, 3000);
  EXPECT_EQ(d.inputs().settings["batch_size"], 3000);
}

TEST(GnsBatchSize, CoolsDownAfterAChangeAndShrinksBackToTheBase) {
  Driver d("gns-batch-size",
           {{"every", 10}, {"patience", 2}, {"cooldown", 100}, {"lr_rule", "sqrt"}},
           base_settings(), 4);
  d.before_train();
  EXPECT_TRUE(d.step(10, gns(1000.0)).empty());
  EXPECT_EQ(d.step(20, gns(1000.0)).batch_size, 1256);
  // The noise scale collapses: M* = 2·M0 = 256. No evaluation before step 120.
  for (std::int64_t s = 30; s < 120; s += 10) EXPECT_TRUE(d.step(s, gns(0.0)).empty()) << s;
  EXPECT_TRUE(d.step(120, gns(0.0)).empty()) << "first evaluation after the cool-down";
  const Proposal p = d.step(130, gns(0.0));
  EXPECT_EQ(p.batch_size, 256);
  ASSERT_TRUE(p.learning_rate);
  EXPECT_NEAR(*p.learning_rate, 0.1 * std::sqrt(2.0), 1e-12) << "eta0 from before_train";
  EXPECT_TRUE(mentions(p, "-79.6178% from 1256")) << p.to_json().dump();
}

TEST(GnsBatchSize, BaseParametersOverrideTheSettings) {
  Driver d("gns-batch-size",
           {{"every", 1}, {"patience", 1}, {"base_batch", 64}, {"base_lr", 0.05},
            {"lr_rule", "linear"}, {"max_batch", 512}},
           base_settings(), 4);
  d.before_train();
  const Proposal p = d.step(1, noise_dominated());
  EXPECT_EQ(p.batch_size, 512);
  EXPECT_NEAR(*p.learning_rate, 0.05 * 8, 1e-12);
}

TEST(GnsBatchSize, MissingSettingsDisableThePolicyWithAReason) {
  Driver d("gns-batch-size", {}, {{"lr", 0.1}}, 4);
  try {
    d.before_train();
    ADD_FAILURE() << "no batch_size setting";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "gns-batch-size: the settings have no positive integer 'batch_size'");
  }
  Driver no_lr("gns-batch-size", {}, {{"batch_size", 32}}, 4);
  EXPECT_THROW(no_lr.before_train(), std::runtime_error);
  Driver range("gns-batch-size", {{"min_batch", 100}, {"max_batch", 120}, {"multiple_of", 64}},
               base_settings(), 4);
  EXPECT_THROW(range.before_train(), std::runtime_error) << "no multiple of 64 in [100, 120]";
}

TEST(GnsBatchSize, RejectsEveryBadParameterByName) {
  const std::string p = "gns-batch-size: parameter ";
  EXPECT_EQ(make_error("gns-batch-size", {{"every", 0}}),
            p + "'every' must be an integer in [1, 1000000000] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"every", 1.5}}),
            p + "'every' must be an integer in [1, 1000000000] (got 1.5)");
  EXPECT_EQ(make_error("gns-batch-size", {{"min_efficiency", 0}}),
            p + "'min_efficiency' must be a number in (0, 1] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"min_efficiency", "high"}}),
            p + "'min_efficiency' must be a number in (0, 1] (got \"high\")");
  EXPECT_EQ(make_error("gns-batch-size", {{"lr_rule", "cubic"}}),
            p + "'lr_rule' must be one of linear, sqrt, adascale, adamscale, none (got \"cubic\")");
  EXPECT_EQ(make_error("gns-batch-size", {{"base_batch", -1}}),
            p + "'base_batch' must be an integer in [1, 2147483647] (got -1)");
  EXPECT_EQ(make_error("gns-batch-size", {{"base_lr", 0.0}}),
            p + "'base_lr' must be a number in (0, 1000000] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"min_batch", 0}}),
            p + "'min_batch' must be an integer in [1, 2147483647] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"max_batch", true}}),
            p + "'max_batch' must be an integer in [1, 2147483647] (got true)");
  EXPECT_EQ(make_error("gns-batch-size", {{"min_batch", 512}, {"max_batch", 256}}),
            p + "'min_batch' must not exceed max_batch (512 > 256)");
  EXPECT_EQ(make_error("gns-batch-size", {{"multiple_of", 0}}),
            p + "'multiple_of' must be an integer in [1, 2147483647] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"margin", -0.1}}),
            p + "'margin' must be a number in [0, 10] (got -0.1)");
  EXPECT_EQ(make_error("gns-batch-size", {{"patience", 0}}),
            p + "'patience' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error("gns-batch-size", {{"cooldown", -5}}),
            p + "'cooldown' must be an integer in [0, 1000000000] (got -5)");
  EXPECT_EQ(make_error("gns-batch-size", {{"evry", 10}}),
            "gns-batch-size: unknown parameter 'evry' (known: base_batch, base_lr, cooldown, "
            "every, lr_rule, margin, max_batch, min_batch, min_efficiency, multiple_of, patience)");
}

}  // namespace
}  // namespace kf
