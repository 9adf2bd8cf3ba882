// SPDX-License-Identifier: Apache-2.0
// The built-in policies without a cluster: synthetic PolicyInputs sequences go through each
// policy's hooks the way PolicyRunner calls them, and the tests assert the decisions (step and
// values), the gates (nothing before the inputs are valid or sufficient), hysteresis and
// cool-down, bounds, the LR rules (the KAT-EFF known answers), Or et al.'s rule
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
    if (p.mode) in_.settings["mode"] = *p.mode;
    if (p.compression) in_.settings["compression"] = *p.compression;
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
  for (const char* name : {"gns-batch-size", "throughput-scaling", "algorithm-selection",
                           "adaptive-sync", "compression-by-bandwidth", "stragglers"}) {
    ASSERT_TRUE(r.contains(name)) << name;
    auto p = r.make(name, nlohmann::json::object());
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), name);
    EXPECT_EQ(r.make(name, nullptr)->name(), name) << "a job file entry without params";
  }
  EXPECT_THROW(register_builtin_policies(r), std::invalid_argument) << "registered twice";
}

TEST(BuiltinPolicies, RejectParamsThatAreNotAMapping) {
  for (const std::string name : {"gns-batch-size", "throughput-scaling", "algorithm-selection",
                                 "adaptive-sync", "compression-by-bandwidth", "stragglers"}) {
    EXPECT_EQ(make_error(name, nlohmann::json::array({1})),
              name + ": params must be a mapping of parameters (got [1])");
    EXPECT_EQ(
        make_error(name, {{"bogus", 1}}).rfind(name + ": unknown parameter 'bogus' (known: ", 0),
        0u);
  }
}

// ---- gns-batch-size -----------------------------------------------------------------------

std::map<std::string, double> gns(double b_simple, bool valid = true) {
  std::map<std::string, double> m{{"gns.valid", valid ? 1.0 : 0.0}, {"gns.noise_dominated", 0.0}};
  m["gns.b_simple"] = b_simple;
  return m;
}

std::map<std::string, double> noise_dominated() {
  return {
      {"gns.valid", 1.0}, {"gns.noise_dominated", 1.0}, {"gns.sqr", 0.0}, {"gns.tr_sigma", 1000.0}};
}

