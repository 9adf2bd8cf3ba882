// SPDX-License-Identifier: Apache-2.0
// The model-based built-ins (optimus, hemingway) without a cluster: a synthetic job whose step
// time follows the speed (or system) model and whose loss follows the loss (or convergence) model
// goes through each policy's hooks, and the tests assert at which step which size is proposed:
// the exploration that collects configurations, no decision before the gates pass, the decision
// by marginal gain / by target or budget, the margin, the cool-down, the step limit, the bounds,
// doing nothing without a loss metric, determinism, and the bad-parameter messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kf/policies/builtin.hpp"

namespace kf {
namespace {

const PolicyRegistry& registry() {
  static const PolicyRegistry r = [] {
    PolicyRegistry reg;
    register_builtin_policies(reg);
    return reg;
  }();
  return r;
}

struct Decision {
  std::int64_t step = 0;
  int from = 0;
  int to = 0;
  std::string reason;
};

/// A synthetic job: each step reports step_time(workers), `batch` samples and, when set,
/// loss(step, samples done, workers); a proposed size is applied at once, with the membership
/// hook, the way the runtime applies it at the next step boundary.
struct Job {
  std::function<double(int)> step_time;
  std::function<double(std::int64_t, double, int)> loss;  // empty: no loss metric
  int workers = 1;
  std::int64_t batch = 64;
  nlohmann::json settings = {{"batch_size", 64}, {"min_workers", 1}, {"max_workers", 8}};
};

std::vector<Decision> run(const std::string& name, const nlohmann::json& params, Job job,
                          std::int64_t first_step, std::int64_t last_step) {
  std::unique_ptr<Policy> policy = registry().make(name, params);
  PolicyInputs in;
  in.settings = job.settings;
  in.workers = job.workers;
  in.version = 1;
  std::vector<Decision> decisions;
  double samples_done = 0.0;
  for (std::int64_t s = first_step; s <= last_step; ++s) {
    samples_done += static_cast<double>(job.batch);
    in.step = s;
    in.metrics = {{"step_time", job.step_time(in.workers)},
                  {"samples", static_cast<double>(job.batch)}};
    if (job.loss) in.metrics["loss"] = job.loss(s, samples_done, in.workers);
    PolicyContext ctx(in, name);
    policy->after_step(ctx);
    const Proposal& p = ctx.proposal();
    EXPECT_FALSE(p.batch_size || p.learning_rate || p.algorithm || p.stop) << "step " << s;
    if (!p.workers) continue;
    decisions.push_back({s, in.workers, *p.workers, p.reasons.empty() ? "" : p.reasons.back()});
    if (*p.workers != in.workers) {
      in.workers = *p.workers;
      ++in.version;
      PolicyContext change(in, name);
      policy->on_membership_change(change);
      EXPECT_TRUE(change.proposal().empty());
    }
  }
  return decisions;
}

std::string error_of(const std::string& name, const nlohmann::json& params) {
  try {
    registry().make(name, params);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

std::string sizes(const std::vector<Decision>& d) {
  std::string s;
  for (const auto& x : d) {
    s += (s.empty() ? "" : " ") + std::to_string(x.step) + ":" + std::to_string(x.from) + "->" +
         std::to_string(x.to);
  }
  return s;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(BuiltinModels, RegisteredAndMadeFromEmptyParams) {
  for (const char* name : {"optimus", "hemingway"}) {
    ASSERT_TRUE(registry().contains(name)) << name;
    EXPECT_EQ(registry().make(name, nlohmann::json::object())->name(), name);
    EXPECT_EQ(registry().make(name, nullptr)->name(), name);
  }
}

// ---- optimus -------------------------------------------------------------------------------
// Speed: t(w) = 0.0025·64/w + 0.05 + 0.01·w, fastest at w = 4 (throughput saturates there):
// t = 0.22, 0.15, 0.1333, 0.13, 0.132 s for w = 1..5. Loss: β = (0.05, 1, 0.2) over epochs of
// 640 samples (10 steps), so k = step/10; convergence (decrease < 1e-3/epoch) at k* = 121, i.e.
// Q ≈ (121 − 5)·10 = 1160 steps left at step 50. Marginal savings Q·Δt: 1→2 81 s, 2→3 19 s,
// 3→4 3.9 s, 4→5 negative.

double optimus_time(int w) { return 0.0025 * 64.0 / w + 0.05 + 0.01 * w; }
double optimus_loss(std::int64_t, double samples, int) {
  const double k = samples / 640.0;
  return 1.0 / (0.05 * k + 1.0) + 0.2;
}

nlohmann::json optimus_params() {
  return {{"every", 10},         {"min_steps", 5}, {"warmup_steps", 1},     {"cooldown", 10},
          {"step", 1},           {"margin", 0.01}, {"min_gain_seconds", 1}, {"epoch_samples", 640},
          {"min_loss_points", 5}};
}

Job optimus_job() { return {optimus_time, optimus_loss}; }

TEST(OptimusPolicy, ExploresThenChoosesTheWorkersByMarginalGain) {
  const auto d = run("optimus", optimus_params(), optimus_job(), 1, 150);
  // Two explorations (the speed model needs 3 configurations), then nothing until 5 loss points
  // exist (steps 30 and 40 pass the speed gate only), then w* = 4, which it then keeps.
  EXPECT_EQ(sizes(d), "10:1->2 20:2->3 50:3->4");
  ASSERT_EQ(d.size(), 3U);
  EXPECT_TRUE(contains(d[0].reason, "exploring")) << d[0].reason;
  EXPECT_TRUE(contains(d[0].reason, "1 measured configuration")) << d[0].reason;
  EXPECT_TRUE(contains(d[2].reason, "w*=4")) << d[2].reason;
  EXPECT_TRUE(contains(d[2].reason, "convergence at decrease < 0.001/epoch")) << d[2].reason;
  EXPECT_TRUE(contains(d[2].reason, "3 -> 4 workers")) << d[2].reason;
}

TEST(OptimusPolicy, MarginBlocksASmallGain) {
  auto p = optimus_params();
  p["margin"] = 0.05;  // 3 → 4 saves 2.5% of the remaining time
  EXPECT_EQ(sizes(run("optimus", p, optimus_job(), 1, 150)), "10:1->2 20:2->3");
}

TEST(OptimusPolicy, GainThresholdGivesWorkersBack) {
  auto p = optimus_params();
  p["min_gain_seconds"] = 60;  // 2 → 3 saves only about 19 s of the remaining time
  const auto d = run("optimus", p, optimus_job(), 1, 150);
  EXPECT_EQ(sizes(d), "10:1->2 20:2->3 50:3->2");
  ASSERT_EQ(d.size(), 3U);
  EXPECT_TRUE(contains(d[2].reason, "w*=2")) << d[2].reason;
}

TEST(OptimusPolicy, TargetLossSetsTheRemainingWork) {
  auto p = optimus_params();
  p["target_loss"] = 0.99;  // k* ≈ 5.3: almost done, Q ≈ 3 steps, nothing is worth a worker
  EXPECT_EQ(sizes(run("optimus", p, optimus_job(), 1, 150)), "10:1->2 20:2->3 50:3->2 60:2->1");
  p["target_loss"] = 0.1;  // below the floor β2: falls back to the convergence rule
  const auto d = run("optimus", p, optimus_job(), 1, 150);
  EXPECT_EQ(sizes(d), "10:1->2 20:2->3 50:3->4");
  ASSERT_EQ(d.size(), 3U);
  EXPECT_TRUE(contains(d[2].reason, "out of reach")) << d[2].reason;
}

TEST(OptimusPolicy, CooldownAndStepLimit) {
  auto p = optimus_params();
  p["cooldown"] = 25;
  EXPECT_EQ(sizes(run("optimus", p, optimus_job(), 1, 150)), "10:1->2 40:2->3 70:3->4");
  p = optimus_params();
  p["step"] = 2;  // explores 1, 3, 5; w* = 4 is then one step back
  EXPECT_EQ(sizes(run("optimus", p, optimus_job(), 1, 150)), "10:1->3 20:3->5 50:5->4");
}

TEST(OptimusPolicy, RespectsTheBounds) {
  Job job = optimus_job();
  job.settings["max_workers"] = 3;  // w* = 4 is out of range: 3 is the best allowed
  EXPECT_EQ(sizes(run("optimus", optimus_params(), job, 1, 150)), "10:1->2 20:2->3");
  job.settings["max_workers"] = 2;  // no third configuration can be measured: no model
  EXPECT_EQ(sizes(run("optimus", optimus_params(), job, 1, 150)), "10:1->2");
  auto p = optimus_params();
  p["max_workers"] = 3;  // the parameter wins over the setting
  p["min_workers"] = 2;
  job.settings["max_workers"] = 8;
  EXPECT_EQ(sizes(run("optimus", p, job, 1, 150)), "10:1->2 20:2->3");
  // Started above the bound: back into the range one step at a time; the three configurations
  // measured on the way (6, 5, 4) fit the model, whose w* = 4 is the bound.
  job = optimus_job();
  job.workers = 6;
  job.settings["max_workers"] = 4;
  EXPECT_EQ(sizes(run("optimus", optimus_params(), job, 1, 150)), "10:6->5 20:5->4");
}

TEST(OptimusPolicy, DoesNothingWithoutALossMetric) {
  Job job = optimus_job();
  job.loss = nullptr;
  EXPECT_EQ(sizes(run("optimus", optimus_params(), job, 1, 300)), "");
}

TEST(OptimusPolicy, SkipsNonFiniteMetrics) {
  Job job = optimus_job();
  job.loss = [](std::int64_t s, double samples, int w) {
    return s % 7 == 0 ? std::nan("") : optimus_loss(s, samples, w);
  };
  job.step_time = [](int w) { return optimus_time(w); };
  EXPECT_EQ(sizes(run("optimus", optimus_params(), job, 1, 150)), "10:1->2 20:2->3 50:3->4");
}

TEST(OptimusPolicy, IsDeterministic) {
  const auto a = run("optimus", optimus_params(), optimus_job(), 1, 150);
  const auto b = run("optimus", optimus_params(), optimus_job(), 1, 150);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].reason, b[i].reason);
}

TEST(OptimusPolicy, RejectsBadParameters) {
  EXPECT_EQ(error_of("optimus", {{"every", 0}}),
            "optimus: parameter 'every' must be an integer in [1, 1000000000] (got 0)");
  EXPECT_TRUE(contains(error_of("optimus", {{"bogus", 1}}), "optimus: unknown parameter 'bogus'"));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"margin", 1.0},
                                                           {"margin", -0.1},
                                                           {"step", 0},
                                                           {"min_steps", 0},
                                                           {"max_residual", 0.0},
                                                           {"min_gain_seconds", -1},
                                                           {"convergence_delta", 0.0},
                                                           {"epoch_samples", 0},
                                                           {"min_loss_points", 2},
                                                           {"target_loss", "low"},
                                                           {"explore", "maybe"},
                                                           {"cooldown", 1.5},
                                                           {"min_workers", 0}}) {
    EXPECT_TRUE(contains(error_of("optimus", {{key, value}}), "optimus: parameter '" + key + "'"))
        << key << " = " << value.dump() << ": " << error_of("optimus", {{key, value}});
  }
  EXPECT_TRUE(contains(error_of("optimus", {{"min_workers", 4}, {"max_workers", 2}}),
                       "optimus: parameter 'min_workers' must not exceed max_workers"));
}

