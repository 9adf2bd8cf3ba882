// SPDX-License-Identifier: Apache-2.0
// The stragglers policy on synthetic scores: balance first, a revoke only after a worker was
// slow for revoke_after seconds of the job's time, the slowest one, never below min_workers,
// a cool-down after it, a timer that restarts on recovery, and every bad parameter by name.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kf/policies/builtin.hpp"

namespace kf {
namespace {

// Runs the policy's after_step as the runtime would, one step of `step_time` seconds each, and
// applies the balance setting it proposes (the runtime's next boundary).
class StragglerDriver {
 public:
  StragglerDriver(const nlohmann::json& params, int workers) {
    PolicyRegistry registry;
    register_builtin_policies(registry);
    policy_ = registry.make("stragglers", params);
    in_.workers = workers;
    in_.version = 1;
    in_.settings = nlohmann::json::object();
  }

  Proposal step(const std::vector<WorkerSpeed>& speeds, double step_time = 1.0) {
    ++in_.step;
    in_.metrics = {{"step_time", step_time}};
    in_.speeds = speeds;
    PolicyContext ctx(in_, "stragglers");
    policy_->after_step(ctx);
    Proposal p = ctx.proposal();
    if (p.balance) in_.settings["balance"] = *p.balance;
    return p;
  }

  PolicyInputs& inputs() { return in_; }

