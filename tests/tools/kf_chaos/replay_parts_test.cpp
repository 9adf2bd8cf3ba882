// SPDX-License-Identifier: Apache-2.0
// kf-replay's pure parts: reading a trace, the job sizes it gives, and the job's progress from
// its metrics lines.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "kf-chaos/lib/progress.hpp"
#include "kf-chaos/lib/trace.hpp"

namespace kf::chaos {
namespace {

std::vector<TraceEvent> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_trace(in, "t.csv");
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

TEST(Trace, ReadsRowsWithAHeaderCommentsAndBlankLines) {
  const auto t = parse("# spot trace\nt_ms,action,node\n\n0,add,a\n0, add ,b\r\n1500,remove,a\n");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[1].node, "b");
  EXPECT_TRUE(t[1].add);
  EXPECT_EQ(t[2].t_ms, 1500);
  EXPECT_FALSE(t[2].add);
  EXPECT_EQ(peak_nodes(t), 2);
}

TEST(Trace, NamesTheLineAndWhatIsWrong) {
  EXPECT_EQ(error_of("0,add,a\n5,add\n"),
            "t.csv:2: expected 3 fields (t_ms,add|remove,node), found 2");
  EXPECT_EQ(error_of("0,add,a\nx,add,b\n"),
            "t.csv:2: time 'x' is not a number of milliseconds >= 0");
  EXPECT_EQ(error_of("-5,add,a\n"), "t.csv:1: time '-5' is not a number of milliseconds >= 0");
  EXPECT_EQ(error_of("10,add,a\n5,add,b\n"), "t.csv:2: time 5 comes before the row above (10)");
  EXPECT_EQ(error_of("0,start,a\n"), "t.csv:1: action 'start' is neither add nor remove");
  EXPECT_EQ(error_of("0,add,a b\n"), "t.csv:1: node name 'a b' is empty or not printable ASCII");
  EXPECT_EQ(error_of("0,add,a\n1,add,a\n"), "t.csv:2: node a is up already");
  EXPECT_EQ(error_of("0,remove,a\n"), "t.csv:1: node a is not up");
  EXPECT_EQ(error_of("# nothing\n"), "t.csv: no rows");
  EXPECT_EQ(error_of("t_ms,action,node\n"), "t.csv: no rows");
  EXPECT_EQ(error_of(std::string(5000, '1') + ",add,a\n"), "t.csv:1: line longer than 4096 bytes");
}

TEST(Trace, SizesAreScaledToTheMachineAndNeverZero) {
  // Up: 2, then 4 (peak), then 3, then 0, then 1.
  const auto t = parse(
      "0,add,a\n0,add,b\n1000,add,c\n1000,add,d\n2000,remove,a\n"
      "3000,remove,b\n3000,remove,c\n3000,remove,d\n4000,add,e\n");
  const auto s = size_steps(t, 2, 10.0);
  // 2 nodes -> 1 worker; 4 -> 2; 3 -> 2 (1.5 rounds up: no change); 0 -> 1 (at least one).
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].at_ms, 0);
  EXPECT_EQ(s[0].workers, 1);
  EXPECT_EQ(s[1].at_ms, 100);
  EXPECT_EQ(s[1].workers, 2);
  EXPECT_EQ(s[1].nodes, 4);
  EXPECT_EQ(s[2].at_ms, 300);
  EXPECT_EQ(s[2].workers, 1);
  EXPECT_EQ(s[2].nodes, 0);
  // No more nodes than workers: the trace's own counts, and times from its first row.
  const auto small = size_steps(parse("500,add,a\n1500,add,b\n"), 4, 1.0);
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(small[0].workers, 1);
  EXPECT_EQ(small[1].at_ms, 1000);
  EXPECT_EQ(small[1].workers, 2);
  EXPECT_THROW(size_steps(t, 0, 1.0), std::invalid_argument);
  EXPECT_THROW(size_steps(t, 2, 0.0), std::invalid_argument);
}

std::string line(int step, const std::string& time, int workers, int batch = 0) {
  std::string m = "\"kf_cluster_size\":" + std::to_string(workers);
  if (batch > 0) m += ",\"kf_global_batch_size\":" + std::to_string(batch);
  return "{\"step\":" + std::to_string(step) + ",\"time\":\"" + time + "\",\"metrics\":{" + m +
         "}}\n";
}