// ---- hemingway -----------------------------------------------------------------------------
// System: f(m) = 0.5 + 0.625·64/m + 0.3·ln m + 0.02·m (KAT-HEM-1's θ at size 64). Convergence:
// g(i, m) = 2/i + 0.25·m/i + 50/i² (KAT-HEM-2's λ) with i the job's step; the job resumes at
// step 1000 so that an interval's mean loss is g at its mean step to about 1e-5. Exploration
// measures m = 1..4 (steps 1010..1030); the models fit at step 1050 (5 loss points), with i0 =
// 1050. Target 0.001: t*(m) = (i_ε(m) − 1050)·f(m) is least at m* = 9 (18575 s; 21624 s at m=4).
// Budget 20000 s (974.8 s spent by step 1050): h is least at m* = 9; budget 2000 s: at m* = 1.

double hemingway_time(int m) {
  return 0.5 + 0.625 * 64.0 / m + 0.3 * std::log(static_cast<double>(m)) + 0.02 * m;
}
double hemingway_loss(std::int64_t i, double, int m) {
  const double x = static_cast<double>(i);
  return 2.0 / x + 0.25 * m / x + 50.0 / (x * x);
}

nlohmann::json hemingway_params() {
  return {{"every", 10}, {"min_steps", 5}, {"warmup_steps", 1},   {"cooldown", 10},
          {"step", 1},   {"margin", 0.05}, {"min_loss_points", 5}};
}