nlohmann::json base_settings() { return {{"batch_size", 128}, {"lr", 0.1}, {"algorithm", "ring"}}; }

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
  const std::map<std::string, double> expected{{"linear", 0.8},
                                               {"sqrt", 0.282842712},
                                               {"adascale", 0.445849802},
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
            {{"every", 1},
             {"patience", 1},
             {"min_batch", 300},
             {"max_batch", 1000},
             {"multiple_of", 256},
             {"lr_rule", "linear"}},
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
           {{"every", 1},
            {"patience", 1},
            {"base_batch", 64},
            {"base_lr", 0.05},
            {"lr_rule", "linear"},
            {"max_batch", 512}},
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

// ---- throughput-scaling ---------------------------------------------------------------------

/// One step of `samples` samples at `rate` samples/s.
std::map<std::string, double> throughput(double rate, double samples = 256) {
  return {{"samples", samples}, {"step_time", samples / rate}};
}

struct Decision {
  std::int64_t step;
  Proposal proposal;
};

// KAT-THR-3: R = {4: 400, 8: 720, 12: 900, 16: 960}; at threshold 0.25 the target is 12.
TEST(ThroughputScaling, AddsWhilePairsPassThenSettlesAtTheFirstFailingCount) {
  Driver d(
      "throughput-scaling",
      {{"threshold", 0.25}, {"spawn_size", 4}, {"min_steps", 10}, {"every", 10}, {"cooldown", 0}},
      {{"batch_size", 256}, {"lr", 0.1}, {"algorithm", "ring"}}, 4);
  const std::map<int, double> rate{{4, 400.0}, {8, 720.0}, {12, 900.0}, {16, 960.0}};
  std::vector<Decision> decisions;
  for (std::int64_t s = 1; s <= 300; ++s) {
    const Proposal p = d.step(s, throughput(rate.at(d.inputs().workers)));
    if (!p.empty()) decisions.push_back({s, p});
  }
  ASSERT_EQ(decisions.size(), 4u);
  // 2 warm-up steps are discarded at each count, so 10 counted steps take until the second
  // evaluation there.
  EXPECT_EQ(decisions[0].step, 20);
  EXPECT_EQ(decisions[0].proposal.workers, 8);
  EXPECT_EQ(decisions[0].proposal.reasons.at(0),
            "throughput-scaling: workers=8 (R={4: 400} samples/s: one worker count measured, "
            "add 4 past 4: 4 -> 8 workers)");
  EXPECT_EQ(decisions[1].step, 40);
  EXPECT_EQ(decisions[1].proposal.workers, 12);
  EXPECT_TRUE(mentions(decisions[1].proposal, "s(4->8)=0.8: every pair passes, add 4 past 8"))
      << decisions[1].proposal.to_json().dump();
  EXPECT_EQ(decisions[2].step, 60);
  EXPECT_EQ(decisions[2].proposal.workers, 16);
  EXPECT_TRUE(mentions(decisions[2].proposal, "s(8->12)=0.5: every pair passes"));
  // At 16 the pair 12->16 fails (0.2): three consecutive evaluations (80, 90, 100) give back 4.
  EXPECT_EQ(decisions[3].step, 100);
  EXPECT_EQ(decisions[3].proposal.workers, 12);
  EXPECT_TRUE(mentions(decisions[3].proposal,
                       "s(12->16)=0.2 <= threshold 0.25: settle at 12 for 3 evaluations: "
                       "16 -> 12 workers"))
      << decisions[3].proposal.to_json().dump();
  EXPECT_EQ(d.inputs().workers, 12) << "and it stays there";
}

TEST(ThroughputScaling, GivingWorkersBackNeedsConsecutiveEvaluations) {
  Driver d("throughput-scaling",
           {{"spawn_size", 4},
            {"min_steps", 1},
            {"every", 1},
            {"warmup_steps", 0},
            {"cooldown", 0},
            {"min_consecutive_passes_for_remove", 2}},
           {{"batch_size", 256}, {"max_workers", 8}}, 4);
  EXPECT_EQ(d.step(1, throughput(400.0)).workers, 8);
  // R(8) = 420: s(4->8) = 0.05 fails: give back 4 workers, but only at the second evaluation.
  EXPECT_TRUE(d.step(2, throughput(420.0)).empty());
  // A fast step lifts R(8) to 591.6 (s = 0.48 passes): adding is bounded at max_workers 8, so
  // nothing changes, and the streak of failing evaluations starts over.
  EXPECT_TRUE(d.step(3, throughput(1000.0)).empty());
  EXPECT_TRUE(d.step(4, throughput(128.0)).empty()) << "R(8) = 268: the first failure again";
  const Proposal p = d.step(5, throughput(128.0));
  EXPECT_EQ(p.workers, 4);
  EXPECT_TRUE(mentions(p, "settle at 4 for 2 evaluations")) << p.to_json().dump();
}

TEST(ThroughputScaling, WaitsForMinStepsAndBoundsTheTarget) {
  Driver d("throughput-scaling", {{"min_steps", 30}, {"every", 5}, {"max_workers", 5}},
           {{"batch_size", 256}, {"min_workers", 2}}, 2);
  for (std::int64_t s = 1; s <= 31; ++s) {
    EXPECT_TRUE(d.step(s, throughput(100.0)).empty()) << "fewer than 30 counted steps at " << s;
  }
  for (std::int64_t s = 32; s <= 34; ++s) {
    EXPECT_TRUE(d.step(s, {{"step_time", 1.0}}).empty()) << "no samples: not counted";
  }
  // Steps 1 and 2 were warm-up: step 35 is the 30th counted one, and an evaluation step.
  const Proposal p = d.step(35, throughput(100.0));
  EXPECT_EQ(p.workers, 5) << "2 + 4, bounded by the max_workers parameter";
  EXPECT_TRUE(mentions(p, "add 4 past 2; bounded by [2, 5]: 2 -> 5 workers")) << p.to_json().dump();
  // A max_workers setting of 0 is no bound (as in the session); the parameter is absent here.
  Driver open("throughput-scaling", {{"min_steps", 1}, {"every", 1}, {"warmup_steps", 0}},
              {{"batch_size", 256}, {"max_workers", 0}}, 2);
  EXPECT_EQ(open.step(1, throughput(100.0)).workers, 6);
}

TEST(ThroughputScaling, KeepsObservationsAcrossResizesButNotAcrossBatchChanges) {
  Driver d(
      "throughput-scaling",
      {{"spawn_size", 2}, {"min_steps", 1}, {"every", 1}, {"warmup_steps", 0}, {"cooldown", 0}},
      {{"batch_size", 256}}, 2);
  EXPECT_EQ(d.step(1, throughput(200.0)).workers, 4);
  EXPECT_EQ(d.step(2, throughput(400.0)).workers, 6) << "R(2) kept: s(2->4) = 1 passes";
  d.inputs().settings["batch_size"] = 512;  // another batch: the old throughputs do not count
  const Proposal p = d.step(3, throughput(500.0, 512));
  EXPECT_EQ(p.workers, 8);
  EXPECT_TRUE(mentions(p, "R={6: 500} samples/s: one worker count measured")) << p.to_json().dump();
}

TEST(ThroughputScaling, RejectsEveryBadParameterByName) {
  const std::string p = "throughput-scaling: parameter ";
  EXPECT_EQ(make_error("throughput-scaling", {{"spawn_size", 0}}),
            p + "'spawn_size' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error("throughput-scaling", {{"threshold", -0.5}}),
            p + "'threshold' must be a number in [0, 10] (got -0.5)");
  EXPECT_EQ(make_error("throughput-scaling", {{"min_steps", 0}}),
            p + "'min_steps' must be an integer in [1, 1000000000] (got 0)");
  EXPECT_EQ(make_error("throughput-scaling", {{"every", "often"}}),
            p + "'every' must be an integer in [1, 1000000000] (got \"often\")");
  EXPECT_EQ(make_error("throughput-scaling", {{"min_consecutive_passes_for_remove", 0}}),
            p + "'min_consecutive_passes_for_remove' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error("throughput-scaling", {{"warmup_steps", -1}}),
            p + "'warmup_steps' must be an integer in [0, 1000000000] (got -1)");
  EXPECT_EQ(make_error("throughput-scaling", {{"cooldown", 0.5}}),
            p + "'cooldown' must be an integer in [0, 1000000000] (got 0.5)");
  EXPECT_EQ(make_error("throughput-scaling", {{"min_workers", 0}}),
            p + "'min_workers' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error("throughput-scaling", {{"max_workers", 2000000}}),
            p + "'max_workers' must be an integer in [1, 1000000] (got 2000000)");
  EXPECT_EQ(make_error("throughput-scaling", {{"min_workers", 8}, {"max_workers", 4}}),
            p + "'min_workers' must not exceed max_workers (8 > 4)");
  EXPECT_EQ(make_error("throughput-scaling", {{"spawn", 4}}),
            "throughput-scaling: unknown parameter 'spawn' (known: cooldown, every, max_workers, "
            "min_consecutive_passes_for_remove, min_steps, min_workers, spawn_size, threshold, "
            "warmup_steps)");
}

// ---- algorithm-selection --------------------------------------------------------------------

constexpr double kMessage = 4 * 1024 * 1024;

/// One step that allreduced kMessage bytes at `gbps` GB/s.
std::map<std::string, double> comm(double gbps) {
  return {{"comm_bytes", kMessage}, {"comm_time", kMessage / (gbps * 1e9)}, {"algbw", gbps * 1e9}};
}

/// Runs steps [from, to] at `gbps`, returning the proposals made.
std::vector<Decision> run(Driver& d, std::int64_t from, std::int64_t to, double gbps) {
  std::vector<Decision> out;
  for (std::int64_t s = from; s <= to; ++s) {
    Proposal p = d.step(s, comm(gbps));
    if (!p.empty()) out.push_back({s, std::move(p)});
  }
  return out;
}

// With the default link (15 us, 2.5 GB/s, 5 GB/s reductions), 4 MiB on 4 workers:
// rhd 3205.73 us < ring 3235.73 = clique < tree 8448.61 < star 12672.9.
TEST(AlgorithmSelection, StartsFromThePriorArgmin) {
  Driver d("algorithm-selection", {}, {{"algorithm", "ring"}}, 4);
  const Proposal p = d.step(1, comm(1.0));
  EXPECT_EQ(p.algorithm, "rhd");
  EXPECT_TRUE(mentions(p,
                       "prior for 4 workers, 4.1943e+06 B: rhd 3205.73 us ring 3235.73 us "
                       "clique 3235.73 us tree 8448.61 us star 12672.9 us"))
      << p.to_json().dump();
  EXPECT_TRUE(run(d, 2, 500, 1.0).empty()) << "steady bandwidth: no further change";
  // A new configuration ranks again: on 3 workers the folded rhd loses to ring.
  d.inputs().workers = 3;
  EXPECT_EQ(d.step(501, comm(1.0)).algorithm, "ring");
}

TEST(AlgorithmSelection, DecidesNothingWithoutCommunication) {
  Driver one("algorithm-selection", {}, {{"algorithm", "ring"}}, 1);
  EXPECT_TRUE(run(one, 1, 100, 1.0).empty()) << "one worker: no allreduce";
  Driver quiet("algorithm-selection", {}, {{"algorithm", "ring"}}, 4);
  for (std::int64_t s = 1; s <= 100; ++s) EXPECT_TRUE(quiet.step(s, {}).empty());
  // With message_bytes the prior needs no measurement.
  Driver sized("algorithm-selection", {{"message_bytes", 4194304}}, {{"algorithm", "ring"}}, 4);
  EXPECT_EQ(sized.step(1, {}).algorithm, "rhd");
}

TEST(AlgorithmSelection, TriesTheNextBestOnDegradationAndSwitchesBack) {
  Driver d("algorithm-selection", {{"window", 5}, {"warmup_steps", 1}, {"retry_windows", 3}},
           {{"algorithm", "rhd"}}, 4);
  // Step 1 discarded (warm-up); steps 2-6 make rhd's reference window: 1 GB/s.
  EXPECT_TRUE(run(d, 1, 6, 1.0).empty());
  // A window at 0.7 GB/s < 0.8 x 1: try ring, the next by the prior.
  auto ds = run(d, 7, 11, 0.7);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 11);
  EXPECT_EQ(ds[0].proposal.algorithm, "ring");
  EXPECT_TRUE(mentions(ds[0].proposal,
                       "rhd: algbw 0.7 GB/s < 0.8 x reference 1 GB/s for 1 "
                       "windows: try ring (next by the prior) for a window"))
      << ds[0].proposal.to_json().dump();
  // ring's probation window (steps 13-17, after one warm-up step) at 0.9 beats 0.7: it stays.
  EXPECT_TRUE(run(d, 12, 17, 0.9).empty());
  // Three windows later rhd is probed again (steps 22, 27, 32).
  ds = run(d, 18, 32, 0.9);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 32);
  EXPECT_EQ(ds[0].proposal.algorithm, "rhd");
  EXPECT_TRUE(mentions(ds[0].proposal,
                       "ring has run for 3 windows at 0.9 GB/s: probe rhd "
                       "again (reference 1 GB/s)"));
  // Still slow (0.6 < 0.8 and <= ring's 0.9): back to ring, rhd's reference kept.
  ds = run(d, 33, 38, 0.6);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 38);
  EXPECT_EQ(ds[0].proposal.algorithm, "ring");
  EXPECT_TRUE(mentions(ds[0].proposal,
                       "rhd probed again: 0.6 GB/s < 0.8 x its reference 1 GB/s "
                       "and <= ring's 0.9 GB/s: back to ring"));
  ds = run(d, 39, 54, 0.9);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 54);
  EXPECT_EQ(ds[0].proposal.algorithm, "rhd");
  // Recovered (0.95 >= 0.8 x 1): rhd stays for good.
  EXPECT_TRUE(run(d, 55, 300, 0.95).empty());
  EXPECT_EQ(d.inputs().settings["algorithm"], "rhd");
}

