// SPDX-License-Identifier: Apache-2.0
// kf-chaos's reading of the workers' report lines: what passes and each way to fail.
#include "kf-chaos/lib/verdict.hpp"

#include <gtest/gtest.h>

#include <string>

namespace kf::chaos {
namespace {

std::string change(const std::string& worker, const std::string& kind, int to_version, int commit) {
  return "[" + worker + "] change {\"kind\":\"" + kind +
         "\",\"to_version\":" + std::to_string(to_version) +
         ",\"commit\":" + std::to_string(commit) + "}\n";
}

std::string final_line(const std::string& worker, int step, int workers, const std::string& hash) {
  return "[" + worker + "] final step=" + std::to_string(step) +
         " workers=" + std::to_string(workers) + " hash=" + hash + " loss=0.1 check_us=3\n";
}

bool mentions(const Verdict& v, const std::string& part) {
  for (const auto& p : v.problems) {
    if (p.find(part) != std::string::npos) return true;
  }
  return false;
}

const std::string kGood = change("a:1", "join", 1, 0) + change("b:2", "join", 1, 0) +
                          "[a:1] setting step=0 workers=2 batch=64 version=1\n" +
                          change("c:3", "join", 2, 0) + change("a:1", "resize", 2, 40) +
                          change("b:2", "resize", 2, 40) + change("c:3", "left", 0, 90) +
                          change("a:1", "recovery", 3, 90) + change("b:2", "recovery", 3, 90) +
                          "kfrun: a line of the agent's own\n" + final_line("a:1", 120, 2, "ab12") +
                          final_line("b:2", 120, 2, "ab12");

TEST(Verdict, AJobThatKeptEveryGuaranteePasses) {
  const Verdict v = judge(kGood);
  EXPECT_TRUE(v.pass);
  EXPECT_TRUE(v.problems.empty()) << v.problems.front();
  EXPECT_EQ(v.finals, 2);
  EXPECT_EQ(v.final_workers, 2);
  EXPECT_EQ(v.final_step, 120);
  EXPECT_EQ(v.hash, "ab12");
  EXPECT_EQ(v.changes, 2) << "joins and leaves name no job commit";
  EXPECT_EQ(v.last_commit, 90);
}

// The survivors' pauses come from their recovery records (detected -> resumed); a recovery that
// removed several workers at once counts as overlapping failures too. Records without the times
// (as above) count for nothing.
TEST(Verdict, RecoveryPausesAreTheSurvivorsTimesFromDetectionToTheFirstStep) {
  EXPECT_TRUE(judge(kGood).recovery_pauses_ms.empty());
  const auto recovery = [](const std::string& worker, int from, int to, long detected,
                           long resumed) {
    return "[" + worker + "] change {\"kind\":\"recovery\",\"to_version\":5,\"commit\":9," +
           "\"from_size\":" + std::to_string(from) + ",\"to_size\":" + std::to_string(to) +
           ",\"detected_us\":" + std::to_string(detected) +
           ",\"resumed_us\":" + std::to_string(resumed) + "}\n";
  };
  const Verdict v = judge(recovery("a:1", 4, 3, 1'000'000, 1'004'500) +
                          recovery("b:2", 4, 2, 2'000'000, 2'120'000) +
                          recovery("c:3", 4, 3, 0, 5) + final_line("a:1", 20, 1, "ab"));
  ASSERT_EQ(v.recovery_pauses_ms.size(), 2u);
  EXPECT_DOUBLE_EQ(v.recovery_pauses_ms[0], 4.5);
  EXPECT_DOUBLE_EQ(v.recovery_pauses_ms[1], 120.0);
  ASSERT_EQ(v.overlapping_pauses_ms.size(), 1u);
  EXPECT_DOUBLE_EQ(v.overlapping_pauses_ms[0], 120.0);
}

TEST(Verdict, PercentilesAreByNearestRank) {
  std::vector<double> ms;
  for (int i = 100; i >= 1; --i) ms.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(ms, 50), 50);
  EXPECT_DOUBLE_EQ(percentile(ms, 99), 99);
  EXPECT_DOUBLE_EQ(percentile(ms, 100), 100);
  EXPECT_DOUBLE_EQ(percentile({7.0}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);
}

TEST(Verdict, DifferentParametersOrStepsFail) {
  EXPECT_TRUE(mentions(judge(final_line("a:1", 5, 2, "aa") + final_line("b:2", 5, 2, "bb")),
                       "different parameters"));
  EXPECT_TRUE(mentions(judge(final_line("a:1", 5, 2, "aa") + final_line("b:2", 6, 2, "aa")),
                       "different steps (5 to 6)"));
  EXPECT_TRUE(mentions(judge(final_line("a:1", 5, 3, "aa") + final_line("b:2", 5, 3, "aa")),
                       "2 workers printed a final line, but they say the job had 3"));
}

TEST(Verdict, LostCommitsFail) {
  const std::string back = change("a:1", "resize", 2, 50) + change("a:1", "recovery", 3, 40) +
                           final_line("a:1", 60, 1, "aa");
  EXPECT_TRUE(mentions(judge(back),
                       "committed progress went back: version 3 resumed from step "
                       "40, but version 2 had committed step 50"));
  // One worker behind the others' commit at a change: fine when the state was synced to it (the
  // agreement picks the newest commit), lost progress when not.
  const std::string split = change("a:1", "recovery", 2, 50) + change("b:2", "recovery", 2, 51) +
                            final_line("a:1", 60, 2, "aa") + final_line("b:2", 60, 2, "aa");
  EXPECT_TRUE(mentions(judge(split),
                       "a:1 went to version 2 at step 50, behind the commit 51 of others, and no "
                       "state was synced"));
  const std::string synced =
      "[a:1] change {\"kind\":\"recovery\",\"to_version\":2,\"commit\":50,\"sync_bytes\":64}\n" +
      change("b:2", "recovery", 2, 51) + final_line("a:1", 60, 2, "aa") +
      final_line("b:2", 60, 2, "aa");
  const Verdict v = judge(synced);
  EXPECT_TRUE(v.pass) << v.problems.front();
  EXPECT_EQ(v.last_commit, 51);
  const std::string short_end = change("a:1", "resize", 2, 70) + final_line("a:1", 60, 1, "aa");
  EXPECT_TRUE(mentions(judge(short_end), "finished at step 60, before step 70"));
}

TEST(Verdict, BrokenLinesNoFinalsAndUnreadableReportsFail) {
  EXPECT_TRUE(mentions(judge(kGood + "[b:2] BROKEN sample 7 used 2 times in epoch 0\n"),
                       "b:2 reported a broken guarantee: BROKEN sample 7"));
  EXPECT_TRUE(mentions(judge("kfrun: nothing from the workers\n"), "no worker printed a final"));
  EXPECT_TRUE(mentions(judge(kGood + "[a:1] final step=x\n"), "final line kf-chaos cannot read"));
  EXPECT_TRUE(mentions(judge(kGood + "[a:1] final step=99999999999999999999 workers=2 hash=aa\n"),
                       "final line kf-chaos cannot read"));
  EXPECT_TRUE(mentions(judge(kGood + "[a:1] final step=60 workers=99999999999 hash=aa\n"),
                       "final line kf-chaos cannot read"));
  // A kind of another type is no kind kf-chaos knows: the line counts as a plain change.
  const Verdict odd_kind =
      judge(kGood + "[a:1] change {\"kind\":5,\"to_version\":3,\"commit\":90}\n");
  EXPECT_TRUE(odd_kind.pass) << odd_kind.problems.front();
  EXPECT_TRUE(mentions(judge(kGood + "[a:1] change {\"kind\":\"resize\"}\n"),
                       "change line kf-chaos cannot read"));
  EXPECT_TRUE(
      mentions(judge(kGood + "[a:1] change {not json\n"), "change line kf-chaos cannot read"));
}

}  // namespace
}  // namespace kf::chaos