TEST(Progress, CountsCommittedWorkInSamplesWhereTheBatchIsKnown) {
  const std::string jsonl = line(10, "2026-11-27T00:00:00.000Z", 2, 64) +
                            line(20, "2026-11-27T00:00:01.000Z", 2, 64) +
                            // A rollback after a failure: 5 steps lost.
                            line(15, "2026-11-27T00:00:02.000Z", 1, 64) +
                            line(35, "2026-11-27T00:00:03.000Z", 1, 32) + "{\"step\":36,\"ti";
  const Progress p = read_progress(jsonl);
  ASSERT_EQ(p.points.size(), 4u) << "the torn last line is skipped";
  EXPECT_TRUE(p.in_samples);
  EXPECT_STREQ(p.unit(), "samples");
  EXPECT_EQ(p.points[1].work, 640);
  EXPECT_EQ(p.points[2].work, 640 - 5 * 64);
  EXPECT_EQ(p.points[3].work, 640 - 320 + 20 * 32);
  EXPECT_EQ(p.points[2].workers, 1);
  const std::int64_t t0 = parse_utc_ms("2026-11-27T00:00:00.000Z");
  EXPECT_EQ(work_between(p, t0, t0 + 1000), 640);
  EXPECT_EQ(steps_rolled_back(p, t0, t0 + 3000), 5);
  EXPECT_EQ(steps_rolled_back(p, t0 + 2000, t0 + 3000), 0) << "the rollback came at t0 + 2 s";
  EXPECT_EQ(work_between(p, t0 + 500, t0 + 3000), 640 - 320 + 640);
  EXPECT_EQ(work_between(p, t0 - 10, t0 - 5), 0) << "before the first line";
}

TEST(Progress, WorkAtTheSizesRunWithAndWhenAChangeTookEffect) {
  // 1 worker for a second, a change at t0 + 1.2 s that shows at t0 + 2 s, 2 workers after.
  const Progress p = read_progress(
      line(0, "2026-11-27T00:00:00.000Z", 1) + line(100, "2026-11-27T00:00:01.000Z", 1) +
      line(150, "2026-11-27T00:00:02.000Z", 2) + line(300, "2026-11-27T00:00:03.000Z", 2));
  const std::int64_t t0 = parse_utc_ms("2026-11-27T00:00:00.000Z");
  const std::map<int, double> rate{{1, 100.0}, {2, 160.0}};
  EXPECT_DOUBLE_EQ(work_at_sizes(p, rate, t0, t0 + 3000), 100 + 160 + 160);
  EXPECT_DOUBLE_EQ(work_at_sizes(p, rate, t0 + 500, t0 + 2500), 50 + 160 + 80);
  EXPECT_DOUBLE_EQ(work_at_sizes(p, {{1, 100.0}}, t0, t0 + 3000), 100)
      << "a size without a rate counts nothing";
  EXPECT_EQ(in_effect_after(p, t0 + 1200, t0 + 3000, 2), 800);
  EXPECT_EQ(in_effect_after(p, t0 + 1200, t0 + 1900, 2), std::nullopt) << "not before the next";
  EXPECT_EQ(in_effect_after(p, t0, t0 + 3000, 3), std::nullopt);
}

TEST(Progress, CountsStepsWhereALineLacksTheBatch) {
  const Progress p = read_progress(line(10, "2026-11-27T00:00:00.000Z", 1, 64) +
                                   line(30, "2026-11-27T00:00:01.000Z", 1));
  EXPECT_FALSE(p.in_samples);
  EXPECT_STREQ(p.unit(), "steps");
  EXPECT_EQ(p.points.back().work, 20);
}

TEST(Progress, SkipsWhatIsNotAProgressLineAndOddWorkerCounts) {
  const std::string deep(100'000, '[');
  const Progress p = read_progress(
      deep + "\n" + line(10, "2026-11-27T00:00:00.000Z", 1, 64) +
      "{\"step\":20,\"time\":\"2026-11-27T00:00:01.000Z\",\"metrics\":{\"kf_cluster_size\":1e300}}"
      "\n" +
      "{\"step\":30,\"time\":\"2026-11-27T00:00:02.000Z\",\"metrics\":{\"kf_cluster_size\":-4}}\n");
  ASSERT_EQ(p.points.size(), 3u) << "the nested line is skipped";
  EXPECT_EQ(p.points[1].workers, 0) << "a count no job has reads as unknown";
  EXPECT_EQ(p.points[2].workers, 0);
}

TEST(Progress, ParsesTheWritersTimesOnly) {
  EXPECT_EQ(parse_utc_ms("1970-01-01T00:00:01.250Z"), 1250);
  EXPECT_EQ(parse_utc_ms("2000-03-01T00:00:00.000Z") - parse_utc_ms("2000-02-28T00:00:00.000Z"),
            2 * 86'400'000)
      << "2000 is a leap year";
  EXPECT_EQ(parse_utc_ms("2026-11-27T00:00:00Z"), -1);
  EXPECT_EQ(parse_utc_ms("2026-13-27T00:00:00.000Z"), -1);
  EXPECT_EQ(parse_utc_ms("2026-11-27 00:00:00.000Z"), -1);
}

}  // namespace
}  // namespace kf::chaos