TEST(AlgorithmSelection, ReturnsFromAFailedProbationAndRebaselinesWhenAllAreWorse) {
  Driver d("algorithm-selection",
           {{"window", 5}, {"warmup_steps", 1}, {"algorithms", {"tree", "ring", "rhd"}}},
           {{"algorithm", "rhd"}}, 4);
  EXPECT_TRUE(run(d, 1, 6, 1.0).empty());
  auto ds = run(d, 7, 11, 0.7);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].proposal.algorithm, "ring");
  // ring's probation at 0.5 <= rhd's 0.7: back to rhd (steps 12 warm-up, 13-17 the window).
  ds = run(d, 12, 17, 0.5);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 17);
  EXPECT_EQ(ds[0].proposal.algorithm, "rhd");
  EXPECT_TRUE(mentions(ds[0].proposal,
                       "ring on probation: 0.5 GB/s <= rhd's 0.7 GB/s: back to "
                       "rhd (its reference 1 GB/s kept)"))
      << ds[0].proposal.to_json().dump();
  // rhd is still degraded: the next candidate, tree, gets its window, and loses too.
  ds = run(d, 18, 23, 0.7);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].step, 23);
  EXPECT_EQ(ds[0].proposal.algorithm, "tree");
  ds = run(d, 24, 29, 0.3);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].proposal.algorithm, "rhd");
  // Every candidate was tried: 0.7 becomes rhd's reference, and nothing changes any more.
  EXPECT_TRUE(run(d, 30, 400, 0.7).empty());
  EXPECT_EQ(d.inputs().settings["algorithm"], "rhd");
}

