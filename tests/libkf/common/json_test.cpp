// SPDX-License-Identifier: Apache-2.0
#include "kf/common/json.hpp"

#include <gtest/gtest.h>

#include <string>

namespace kf {
namespace {

TEST(Json, DepthCountsArraysAndObjectsButNotStrings) {
  EXPECT_EQ(json_depth("1"), 0u);
  EXPECT_EQ(json_depth(R"({"a": [1, {"b": []}]})"), 4u);
  EXPECT_EQ(json_depth(R"(["[[[[", "{{\"{{"])"), 1u);  // brackets in strings, an escaped quote
  EXPECT_EQ(json_depth(R"([] [] [[]])"), 2u);          // not JSON: still measured
  EXPECT_EQ(json_depth("]]]][["), 2u);                 // closers first do not go below zero
}

TEST(Json, DepthStopsCountingPastTheLimit) {
  const std::string deep(1'000'000, '[');
  EXPECT_EQ(json_depth(deep, 10), 11u);
}

TEST(Json, AMillionLevelsAreRefusedNotParsed) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  EXPECT_TRUE(parse_json_or_discard(deep).is_discarded());
  try {
    parse_json(deep);
    FAIL() << "parsed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than 64 levels"), std::string::npos) << e.what();
  }
}

TEST(Json, UpToTheLimitParses) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_FALSE(parse_json_or_discard(ok).is_discarded());
  EXPECT_NO_THROW(parse_json(ok));
  const std::string over = "[" + ok + "]";
  EXPECT_TRUE(parse_json_or_discard(over).is_discarded());
}

TEST(Json, NotJsonIsDiscardedOrThrows) {
  EXPECT_TRUE(parse_json_or_discard("{").is_discarded());
  EXPECT_THROW(parse_json("{"), nlohmann::json::parse_error);
  EXPECT_EQ(parse_json(R"({"a": 1})")["a"], 1);
}

}  // namespace
}  // namespace kf