Job hemingway_job() {
  Job j{hemingway_time, hemingway_loss};
  j.settings["max_workers"] = 16;
  return j;
}

TEST(HemingwayPolicy, ErrorTargetMovesTowardsTheFastestCount) {
  auto p = hemingway_params();
  p["target_loss"] = 0.001;
  const auto d = run("hemingway", p, hemingway_job(), 1001, 1060);
  EXPECT_EQ(sizes(d), "1010:1->2 1020:2->3 1030:3->4 1050:4->5 1060:5->6");
  ASSERT_EQ(d.size(), 5U);
  EXPECT_TRUE(contains(d[2].reason, "exploring: the system model has 3")) << d[2].reason;
  EXPECT_TRUE(contains(d[3].reason, "m*=9")) << d[3].reason;
  EXPECT_TRUE(contains(d[3].reason, "to reach loss 0.001")) << d[3].reason;
  EXPECT_TRUE(contains(d[3].reason, "4 -> 5 workers")) << d[3].reason;
}

TEST(HemingwayPolicy, TimeBudget) {
  auto p = hemingway_params();
  p["time_budget"] = 20000;
  auto d = run("hemingway", p, hemingway_job(), 1001, 1050);
  EXPECT_EQ(sizes(d), "1010:1->2 1020:2->3 1030:3->4 1050:4->5");
  ASSERT_EQ(d.size(), 4U);
  EXPECT_TRUE(contains(d[3].reason, "m*=9")) << d[3].reason;
  p["time_budget"] = 2000;  // little time left: fewer machines converge further per second
  d = run("hemingway", p, hemingway_job(), 1001, 1050);
  EXPECT_EQ(sizes(d), "1010:1->2 1020:2->3 1030:3->4 1050:4->3");
  ASSERT_EQ(d.size(), 4U);
  EXPECT_TRUE(contains(d[3].reason, "m*=1")) << d[3].reason;
  p["time_budget"] = 900;  // spent before the models fit: nothing after the exploration
  EXPECT_EQ(sizes(run("hemingway", p, hemingway_job(), 1001, 1100)),
            "1010:1->2 1020:2->3 1030:3->4");
}