TEST(AlgorithmSelection, FollowsAnAlgorithmSetFromOutside) {
  Driver d("algorithm-selection", {{"window", 5}, {"warmup_steps", 0}, {"retry_windows", 0}},
           {{"algorithm", "rhd"}}, 4);
  EXPECT_TRUE(run(d, 1, 5, 1.0).empty());
  d.inputs().settings["algorithm"] = "tree";  // the user (or another policy) chose tree
  EXPECT_TRUE(run(d, 6, 10, 0.2).empty()) << "tree's first window is its reference";
  const auto ds = run(d, 11, 15, 0.1);
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].proposal.algorithm, "rhd") << "degraded tree: the first untried by the prior";
}

TEST(AlgorithmSelection, RejectsEveryBadParameterByName) {
  const std::string p = "algorithm-selection: parameter ";
  EXPECT_EQ(make_error("algorithm-selection", {{"window", 0}}),
            p + "'window' must be an integer in [1, 1000000000] (got 0)");
  EXPECT_EQ(make_error("algorithm-selection", {{"warmup_steps", -1}}),
            p + "'warmup_steps' must be an integer in [0, 1000000000] (got -1)");
  EXPECT_EQ(make_error("algorithm-selection", {{"threshold", 1}}),
            p + "'threshold' must be a number in (0, 1) (got 1)");
  EXPECT_EQ(make_error("algorithm-selection", {{"patience", 0}}),
            p + "'patience' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error("algorithm-selection", {{"retry_windows", -2}}),
            p + "'retry_windows' must be an integer in [0, 1000000000] (got -2)");
  EXPECT_EQ(make_error("algorithm-selection", {{"algorithms", nlohmann::json::array()}}),
            p + "'algorithms' must be a non-empty list of distinct names from ring, rhd, "
                "clique, tree, star (got [])");
  EXPECT_EQ(make_error("algorithm-selection", {{"algorithms", {"ring", "auto"}}}),
            p + "'algorithms' must be a non-empty list of distinct names from ring, rhd, "
                "clique, tree, star (got \"auto\")");
  EXPECT_EQ(make_error("algorithm-selection", {{"algorithms", {"ring", "ring"}}}),
            p + "'algorithms' must be a non-empty list of distinct names from ring, rhd, "
                "clique, tree, star (\"ring\" is named twice)");
  EXPECT_EQ(make_error("algorithm-selection", {{"message_bytes", -1}}),
            p + "'message_bytes' must be an integer in [0, 1125899906842624] (got -1)");
  EXPECT_EQ(make_error("algorithm-selection", {{"alpha", 2}}),
            p + "'alpha' must be a number in [0, 1] (got 2)");
  EXPECT_EQ(make_error("algorithm-selection", {{"beta", -1e-9}}),
            p + "'beta' must be a number in [0, 1] (got -1e-09)");
  EXPECT_EQ(make_error("algorithm-selection", {{"gamma", "fast"}}),
            p + "'gamma' must be a number in [0, 1] (got \"fast\")");
  EXPECT_EQ(make_error("algorithm-selection", {{"alpha", 0}, {"beta", 0}}),
            p + "'beta' and alpha cannot both be 0 (the prior would predict no time)");
  EXPECT_EQ(make_error("algorithm-selection", {{"windows", 5}}),
            "algorithm-selection: unknown parameter 'windows' (known: algorithms, alpha, beta, "
            "gamma, message_bytes, patience, retry_windows, threshold, warmup_steps, window)");
}

