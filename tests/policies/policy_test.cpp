// SPDX-License-Identifier: Apache-2.0
// The policy API without a cluster: proposals and their merging, the context's checks, the
// registry (unknown names, plugins that cannot load), the runner disabling a throwing policy and
// recording its runs, and inputs round-tripping through JSON (what kf-policy-replay reads).
#include "kf/policies/policy.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kf/policies/builtin.hpp"
#include "kf/runtime/policy_runner.hpp"

namespace kf {
namespace {

PolicyInputs inputs(std::int64_t step, int workers) {
  PolicyInputs in;
  in.step = step;
  in.workers = workers;
  in.version = 3;
  in.settings = {{"batch_size", 64}, {"lr", 0.1}, {"algorithm", "ring"}};
  in.metrics = {{"loss", 0.5}};
  return in;
}

class Fixed : public Policy {
 public:
  Fixed(std::string n, std::function<void(PolicyContext&)> f)
      : n_(std::move(n)), f_(std::move(f)) {}
  std::string name() const override { return n_; }
  void after_step(PolicyContext& c) override { f_(c); }

 private:
  std::string n_;
  std::function<void(PolicyContext&)> f_;
};

TEST(Proposal, LaterPoliciesWinFieldByFieldAndReasonsAccumulate) {
  const auto in = inputs(10, 2);
  PolicyContext a(in, "a"), b(in, "b");
  a.resize(3, "grow");
  a.set_batch_size(128);
  b.set_batch_size(256, "more");
  b.set_learning_rate(0.2);
  Proposal p = a.proposal();
  p.merge(b.proposal());
  EXPECT_EQ(p.workers, 3);
  EXPECT_EQ(p.batch_size, 256);
  EXPECT_EQ(p.learning_rate, 0.2);
  EXPECT_FALSE(p.algorithm.has_value());
  ASSERT_EQ(p.reasons.size(), 4u);
  EXPECT_EQ(p.reasons[0], "a: workers=3 (grow)");
  EXPECT_EQ(p.reasons[2], "b: batch_size=256 (more)");
  EXPECT_FALSE(p.changes_nothing(2, in.settings));
  Proposal same;
  same.batch_size = 64;
  same.algorithm = "ring";
  same.workers = 2;
  EXPECT_TRUE(same.changes_nothing(2, in.settings));
  EXPECT_EQ(p.to_json()["workers"], 3);
}

TEST(PolicyContext, RejectsImpossibleProposalsNamingThePolicy) {
  const auto in = inputs(1, 2);
  PolicyContext c(in, "mine");
  EXPECT_THROW(c.resize(0), std::invalid_argument);
  EXPECT_THROW(c.set_batch_size(0), std::invalid_argument);
  EXPECT_THROW(c.set_learning_rate(-1), std::invalid_argument);
  EXPECT_THROW(c.set_learning_rate(std::numeric_limits<double>::infinity()), std::invalid_argument);
  try {
    c.set_algorithm("bogus");
    ADD_FAILURE() << "accepted algorithm 'bogus'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mine: set_algorithm('bogus')"), std::string::npos);
  }
  EXPECT_TRUE(c.proposal().empty());
  EXPECT_DOUBLE_EQ(c.metric("loss"), 0.5);
  EXPECT_DOUBLE_EQ(c.metric("nope", 7.0), 7.0);
}

TEST(PolicyRegistry, UnknownNamesAndBadPluginsGiveClearErrors) {
  PolicyRegistry r;
  r.add("fixed", [](const nlohmann::json&) {
    return std::make_unique<Fixed>("fixed", [](PolicyContext&) {});
  });
  EXPECT_THROW(r.add("fixed", [](const nlohmann::json&) { return nullptr; }),
               std::invalid_argument);
  EXPECT_EQ(r.make("fixed", nullptr)->name(), "fixed");
  try {
    r.make("nope", {});
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown policy 'nope' (known: fixed)"),
              std::string::npos);
  }
  try {
    r.load_plugin("/nonexistent/libpolicy.so");
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libpolicy.so"), std::string::npos);
  }
}

