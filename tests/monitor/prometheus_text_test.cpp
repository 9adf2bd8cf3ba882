// SPDX-License-Identifier: Apache-2.0
// The Prometheus text exposition (format 0.0.4): the exact text of a small registry, escaping
// of help texts and label values, and the spelling of values.
#include "kf/monitor/prometheus_text.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace kf::monitor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(PrometheusText, WritesASmallRegistryExactly) {
  MetricsRegistry registry;
  registry.counter("kf_steps_total", "Optimizer steps taken.").inc(3);
  registry.gauge("kf_batch_size", "Global batch size.", {{"rank", "1"}}).set(32);
  registry.gauge("kf_batch_size", "Global batch size.", {{"rank", "0"}}).set(64);
  Summary& step = registry.summary("kf_step_seconds", "Step time in seconds.");
  step.observe(0.5);
  step.observe(0.25);
  registry.gauge("kf_b_simple", "").set(kInf);
  registry.summary("kf_idle_seconds", "Idle.", {{"rank", "0"}});  // never observed

  EXPECT_EQ(to_prometheus_text(registry),
            "# TYPE kf_b_simple gauge\n"
            "kf_b_simple +Inf\n"
            "# HELP kf_batch_size Global batch size.\n"
            "# TYPE kf_batch_size gauge\n"
            "kf_batch_size{rank=\"0\"} 64\n"
            "kf_batch_size{rank=\"1\"} 32\n"
            "# HELP kf_idle_seconds Idle.\n"
            "# TYPE kf_idle_seconds summary\n"
            "kf_idle_seconds_sum{rank=\"0\"} 0\n"
            "kf_idle_seconds_count{rank=\"0\"} 0\n"
            "# HELP kf_idle_seconds_last Idle. (last observation)\n"
            "# TYPE kf_idle_seconds_last gauge\n"
            "kf_idle_seconds_last{rank=\"0\"} NaN\n"
            "# HELP kf_step_seconds Step time in seconds.\n"
            "# TYPE kf_step_seconds summary\n"
            "kf_step_seconds_sum 0.75\n"
            "kf_step_seconds_count 2\n"
            "# HELP kf_step_seconds_last Step time in seconds. (last observation)\n"
            "# TYPE kf_step_seconds_last gauge\n"
            "kf_step_seconds_last 0.25\n"
            "# HELP kf_steps_total Optimizer steps taken.\n"
            "# TYPE kf_steps_total counter\n"
            "kf_steps_total 3\n");
}

TEST(PrometheusText, WritesAHistogramWithCumulativeBucketsSumAndCount) {
  MetricsRegistry registry;
  Histogram& h = registry.histogram("kf_phase_duration_seconds", "Phase time.", {0.01, 0.1},
                                    {{"phase", "sync"}});
  h.observe(0.005);
  h.observe(0.01);  // on a bound: in that bucket
  h.observe(0.05);
  h.observe(3);
  EXPECT_EQ(to_prometheus_text(registry),
            "# HELP kf_phase_duration_seconds Phase time.\n"
            "# TYPE kf_phase_duration_seconds histogram\n"
            "kf_phase_duration_seconds_bucket{phase=\"sync\",le=\"0.01\"} 2\n"
            "kf_phase_duration_seconds_bucket{phase=\"sync\",le=\"0.1\"} 3\n"
            "kf_phase_duration_seconds_bucket{phase=\"sync\",le=\"+Inf\"} 4\n"
            "kf_phase_duration_seconds_sum{phase=\"sync\"} 3.065\n"
            "kf_phase_duration_seconds_count{phase=\"sync\"} 4\n");
}

TEST(PrometheusText, EscapesHelpAndLabelValues) {
  MetricsRegistry registry;
  // In HELP only backslash and newline are escaped; in label values also the double quote.
  registry.gauge("g", "a \\ b\nc \"q\"", {{"v", "x\"y\\z\nw"}, {"e", ""}}).set(1);
  EXPECT_EQ(to_prometheus_text(registry),
            "# HELP g a \\\\ b\\nc \"q\"\n"
            "# TYPE g gauge\n"
            "g{e=\"\",v=\"x\\\"y\\\\z\\nw\"} 1\n");
}

TEST(PrometheusText, EmptyRegistryGivesEmptyText) {
  MetricsRegistry registry;
  EXPECT_EQ(to_prometheus_text(registry), "");
}

TEST(PrometheusText, SeriesNameKeepsTheGivenLabelOrder) {
  EXPECT_EQ(series_name("up", {}), "up");
  EXPECT_EQ(series_name("up", {{"z", "1"}, {"a", "\""}}), "up{z=\"1\",a=\"\\\"\"}");
}

TEST(PrometheusText, FormatsValuesAsTheShortestRoundTrip) {
  EXPECT_EQ(format_value(0.0), "0");
  EXPECT_EQ(format_value(3.0), "3");
  EXPECT_EQ(format_value(-2.5), "-2.5");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(1.0 / 3.0), "0.3333333333333333");
  EXPECT_EQ(format_value(1e21), "1e+21");
  EXPECT_EQ(format_value(1.5e-7), "1.5e-07");
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(format_value(kInf), "+Inf");
  EXPECT_EQ(format_value(-kInf), "-Inf");
}

}  // namespace
}  // namespace kf::monitor