// ---- adaptive-sync ------------------------------------------------------------------------

std::map<std::string, double> averaged(double divergence) {
  return {{"sma.averaged", 1.0}, {"sma.divergence", divergence}};
}

TEST(AdaptiveSync, LeavesSyncSgdForSmaOnceTheBatchExceedsTheNoiseScaleForPatienceSteps) {
  Driver d("adaptive-sync", {{"patience", 3}, {"period", 8}}, base_settings(), 4);
  EXPECT_TRUE(d.step(1, gns(200)).empty()) << "batch 128 below the noise scale";
  EXPECT_TRUE(d.step(2, gns(100)).empty());
  EXPECT_TRUE(d.step(3, gns(100)).empty());
  EXPECT_TRUE(d.step(4, gns(100, /*valid=*/false)).empty()) << "an invalid estimate counts not";
  const Proposal p = d.step(5, gns(100));
  ASSERT_TRUE(p.mode);
  EXPECT_EQ(*p.mode, "sma:period=8");
  EXPECT_TRUE(mentions(p, "noise scale"));
  // A batch below the noise scale in between starts the count again.
  Driver e("adaptive-sync", {{"patience", 2}}, base_settings(), 4);
  EXPECT_TRUE(e.step(1, gns(100)).empty());
  EXPECT_TRUE(e.step(2, gns(500)).empty());
  EXPECT_TRUE(e.step(3, gns(100)).empty());
  EXPECT_EQ(*e.step(4, gns(100)).mode, "sma:period=4");
}