 private:
  std::unique_ptr<Policy> policy_;
  PolicyInputs in_;
};

std::vector<WorkerSpeed> one_slow(double vs_fastest, const std::string& who = "h:3") {
  return {{"h:1", 1.0, 1.0, false}, {"h:2", 1.0, 1.0, false}, {who, vs_fastest, 1.0, true}};
}

std::string make_error(const nlohmann::json& params) {
  PolicyRegistry registry;
  register_builtin_policies(registry);
  try {
    registry.make("stragglers", params);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(StragglersPolicy, BalancesFirstAndRevokesOnlyAfterRevokeAfterSecondsOfBeingSlow) {
  StragglerDriver d({{"revoke_after", 10}, {"revoke_below", 0.5}}, 3);
  EXPECT_TRUE(d.step({{"h:1", 1, 1, false}, {"h:2", 0.9, 1, false}}).empty()) << "nobody slow";
  const Proposal first = d.step(one_slow(0.33));
  ASSERT_TRUE(first.balance);
  EXPECT_TRUE(*first.balance);
  EXPECT_TRUE(first.revoke.empty());
  // Slow for 1 s so far; 9 more steps of 1 s reach 10 s.
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(d.step(one_slow(0.33)).empty()) << i;
  const Proposal revoke = d.step(one_slow(0.33));
  ASSERT_EQ(revoke.revoke, std::vector<std::string>{"h:3"});
  EXPECT_FALSE(revoke.balance) << "balance is on already";
  ASSERT_EQ(revoke.reasons.size(), 1U);
  EXPECT_NE(revoke.reasons[0].find("0.33 of the fastest worker's speed, slow for 10 s"),
            std::string::npos)
      << revoke.reasons[0];
}

TEST(StragglersPolicy, TheTimerRestartsWhenTheWorkerRecovers) {
  StragglerDriver d({{"revoke_after", 5}, {"balance", false}}, 3);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(d.step(one_slow(0.3)).empty());
  EXPECT_TRUE(d.step({{"h:1", 1, 1, false}, {"h:2", 1, 1, false}, {"h:3", 0.9, 1, false}}).empty());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(d.step(one_slow(0.3)).empty()) << i;
  EXPECT_EQ(d.step(one_slow(0.3)).revoke.size(), 1U);
}

TEST(StragglersPolicy, ASlowWorkerAboveRevokeBelowIsBalancedButKept) {
  StragglerDriver d({{"revoke_after", 1}, {"revoke_below", 0.5}}, 3);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(d.step(one_slow(0.6)).revoke.empty());
  EXPECT_EQ(d.inputs().settings.value("balance", false), true);
}

TEST(StragglersPolicy, RevokesTheSlowestOneAtATimeWithACooldown) {
  StragglerDriver d({{"revoke_after", 2}, {"cooldown", 5}, {"balance", false}}, 4);
  const std::vector<WorkerSpeed> two{
      {"h:1", 1, 1, false}, {"h:2", 0.4, 1, true}, {"h:3", 0.2, 1, true}, {"h:4", 1, 1, false}};
  EXPECT_TRUE(d.step(two).empty());
  EXPECT_EQ(d.step(two).revoke, std::vector<std::string>{"h:3"});
  // h:2 has been slow long enough, but the cool-down holds it for 5 s.
  const std::vector<WorkerSpeed> left{
      {"h:1", 1, 1, false}, {"h:2", 0.4, 1, true}, {"h:4", 1, 1, false}};
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(d.step(left).empty()) << i;
  EXPECT_EQ(d.step(left).revoke, std::vector<std::string>{"h:2"});
}

TEST(StragglersPolicy, NeverRevokesBelowMinWorkers) {
  StragglerDriver d({{"revoke_after", 1}, {"balance", false}}, 2);
  d.inputs().settings["min_workers"] = 2;
  const std::vector<WorkerSpeed> pair{{"h:1", 1, 1, false}, {"h:2", 0.1, 1, true}};
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(d.step(pair).empty()) << i;
  StragglerDriver e({{"revoke_after", 1}, {"balance", false}, {"min_workers", 1}}, 2);
  e.inputs().settings["min_workers"] = 2;  // the parameter wins
  EXPECT_EQ(e.step(pair).revoke, std::vector<std::string>{"h:2"});
  StragglerDriver f({{"revoke_after", 1}, {"revoke", false}}, 3);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(f.step(one_slow(0.1)).revoke.empty());
}

TEST(StragglersPolicy, RejectsEveryBadParameterByName) {
  EXPECT_EQ(make_error({{"revoke_below", 0}}),
            "stragglers: parameter 'revoke_below' must be a number in (0, 1] (got 0)");
  EXPECT_EQ(make_error({{"revoke_after", -1}}),
            "stragglers: parameter 'revoke_after' must be a number in [0, 1000000000] (got -1)");
  EXPECT_EQ(make_error({{"balance", "yes"}}),
            "stragglers: parameter 'balance' must be true or false (got \"yes\")");
  EXPECT_EQ(make_error({{"min_workers", 0}}),
            "stragglers: parameter 'min_workers' must be an integer in [1, 1000000] (got 0)");
  EXPECT_EQ(make_error({{"bogus", 1}}).rfind("stragglers: unknown parameter 'bogus'", 0), 0U);
}

// The scores travel in the recorded inputs, so that kf-policy-replay decides as the live run.
TEST(StragglersPolicy, InputsWithSpeedsRoundTripThroughJson) {
  PolicyInputs in;
  in.step = 7;
  in.workers = 3;
  in.speeds = one_slow(0.25);
  const PolicyInputs back = PolicyInputs::from_json(in.to_json());
  EXPECT_EQ(back.speeds, in.speeds);
  EXPECT_FALSE(PolicyInputs{}.to_json().contains("speeds")) << "absent when none are scored";
  nlohmann::json bad = in.to_json();
  bad["speeds"][1]["slow"] = 1;
  EXPECT_THROW(PolicyInputs::from_json(bad), std::invalid_argument);
}

TEST(StragglersPolicy, ProposalsMergeRevokesAndSayWhatTheyChange) {
  Proposal a;
  a.revoke = {"h:1"};
  Proposal b;
  b.revoke = {"h:1", "h:2"};
  b.balance = true;
  a.merge(b);
  EXPECT_EQ(a.revoke, (std::vector<std::string>{"h:1", "h:2"}));
  EXPECT_EQ(a.to_json()["revoke"], nlohmann::json::array({"h:1", "h:2"}));
  EXPECT_EQ(a.to_json()["balance"], true);
  EXPECT_FALSE(a.changes_nothing(3, {{"balance", true}})) << "a revoke changes the cluster";
  Proposal on;
  on.balance = true;
  EXPECT_TRUE(on.changes_nothing(3, {{"balance", true}}));
  EXPECT_FALSE(on.changes_nothing(3, nlohmann::json::object()));
  PolicyInputs in;
  PolicyContext ctx(in, "p");
  EXPECT_THROW(ctx.revoke("not an address"), std::invalid_argument);
}

}  // namespace
}  // namespace kf