// The message load_plugin throws for `path`, or "" when it loads.
std::string plugin_error(const std::string& path) {
  PolicyRegistry r;
  try {
    r.load_plugin(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A plugin is code every worker runs: only an absolute path, only a file nobody else can change,
// only one built for this kf's plugin API.
TEST(PolicyPlugin, OnlyAPluginNobodyElseCanChangeBuiltForThisKfLoads) {
  const char* example = std::getenv("KF_TEST_PLUGIN");
  ASSERT_NE(example, nullptr);
  EXPECT_EQ(plugin_error("libplateau_policy.so"),
            "policy plugin 'libplateau_policy.so': the path must be absolute (a job file's "
            "plugins are taken relative to the job file)");
  const auto dir =
      std::filesystem::temp_directory_path() / ("kf-plugin-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  const auto copy = dir / "libplateau_policy.so";
  std::filesystem::copy_file(example, copy, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::permissions(copy, std::filesystem::perms::owner_all);
  EXPECT_EQ(plugin_error(copy.string()), "") << "the copy, only its owner may write it";
  ::chmod(copy.c_str(), 0666);
  EXPECT_EQ(plugin_error(copy.string()),
            "policy plugin '" + copy.string() +
                "': refused: its other users may write it (chmod go-w it)");
  ::chmod(copy.c_str(), 0775);
  EXPECT_NE(plugin_error(copy.string()).find("refused: its group may write it"), std::string::npos);
  ::chmod(copy.c_str(), 0755);
  ::chmod(dir.c_str(), 0777);
  EXPECT_NE(plugin_error(copy.string())
                .find("refused: its directory " + dir.string() + " may be written by other users"),
            std::string::npos)
      << plugin_error(copy.string());
  ::chmod(dir.c_str(), 01777);  // sticky, like /tmp: nobody else may replace the file
  EXPECT_EQ(plugin_error(copy.string()), "");
  std::filesystem::remove_all(dir);

  const char* unversioned = std::getenv("KF_TEST_UNVERSIONED_PLUGIN");
  const char* future = std::getenv("KF_TEST_FUTURE_PLUGIN");
  ASSERT_NE(unversioned, nullptr);
  ASSERT_NE(future, nullptr);
  EXPECT_NE(plugin_error(unversioned)
                .find("it has no kf_policy_plugin_api_version (a plugin built "
                      "for an older kf): define its entry point with "
                      "KF_POLICY_PLUGIN"),
            std::string::npos)
      << plugin_error(unversioned);
  EXPECT_NE(plugin_error(future).find("it was built for plugin API 99, and this kf has 1"),
            std::string::npos)
      << plugin_error(future);
}

TEST(PolicyRunner, DisablesAThrowingPolicyAndRecordsEveryRun) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("kf-policy-record-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(path);
  PolicyRunner runner;
  int calls = 0;
  runner.add(std::make_unique<Fixed>("thrower", [&](PolicyContext& c) {
    ++calls;
    if (c.step() == 2) throw std::runtime_error("boom");
    c.set_learning_rate(0.5);
  }));
  runner.add(
      std::make_unique<Fixed>("grower", [](PolicyContext& c) { c.resize(c.workers() + 1); }));
  runner.record_to(path);
  for (std::int64_t s = 1; s <= 4; ++s) {
    const Proposal p = runner.run(PolicyHook::after_step, inputs(s, 2));
    EXPECT_EQ(p.workers, 3);
    EXPECT_EQ(p.learning_rate.has_value(), s == 1) << "step " << s;
  }
  EXPECT_EQ(calls, 2) << "disabled after it threw at step 2";
  ASSERT_EQ(runner.disabled().size(), 1u);
  EXPECT_EQ(runner.disabled()[0], "thrower: boom");
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["hook"], "after_step");
    const PolicyInputs back = PolicyInputs::from_json(j["inputs"]);
    EXPECT_EQ(back.step, lines + 1);
    EXPECT_EQ(back.workers, 2);
    EXPECT_DOUBLE_EQ(back.metrics.at("loss"), 0.5);
    EXPECT_EQ(j["proposal"]["workers"], 3);
  }
  EXPECT_EQ(lines, 4);
  std::filesystem::remove(path);
  EXPECT_THROW(PolicyInputs::from_json(nlohmann::json{{"workers", 2}}), std::invalid_argument);
}

}  // namespace
}  // namespace kf

namespace kf {
namespace {

// The example plugin (examples/custom_policy), loaded the way a job file's `plugins:` are.
TEST(PolicyPlugin, ExamplePluginLoadsRegistersAndDecides) {
  const char* path = std::getenv("KF_TEST_PLUGIN");
  ASSERT_NE(path, nullptr) << "KF_TEST_PLUGIN names the example plugin";
  PolicyRegistry r;
  r.load_plugin(path);
  ASSERT_TRUE(r.contains("lr-plateau"));
  EXPECT_THROW(r.make("lr-plateau", {{"patiense", 3}}), std::invalid_argument)
      << "a misspelt parameter is an error";
  PolicyRunner runner;
  runner.add(r.make("lr-plateau", {{"patience", 3}, {"min_lr", 0.01}}));
  PolicyInputs in;
  in.workers = 2;
  in.settings = {{"lr", 0.1}};
  const double losses[] = {1.0, 0.9, 0.9, 0.9, 0.9, 0.8};
  std::vector<std::int64_t> halved_at;
  for (std::int64_t s = 0; s < 6; ++s) {
    in.step = s;
    in.metrics["loss"] = losses[s];
    const Proposal p = runner.run(PolicyHook::after_step, in);
    if (p.learning_rate) {
      EXPECT_DOUBLE_EQ(*p.learning_rate, 0.05);
      halved_at.push_back(s);
    }
  }
  EXPECT_EQ(halved_at, std::vector<std::int64_t>{4}) << "3 steps without improvement after step 1";
  EXPECT_THROW(r.load_plugin(path), std::runtime_error) << "registering a name twice";
}

}  // namespace
}  // namespace kf

namespace kf {
namespace {

// The training-mode policies are replayable: a recording of adaptive-sync's runs (inputs as a
// live job gives them) replayed by kf-policy-replay makes the same decisions.
TEST(PolicyReplay, AdaptiveSyncDecisionsReplayFromARecording) {
  const char* replay = std::getenv("KF_POLICY_REPLAY");
  ASSERT_NE(replay, nullptr) << "KF_POLICY_REPLAY names kf-policy-replay";
  const auto dir =
      std::filesystem::temp_directory_path() / ("kf-replay-modes-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "job.yaml") << "job: {name: modes}\n"
                                  << "policies:\n"
                                  << "  - name: adaptive-sync\n"
                                  << "    params: {patience: 2, cooldown: 0}\n";
  PolicyRegistry registry;
  register_builtin_policies(registry);
  PolicyRunner runner;
  runner.add(registry.make("adaptive-sync", {{"patience", 2}, {"cooldown", 0}}));
  runner.record_to((dir / "runs.jsonl").string());
  PolicyInputs in;
  in.workers = 4;
  in.settings = {{"batch_size", 256}};
  int proposals = 0;
  for (std::int64_t s = 1; s <= 6; ++s) {
    in.step = s;
    in.metrics = {{"gns.valid", 1.0}, {"gns.b_simple", 100.0}};
    if (in.settings.contains("mode")) in.metrics = {{"sma.averaged", 1.0}, {"sma.divergence", 1.0}};
    const Proposal p = runner.run(PolicyHook::after_step, in);
    if (p.mode) {
      in.settings["mode"] = *p.mode;
      ++proposals;
    }
  }
  EXPECT_GE(proposals, 2) << "into sma, then back towards sync-sgd";
  std::string out;
  const std::string cmd = std::string(replay) + " --check --job " + (dir / "job.yaml").string() +
                          " " + (dir / "runs.jsonl").string() + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char chunk[4096];
  for (std::size_t got; (got = std::fread(chunk, 1, sizeof chunk, f)) > 0;) out.append(chunk, got);
  EXPECT_EQ(::pclose(f), 0) << out;
  EXPECT_NE(out.find(", 0 differences from the recording"), std::string::npos) << out;
  EXPECT_NE(out.find("\"mode\":\"sma:period=4\""), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kf