TEST(AdaptiveSync, ChangesThePeriodByTheModelsDivergenceAndReturnsToSyncSgd) {
  nlohmann::json s = base_settings();
  s["mode"] = "sma:period=8";
  Driver d("adaptive-sync", {{"cooldown", 0}, {"max_period", 16}}, s, 4);
  EXPECT_TRUE(d.step(1, {{"sma.divergence", 1.0}}).empty()) << "no average at this step";
  EXPECT_TRUE(d.step(2, averaged(1e-4)).empty()) << "between low and high";
  EXPECT_EQ(*d.step(3, averaged(1e-6)).mode, "sma:period=16");
  EXPECT_TRUE(d.step(4, averaged(1e-6)).empty()) << "at max_period";
  EXPECT_EQ(*d.step(5, averaged(0.1)).mode, "sma:period=8");
  EXPECT_EQ(*d.step(6, averaged(0.1)).mode, "sma:period=4");
  EXPECT_EQ(*d.step(7, averaged(0.1)).mode, "sma:period=2");
  const Proposal back = d.step(8, averaged(0.1));
  EXPECT_EQ(*back.mode, "sync-sgd");
  EXPECT_TRUE(mentions(back, "divergence"));
}

TEST(AdaptiveSync, CoolsDownAfterAProposal) {
  nlohmann::json s = base_settings();
  s["mode"] = "sma:period=8";
  Driver d("adaptive-sync", {{"cooldown", 10}}, s, 4);
  EXPECT_TRUE(d.step(1, averaged(0.1)).mode);
  EXPECT_TRUE(d.step(5, averaged(0.1)).empty());
  EXPECT_TRUE(d.step(11, averaged(0.1)).mode);
}

