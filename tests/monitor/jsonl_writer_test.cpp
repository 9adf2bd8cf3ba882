// SPDX-License-Identifier: Apache-2.0
// The JSON-lines export: RFC 3339 times, one object per write read back with nlohmann::json,
// append mode (to an existing file and across writers), each line in the file as soon as write()
// returns, and errors that name the file.
#include "kf/monitor/jsonl_writer.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kf::monitor {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono;

const system_clock::time_point kTime =
    sys_days{year{2025} / 1 / 31} + hours{9} + minutes{15} + seconds{2} + milliseconds{137};

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class JsonlWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kf-jsonl-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

TEST(FormatRfc3339, WritesUtcWithMilliseconds) {
  EXPECT_EQ(format_rfc3339(kTime), "2025-01-31T09:15:02.137Z");
  EXPECT_EQ(format_rfc3339(system_clock::time_point{}), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(format_rfc3339(kTime + microseconds{999}), "2025-01-31T09:15:02.137Z");  // truncated
}

TEST(ToJsonLine, HoldsStepTimeAndEverySeriesUnderItsPrometheusName) {
  MetricsRegistry registry;
  registry.counter("kf_steps_total", "").inc(12);
  registry.gauge("kf_loss", "", {{"rank", "0"}}).set(0.5);
  registry.gauge("kf_b_simple", "").set(std::numeric_limits<double>::infinity());
  registry.gauge("kf_nan", "").set(std::numeric_limits<double>::quiet_NaN());
  Summary& step = registry.summary("kf_step_seconds", "");
  step.observe(0.25);
  step.observe(0.5);

  EXPECT_EQ(to_json_line(12, kTime, registry),
            "{\"step\":12,\"time\":\"2025-01-31T09:15:02.137Z\",\"metrics\":{"
            "\"kf_b_simple\":\"+Inf\",\"kf_loss{rank=\\\"0\\\"}\":0.5,\"kf_nan\":\"NaN\","
            "\"kf_step_seconds_sum\":0.75,\"kf_step_seconds_count\":2,"
            "\"kf_step_seconds_last\":0.5,\"kf_steps_total\":12.0}}");
}

TEST(ToJsonLine, WritesAHistogramAsItsPrometheusSeries) {
  MetricsRegistry registry;
  Histogram& h = registry.histogram("kf_d_seconds", "", {0.5});
  h.observe(0.25);
  h.observe(1);
  EXPECT_EQ(to_json_line(3, kTime, registry),
            "{\"step\":3,\"time\":\"2025-01-31T09:15:02.137Z\",\"metrics\":{"
            "\"kf_d_seconds_bucket{le=\\\"0.5\\\"}\":1,\"kf_d_seconds_bucket{le=\\\"+Inf\\\"}\":2,"
            "\"kf_d_seconds_sum\":1.25,\"kf_d_seconds_count\":2}}");
}

TEST_F(JsonlWriterTest, AppendsOneParsableObjectPerWriteVisibleAtOnce) {
  MetricsRegistry registry;
  Counter& steps = registry.counter("kf_steps_total", "Steps.");
  Gauge& loss = registry.gauge("kf_loss", "Loss.", {{"rank", "0"}, {"host", "a\"b"}});
  const fs::path path = dir_ / "metrics.jsonl";
  JsonlWriter writer(path.string());
  EXPECT_EQ(writer.path(), path.string());
  for (int step = 1; step <= 3; ++step) {
    steps.inc();
    loss.set(1.0 / step);
    writer.write(step, registry, kTime + seconds{step});
    // In the file before the writer is closed: flushed per line.
    const auto lines = read_lines(path);
    ASSERT_EQ(lines.size(), static_cast<std::size_t>(step));
    EXPECT_TRUE(read_all(path).ends_with("}\n"));
  }
  const auto lines = read_lines(path);
  for (int step = 1; step <= 3; ++step) {
    const json j = json::parse(lines[static_cast<std::size_t>(step - 1)]);
    EXPECT_EQ(j.at("step").get<int>(), step);
    EXPECT_EQ(j.at("time").get<std::string>(),
              "2025-01-31T09:15:0" + std::to_string(2 + step) + ".137Z");
    const json& m = j.at("metrics");
    EXPECT_EQ(m.size(), 2u);
    EXPECT_EQ(m.at("kf_steps_total").get<double>(), step);
    EXPECT_EQ(m.at("kf_loss{host=\"a\\\"b\",rank=\"0\"}").get<double>(), 1.0 / step);
  }
}

TEST_F(JsonlWriterTest, AppendsToAnExistingFileAndAcrossWriters) {
  const fs::path path = dir_ / "metrics.jsonl";
  std::ofstream(path) << "{\"earlier\":true}\n";
  MetricsRegistry registry;
  registry.gauge("g", "").set(1);
  JsonlWriter(path.string()).write(1, registry, kTime);
  JsonlWriter(path.string()).write(2, registry, kTime);
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "{\"earlier\":true}");
  EXPECT_EQ(json::parse(lines[1]).at("step"), 1);
  EXPECT_EQ(json::parse(lines[2]).at("step"), 2);
}

TEST_F(JsonlWriterTest, ThrowsNamingTheFileWhenItCannotBeOpened) {
  const std::string path = (dir_ / "no-such-dir" / "metrics.jsonl").string();
  try {
    JsonlWriter writer(path);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
}

TEST_F(JsonlWriterTest, ThrowsNamingTheFileWhenAWriteFails) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  MetricsRegistry registry;
  JsonlWriter writer("/dev/full");  // every write fails with ENOSPC
  try {
    writer.write(7, registry, kTime);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'/dev/full'"), std::string::npos) << what;
    EXPECT_NE(what.find("step 7"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace kf::monitor