TEST(HemingwayPolicy, GatesBoundsAndMissingInputs) {
  auto p = hemingway_params();
  p["target_loss"] = 0.001;
  Job job = hemingway_job();
  job.settings["max_workers"] = 3;  // a fourth configuration cannot be measured: no model
  EXPECT_EQ(sizes(run("hemingway", p, job, 1001, 1100)), "1010:1->2 1020:2->3");
  job = hemingway_job();
  job.loss = nullptr;
  EXPECT_EQ(sizes(run("hemingway", p, job, 1001, 1100)), "");
  // Without a target there is nothing to decide.
  EXPECT_EQ(sizes(run("hemingway", hemingway_params(), hemingway_job(), 1001, 1100)), "");
  p["explore"] = "off";  // one configuration only: the system model never fits
  EXPECT_EQ(sizes(run("hemingway", p, hemingway_job(), 1001, 1100)), "");
}

TEST(HemingwayPolicy, RejectsBadParameters) {
  EXPECT_EQ(error_of("hemingway", {{"target_loss", 0.1}, {"time_budget", 100}}),
            "hemingway: parameter 'time_budget' cannot be given together with target_loss "
            "(choose one objective)");
  EXPECT_EQ(error_of("hemingway", {{"target_loss", 0.1}, {"loss_offset", 0.2}}),
            "hemingway: parameter 'target_loss' must exceed loss_offset (0.2)");
  EXPECT_TRUE(
      contains(error_of("hemingway", {{"bogus", 1}}), "hemingway: unknown parameter 'bogus'"));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"time_budget", 0},
           {"basis", nlohmann::json::array({"inv_i", "cubic"})},
           {"basis", nlohmann::json::array({"inv_i", "inv_i"})},
           {"every", 0},
           {"margin", 1.0},
           {"step", 0},
           {"min_loss_points", 2},
           {"explore", true},
           {"max_workers", 0}}) {
    EXPECT_TRUE(
        contains(error_of("hemingway", {{key, value}}), "hemingway: parameter '" + key + "'"))
        << key << " = " << value.dump() << ": " << error_of("hemingway", {{key, value}});
  }
}

}  // namespace
}  // namespace kf