TEST(AdaptiveSync, RejectsEveryBadParameterByName) {
  EXPECT_EQ(make_error("adaptive-sync", {{"period", 1}}),
            "adaptive-sync: parameter 'period' must be an integer in [2, 1000000] (got 1)");
  EXPECT_EQ(make_error("adaptive-sync", {{"period", 64}}),
            "adaptive-sync: parameter 'period' must not exceed max_period");
  EXPECT_EQ(make_error("adaptive-sync", {{"low", 0.1}, {"high", 0.01}}),
            "adaptive-sync: parameter 'low' must be below high");
  EXPECT_EQ(make_error("adaptive-sync", {{"noise_ratio", 0}})
                .rfind("adaptive-sync: parameter 'noise_ratio' must be", 0),
            0u);
}

// ---- compression-by-bandwidth -----------------------------------------------------------

std::map<std::string, double> comm(double bytes, double seconds) {
  return {{"comm_bytes", bytes}, {"comm_time", seconds}};
}

TEST(CompressionByBandwidth, TurnsCompressionOnBelowOnBelowAndOffAboveOffAbove) {
  Driver d("compression-by-bandwidth",
           {{"patience", 2}, {"cooldown", 0}, {"on_below", 1e8}, {"off_above", 1e9}},
           base_settings(), 4);
  EXPECT_TRUE(d.step(1, comm(4e6, 0.01)).empty()) << "400 MB/s: fast enough";
  EXPECT_TRUE(d.step(2, comm(4e6, 0.1)).empty()) << "40 MB/s, once";
  const Proposal on = d.step(3, comm(4e6, 0.1));
  ASSERT_TRUE(on.compression);
  EXPECT_EQ(*on.compression, "topk:0.01");
  // Compressed: 80 kB in 5 ms. 4 MB would take 5 ms at 800 MB/s: below off_above, stays on.
  EXPECT_TRUE(d.step(4, comm(8e4, 0.005)).empty());
  EXPECT_TRUE(d.step(5, comm(8e4, 0.005)).empty());
  // The network got fast: 4 MB in 2 ms would be 2 GB/s.
  EXPECT_TRUE(d.step(6, comm(8e4, 0.002)).empty());
  EXPECT_EQ(*d.step(7, comm(8e4, 0.002)).compression, "none");
}

TEST(CompressionByBandwidth, LeavesOtherModesAndUnmeasuredStepsAlone) {
  nlohmann::json s = base_settings();
  s["mode"] = "sma:period=4";
  Driver d("compression-by-bandwidth", {{"patience", 1}}, s, 4);
  EXPECT_TRUE(d.step(1, comm(4e6, 1.0)).empty());
  Driver e("compression-by-bandwidth", {{"patience", 1}}, base_settings(), 4);
  EXPECT_TRUE(e.step(1, {}).empty()) << "no communication measured";
  s["mode"] = "sync-sgd";
  s["compression"] = "fp16";
  Driver f("compression-by-bandwidth", {{"patience", 1}}, s, 4);
  EXPECT_TRUE(f.step(1, comm(8e4, 1e-6)).empty()) << "started compressed: no full size known";
}

TEST(CompressionByBandwidth, RejectsEveryBadParameterByName) {
  EXPECT_EQ(make_error("compression-by-bandwidth", {{"compression", "none"}}),
            "compression-by-bandwidth: parameter 'compression' must compress (not none)");
  EXPECT_EQ(make_error("compression-by-bandwidth", {{"compression", "topk"}}),
            "compression-by-bandwidth: parameter 'compression' compression 'topk': topk needs a "
            "ratio in (0, 1] after ':', e.g. topk:0.01");
  EXPECT_EQ(make_error("compression-by-bandwidth", {{"compression", 3}}),
            "compression-by-bandwidth: parameter 'compression' must be a string (got 3)");
  EXPECT_EQ(make_error("compression-by-bandwidth", {{"on_below", 5e9}}),
            "compression-by-bandwidth: parameter 'on_below' must be below off_above");
}

}  // namespace
}  // namespace kf
