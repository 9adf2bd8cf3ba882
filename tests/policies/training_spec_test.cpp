// SPDX-License-Identifier: Apache-2.0
// The text of the "mode" and "compression" settings: what parses, what it means, the canonical
// form that reads back the same, and errors that name the text and what was wrong.
#include "kf/policies/training_spec.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kf/policies/policy.hpp"

namespace kf {
namespace {

std::string error_of(auto parse, const std::string& text) {
  try {
    parse(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ModeSpec, ParsesEveryModeWithItsParameters) {
  EXPECT_EQ(parse_mode("sync-sgd"), ModeSpec{});
  const ModeSpec sma = parse_mode("sma:period=8,post_local=1000");
  EXPECT_EQ(sma.mode, TrainingMode::sma);
  EXPECT_EQ(sma.period, 8);
  EXPECT_EQ(sma.post_local, 1000);
  EXPECT_EQ(parse_mode("sma").period, 1);
  EXPECT_EQ(parse_mode("pair-avg:seed=7").seed, 7u);
  const ModeSpec ps = parse_mode("async-ps:soft_sync=2,max_staleness=0");
  EXPECT_EQ(ps.mode, TrainingMode::async_ps);
  EXPECT_EQ(ps.max_staleness, 0);
  EXPECT_EQ(ps.soft_sync, 2);
  EXPECT_TRUE(ps.scale_lr);
  EXPECT_FALSE(parse_mode("async-ps:scale_lr=0").scale_lr);
}

TEST(ModeSpec, TheCanonicalTextReadsBackTheSame) {
  for (const char* text : {"sync-sgd", "sma", "sma:period=4", "sma:period=8,post_local=1000",
                           "pair-avg", "pair-avg:seed=7", "async-ps",
                           "async-ps:max_staleness=2,soft_sync=3", "async-ps:scale_lr=0"}) {
    const ModeSpec spec = parse_mode(text);
    EXPECT_EQ(spec.str(), text);
    EXPECT_EQ(parse_mode(spec.str()), spec);
  }
  // Defaults are left out; the order of the parameters is the canonical one.
  EXPECT_EQ(parse_mode("sma:period=1").str(), "sma");
  EXPECT_EQ(parse_mode("async-ps:soft_sync=2,max_staleness=1").str(),
            "async-ps:max_staleness=1,soft_sync=2");
}

TEST(ModeSpec, ErrorsNameTheTextAndWhatWasWrong) {
  EXPECT_EQ(error_of(parse_mode, "ssgd"),
            "mode 'ssgd': not one of sync-sgd, sma, pair-avg, async-ps");
  EXPECT_EQ(error_of(parse_mode, "sma:period=0"),
            "mode 'sma:period=0': period must be an integer from 1 to 1000000, not '0'");
  EXPECT_EQ(error_of(parse_mode, "sma:period=x"),
            "mode 'sma:period=x': period must be an integer from 1 to 1000000, not 'x'");
  EXPECT_EQ(error_of(parse_mode, "sma:seed=1"),
            "mode 'sma:seed=1': 'seed' is not a parameter of sma (it has period, post_local)");
  EXPECT_EQ(error_of(parse_mode, "sync-sgd:period=2"),
            "mode 'sync-sgd:period=2': 'period' is not a parameter of sync-sgd (it has none)");
  EXPECT_EQ(error_of(parse_mode, "sma:period=2,period=3"),
            "mode 'sma:period=2,period=3': 'period' given twice");
  EXPECT_EQ(error_of(parse_mode, "sma:"), "mode 'sma:': nothing after ':'");
  EXPECT_EQ(error_of(parse_mode, "sma:period=2,"), "mode 'sma:period=2,': a trailing ','");
  EXPECT_EQ(error_of(parse_mode, "sma:period"), "mode 'sma:period': 'period' is not key=value");
  EXPECT_EQ(error_of(parse_mode, "async-ps:max_staleness=-1"),
            "mode 'async-ps:max_staleness=-1': max_staleness must be an integer from 0 to "
            "1000000, not '-1'");
  EXPECT_EQ(error_of(parse_mode, "async-ps:scale_lr=yes"),
            "mode 'async-ps:scale_lr=yes': scale_lr must be 0 or 1, not 'yes'");
  EXPECT_EQ(error_of(parse_mode, ""), "mode '': not one of sync-sgd, sma, pair-avg, async-ps");
}

TEST(CompressionSpec, ParsesAndReadsBack) {
  EXPECT_EQ(parse_compression("none"), CompressionSpec{});
  EXPECT_EQ(parse_compression("fp16").kind, Compression::fp16);
  EXPECT_EQ(parse_compression("bf16").kind, Compression::bf16);
  const CompressionSpec topk = parse_compression("topk:0.01");
  EXPECT_EQ(topk.kind, Compression::topk);
  EXPECT_EQ(topk.ratio, 0.01);
  EXPECT_EQ(parse_compression("randomk:1").ratio, 1.0);
  EXPECT_EQ(parse_compression("powersgd:4").rank, 4);
  for (const char* text :
       {"none", "fp16", "bf16", "topk:0.01", "topk:0.25", "randomk:0.05", "powersgd:4"}) {
    EXPECT_EQ(parse_compression(text).str(), text);
  }
}

TEST(CompressionSpec, ErrorsNameTheTextAndWhatWasWrong) {
  EXPECT_EQ(error_of(parse_compression, "zip"),
            "compression 'zip': not one of none, fp16, bf16, topk:RATIO, randomk:RATIO, "
            "powersgd:RANK");
  EXPECT_EQ(error_of(parse_compression, "topk"),
            "compression 'topk': topk needs a ratio in (0, 1] after ':', e.g. topk:0.01");
  EXPECT_EQ(error_of(parse_compression, "topk:0"),
            "compression 'topk:0': topk needs a ratio in (0, 1] after ':', e.g. topk:0.01");
  EXPECT_EQ(error_of(parse_compression, "randomk:1.5"),
            "compression 'randomk:1.5': randomk needs a ratio in (0, 1] after ':', e.g. "
            "randomk:0.01");
  EXPECT_EQ(error_of(parse_compression, "powersgd:0"),
            "compression 'powersgd:0': powersgd needs a rank from 1 to 1024 after ':', e.g. "
            "powersgd:4");
  EXPECT_EQ(error_of(parse_compression, "fp16:2"), "compression 'fp16:2': fp16 takes no argument");
}

TEST(PolicyContext, ProposesModesAndCompressionInCanonicalForm) {
  PolicyInputs in;
  in.workers = 2;
  in.settings = {{"mode", "sma:period=4"}};
  PolicyContext c(in, "mine");
  c.set_mode("sma:period=1", "noise is low");
  c.set_compression("topk:0.010", "slow network");
  EXPECT_EQ(*c.proposal().mode, "sma");
  EXPECT_EQ(*c.proposal().compression, "topk:0.01");
  EXPECT_EQ(c.proposal().to_json()["mode"], "sma");
  ASSERT_EQ(c.proposal().reasons.size(), 2u);
  EXPECT_EQ(c.proposal().reasons[0], "mine: mode=sma (noise is low)");
  EXPECT_FALSE(c.proposal().changes_nothing(2, in.settings));
  try {
    c.set_mode("sma:period=0");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "mine: set_mode: mode 'sma:period=0': period must be an integer from 1 to "
              "1000000, not '0'");
  }
  EXPECT_THROW(c.set_compression("topk:2"), std::invalid_argument);
}

TEST(Proposal, AModeSpelledOtherwiseOrAbsentAtItsDefaultChangesNothing) {
  Proposal p;
  p.mode = "sma";
  EXPECT_TRUE(p.changes_nothing(2, {{"mode", "sma:period=1"}}));
  EXPECT_FALSE(p.changes_nothing(2, {{"mode", "sma:period=2"}}));
  EXPECT_FALSE(p.changes_nothing(2, nlohmann::json::object()));
  p.mode = "sync-sgd";
  EXPECT_TRUE(p.changes_nothing(2, nlohmann::json::object()));
  Proposal q;
  q.compression = "none";
  EXPECT_TRUE(q.changes_nothing(2, nlohmann::json::object()));
  EXPECT_FALSE(q.changes_nothing(2, {{"compression", "fp16"}}));
  Proposal merged;
  merged.mode = "sma";
  Proposal later;
  later.mode = "sync-sgd";
  later.compression = "fp16";
  merged.merge(later);
  EXPECT_EQ(*merged.mode, "sync-sgd");
  EXPECT_EQ(*merged.compression, "fp16");
  EXPECT_FALSE(merged.empty());
}

}  // namespace
}  // namespace kf
