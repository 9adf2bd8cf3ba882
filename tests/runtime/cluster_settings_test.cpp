// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/cluster_settings.hpp"

#include <gtest/gtest.h>

namespace kf {
namespace {

using nlohmann::json;

TEST(ClusterSettings, ReadsEveryKnownKeyIntoItsType) {
  const auto p = parse_cluster_settings({{"algorithm", "ring"},
                                         {"batch_size", 64},
                                         {"lr", 0.5},
                                         {"min_workers", 1},
                                         {"max_workers", 8},
                                         {"finished", true},
                                         {"stop", false},
                                         {"suspended", true},
                                         {"mine", "kept"}});
  EXPECT_TRUE(p.errors.empty());
  EXPECT_EQ(p.typed.algorithm, Algorithm::ring);
  EXPECT_EQ(p.typed.batch_size, 64);
  EXPECT_EQ(p.typed.learning_rate, 0.5);
  EXPECT_EQ(p.typed.min_workers, 1);
  EXPECT_EQ(p.typed.max_workers, 8);
  EXPECT_TRUE(p.typed.finished);
  EXPECT_FALSE(p.typed.stop);
  EXPECT_TRUE(p.typed.suspended);
  EXPECT_EQ(p.valid["mine"], "kept");
}

TEST(ClusterSettings, AMistypedKeyIsNamedAndLeftOutAndTheOthersStay) {
  const auto p = parse_cluster_settings({{"max_workers", "8"}, {"batch_size", 32}});
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_EQ(p.errors[0], "settings.max_workers: expected an integer >= 0, got \"8\"");
  EXPECT_FALSE(p.typed.max_workers);
  EXPECT_EQ(p.typed.batch_size, 32);
  EXPECT_EQ(p.valid, (json{{"batch_size", 32}}));
}

TEST(ClusterSettings, SparesAreACountFrom0To1024) {
  EXPECT_EQ(parse_cluster_settings({{"spares", 2}}).typed.spares, 2);
  EXPECT_EQ(parse_cluster_settings(json::object()).typed.spares, 0);
  for (const json& bad : {json(-1), json(1025), json("2"), json(1.5)}) {
    const auto p = parse_cluster_settings({{"spares", bad}});
    ASSERT_EQ(p.errors.size(), 1u) << bad.dump();
    EXPECT_EQ(p.errors[0], "settings.spares: expected an integer in 0-1024, got " + bad.dump());
    EXPECT_EQ(p.typed.spares, 0);
  }
}

TEST(ClusterSettings, ReadsTheTrainingModeAndCompression) {
  const auto p = parse_cluster_settings({{"mode", "sma:period=4"}, {"compression", "topk:0.01"}});
  EXPECT_TRUE(p.errors.empty());
  ASSERT_TRUE(p.typed.mode);
  EXPECT_EQ(p.typed.mode->mode, TrainingMode::sma);
  EXPECT_EQ(p.typed.mode->period, 4);
  ASSERT_TRUE(p.typed.compression);
  EXPECT_EQ(p.typed.compression->kind, Compression::topk);
  const auto bad = parse_cluster_settings({{"mode", "sma:period=0"}, {"compression", 3}});
  ASSERT_EQ(bad.errors.size(), 2u);
  EXPECT_EQ(bad.errors[0],
            "settings.mode: expected a training mode such as \"sync-sgd\" or \"sma:period=4\", "
            "got \"sma:period=0\"");
  EXPECT_EQ(bad.errors[1],
            "settings.compression: expected a compression such as \"none\", \"fp16\" or "
            "\"topk:0.01\", got 3");
  EXPECT_FALSE(bad.typed.mode);
  EXPECT_EQ(bad.valid, json::object());
}

TEST(ClusterSettings, BoundariesAreEveryStepOrOnChange) {
  EXPECT_FALSE(parse_cluster_settings(json::object()).typed.on_change);
  EXPECT_TRUE(parse_cluster_settings(json{{"boundaries", "on-change"}}).typed.on_change);
  EXPECT_FALSE(parse_cluster_settings(json{{"boundaries", "every-step"}}).typed.on_change);
  for (const json& bad : {json("on_change"), json(true), json(1)}) {
    const auto p = parse_cluster_settings(json{{"boundaries", bad}});
    ASSERT_EQ(p.errors.size(), 1u) << bad.dump();
    EXPECT_EQ(p.errors[0],
              "settings.boundaries: expected \"every-step\" or \"on-change\", got " + bad.dump());
    EXPECT_FALSE(p.typed.on_change);
    EXPECT_FALSE(p.valid.contains("boundaries"));
  }
}

TEST(ClusterSettings, RejectsOutOfRangeAndUnknownValues) {
  const auto p = parse_cluster_settings({{"batch_size", 0},
                                         {"algorithm", "fastest"},
                                         {"finished", "yes"},
                                         {"min_workers", -1},
                                         {"lr", nullptr}});
  EXPECT_EQ(p.errors.size(), 5u);
  EXPECT_EQ(p.valid, json::object());
  EXPECT_FALSE(p.typed.finished);
}

TEST(ClusterSettings, ANonObjectIsOneErrorAndNullIsEmpty) {
  const auto p = parse_cluster_settings(json::array({1}));
  ASSERT_EQ(p.errors.size(), 1u);
  EXPECT_EQ(p.errors[0], "settings: expected an object, got [1]");
  EXPECT_TRUE(parse_cluster_settings(json()).errors.empty());
}

TEST(ClusterSettings, AutoscaleIsReadWithItsDefaults) {
  const auto p = parse_cluster_settings({{"autoscale", json::object()}});
  ASSERT_TRUE(p.errors.empty());
  ASSERT_TRUE(p.typed.autoscale);
  EXPECT_EQ(p.typed.autoscale->min, 1);
  EXPECT_FALSE(p.typed.autoscale->max);
  EXPECT_FALSE(p.typed.autoscale->target);  // "all offered"
  EXPECT_EQ(p.typed.autoscale->cooldown_s, 30);
  EXPECT_FALSE(p.typed.autoscale->per_host);
  const auto full = parse_cluster_settings(
      {{"autoscale",
        {{"min", 2}, {"max", 8}, {"target", 4}, {"cooldown_s", 0.5}, {"per_host", 2}}}});
  ASSERT_TRUE(full.errors.empty()) << full.errors[0];
  EXPECT_EQ(full.typed.autoscale->to_json(),
            (json{{"min", 2}, {"max", 8}, {"target", 4}, {"cooldown_s", 0.5}, {"per_host", 2}}));
  EXPECT_EQ(parse_cluster_settings({{"autoscale", {{"target", "all"}}}}).typed.autoscale->to_json(),
            (json{{"min", 1}, {"target", "all"}, {"cooldown_s", 30.0}}));
}

TEST(ClusterSettings, ABadAutoscaleIsOneErrorThatSaysWhatIsWrong) {
  for (const auto& [value, why] : {
           std::pair{json{{"min", 4}, {"max", 2}}, "min 4 is greater than max 2"},
           std::pair{json{{"cooldown_s", -1}}, "cooldown_s: expected a number of seconds"},
           std::pair{json{{"target", "most"}}, "target: expected an integer >= 1 or \"all\""},
           std::pair{json{{"target", 9}, {"max", 8}}, "target 9 is outside [min 1, max 8]"},
           std::pair{json{{"min", 0}}, "min: expected an integer >= 1, got 0"},
           std::pair{json{{"per_host", 1.5}}, "per_host: expected an integer >= 1"},
           std::pair{json{{"traget", 2}}, "unknown key \"traget\""},
           std::pair{json(3), "expected an object"},
       }) {
    const auto p = parse_cluster_settings({{"autoscale", value}, {"batch_size", 8}});
    ASSERT_EQ(p.errors.size(), 1u) << value;
    EXPECT_EQ(p.errors[0].rfind("settings.autoscale: ", 0), 0u) << p.errors[0];
    EXPECT_NE(p.errors[0].find(why), std::string::npos) << p.errors[0];
    EXPECT_FALSE(p.typed.autoscale);
    EXPECT_EQ(p.valid, (json{{"batch_size", 8}}));
  }
}

TEST(ClusterSettings, AutoscaleIsHeldWithinTheJobsOwnBounds) {
  const auto p = parse_cluster_settings({{"autoscale", {{"min", 1}, {"max", 16}, {"target", 12}}},
                                         {"max_workers", 8},
                                         {"min_workers", 2}});
  const AutoscaleSettings a = autoscale_within_bounds(p.typed);
  EXPECT_EQ(a.min, 2);
  EXPECT_EQ(a.max, 8);
  EXPECT_EQ(a.target, 8);
  const auto unbounded =
      parse_cluster_settings({{"autoscale", json::object()}, {"max_workers", 0}});
  EXPECT_FALSE(autoscale_within_bounds(unbounded.typed).max);
}

}  // namespace
}  // namespace kf
