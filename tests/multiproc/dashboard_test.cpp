// SPDX-License-Identifier: Apache-2.0
// The config service's dashboard in a real browser (Debian's chromium, headless, driven over
// its DevTools pipe by tests/support/page_probe.py): a live elastic job of 2 workers; the page,
// opened once, shows its members, then follows a grow to 3 (`kf-member resize`) and a kill -9
// without a reload: the members table, the new version and its cause. No console error or
// uncaught exception on the way. A screenshot goes to the build directory
// (dashboard-test.png) for a person to look at; `kf-member trace` then tells the same story as
// a Chrome trace. Skips, saying why, without chromium.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "support/elastic_job.hpp"

namespace kf::test {
namespace {

const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 100000 --sample-us 20";

std::filesystem::path probe_script() {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "support/page_probe.py";
}

// JavaScript: the page's members table has `n` rows and its header names version `v`.
std::string shows(int n, std::uint64_t v) {
  return "document.querySelectorAll('#members tbody tr').length === " + std::to_string(n) +
         " && document.getElementById('status').innerText.startsWith('version " +
         std::to_string(v) + " ')";
}

// The page opened once: waits for `first`, then runs `change` and waits for `then`. Returns
// the probe's final JSON line (with "held", "text", "errors"), or a JSON object with "error".
nlohmann::json follow(const std::string& url, const std::string& first, const std::string& then,
                      const std::function<void()>& change, const std::string& screenshot = "") {
  std::vector<std::string> argv{
      "/usr/bin/env", "python3", probe_script().string(), url, "--first", first,
      "--until",      then,      "--timeout-s",           "60"};
  if (!screenshot.empty()) {
    argv.push_back("--screenshot");
    argv.push_back(screenshot);
  }
  Child probe = spawn(argv, {});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  const auto line = read_line(probe, until);
  const auto first_seen = line ? nlohmann::json::parse(*line, nullptr, false) : nlohmann::json();
  if (first_seen.is_discarded() || !first_seen.is_object() || !first_seen.value("first", false)) {
    wait_exit(probe, until);
    return {{"error", "the page never showed its first state: " + line.value_or("(nothing)") +
                          probe.pending}};
  }
  change();
  const auto last = read_line(probe, until);
  wait_exit(probe, until);
  if (!last) return {{"error", "the probe said nothing more"}};
  auto j = nlohmann::json::parse(*last, nullptr, false);
  if (j.is_discarded()) return {{"error", "the probe said: " + *last}};
  return j;
}

TEST(Dashboard, ABrowserSeesTheMembersAndFollowsAGrowAndAKillNineLive) {
  if (run_shell("command -v chromium && command -v python3").exit_code != 0) {
    GTEST_SKIP() << "chromium (and python3) are needed for the dashboard's browser test "
                    "(apt install chromium)";
  }
  ElasticJob job("dashboard");
  job.start(2, kArgs);
  ASSERT_TRUE(job.wait_progress(30)) << job.err();
  const std::string url = job.url() + "/";
  const std::uint64_t v = job.client().get_cluster().version;

  // A grow: the page, up with 2 members, follows to 3 and shows the version and its cause.
  auto grown = follow(url, shows(2, v),
                      shows(3, v + 1) +
                          " && document.body.innerText.includes("
                          "'kf-member resize')",
                      [&] {
                        const auto r = job.member("resize 3");
                        EXPECT_EQ(r.exit_code, 0) << r.output;
                      });
  ASSERT_TRUE(grown.value("held", false)) << grown.dump(2) << job.err();
  EXPECT_EQ(grown["errors"], nlohmann::json::array()) << grown.dump(2);
  for (const auto& w : job.client().get_cluster().workers) {
    EXPECT_NE(grown["text"].get<std::string>().find(w.endpoint.str()), std::string::npos)
        << "the members table lacks " << w.endpoint.str();
  }

  // A kill -9: the page follows to the recovered version, 2 members, and names the failure.
  std::mt19937 gen(5);
  std::string victim;
  const auto shot = std::filesystem::current_path() / "dashboard-test.png";
  auto recovered = follow(
      url, shows(3, v + 1),
      "document.querySelectorAll('#members tbody tr').length === 2 && "
      "/failed/.test(document.getElementById('versions').innerText)",
      [&] { victim = job.kill_random_worker(gen); }, shot.string());
  ASSERT_FALSE(victim.empty());
  ASSERT_TRUE(recovered.value("held", false)) << recovered.dump(2) << job.err();
  EXPECT_EQ(recovered["errors"], nlohmann::json::array()) << recovered.dump(2);
  EXPECT_NE(recovered["text"].get<std::string>().find(victim), std::string::npos)
      << "the timeline does not name the killed worker " << victim;
  EXPECT_TRUE(std::filesystem::exists(shot));
  std::printf("dashboard screenshot: %s\n", shot.c_str());

  // The same story as a Chrome trace: the failure beside the steps, and the grow's phases.
  const auto trace_file = job.dir() / "trace.json";
  const auto t = job.member("trace --output " + trace_file.string());
  ASSERT_EQ(t.exit_code, 0) << t.output;
  std::ifstream in(trace_file);
  const auto trace = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(trace.is_discarded()) << "the trace is not JSON";
  int failed = 0, steps = 0, phases = 0;
  for (const auto& e : trace.at("traceEvents")) {
    ASSERT_TRUE(e.contains("name") && e.contains("ph") && e.contains("pid")) << e.dump();
    if (e["ph"] == "M") continue;
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number_integer() && e.contains("tid")) << e.dump();
    failed += e["name"] == "failed";
    steps += e.value("cat", "") == "step";
    phases += e.value("cat", "") == "change";
  }
  EXPECT_GE(failed, 1);
  EXPECT_GE(steps, 1);
  EXPECT_GE(phases, 5) << "the phases of at least one change";
  job.finish_soon();
  job.expect_clean_finish(job.wait(), 2);
}

}  // namespace
}  // namespace kf::test
