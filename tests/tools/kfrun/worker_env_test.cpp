// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/worker_env.hpp"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kf/common/env.hpp"

namespace kf::tools {
namespace {

// The value of `name` in an environment, or "<unset>".
std::string value_of(const std::vector<std::string>& env, const std::string& name) {
  const std::string key = name + "=";
  std::string found = "<unset>";
  int count = 0;
  for (const auto& entry : env) {
    if (entry.starts_with(key)) {
      found = entry.substr(key.size());
      ++count;
    }
  }
  EXPECT_LE(count, 1) << name << " is set more than once";
  return found;
}

JobSpec two_worker_job() {
  JobSpec job;
  job.cluster = static_cluster("127.0.0.1", {10001, 10002}, std::nullopt);
  job.job_id = "job";
  job.job_token_file = "/run/kf/token";
  return job;
}

TEST(StaticCluster, ListsWorkersInRankOrderWithSlotEqualToRank) {
  const Cluster c = static_cluster("10.0.0.1", {2000, 2001, 2002}, "ring");
  EXPECT_EQ(c.version, 1u);
  ASSERT_EQ(c.size(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(c.workers[rank].endpoint, (Endpoint{"10.0.0.1", std::uint16_t(2000 + rank)}));
    EXPECT_EQ(c.workers[rank].slot, rank);
  }
  EXPECT_EQ(c.settings, (nlohmann::json{{"algorithm", "ring"}}));
  EXPECT_EQ(c.validate(), "");
}

TEST(StaticCluster, HasEmptySettingsWithoutAlgorithm) {
  EXPECT_EQ(static_cluster("h", {1}, std::nullopt).settings, nlohmann::json::object());
}

TEST(WorkerEnvironment, SetsSelfRankSizeAndCluster) {
  const JobSpec job = two_worker_job();
  const auto env = worker_environment(job, 1, {"PATH=/bin", "HOME=/root"});
  EXPECT_EQ(value_of(env, "PATH"), "/bin");
  EXPECT_EQ(value_of(env, "HOME"), "/root");
  EXPECT_EQ(value_of(env, env::kSelf), "127.0.0.1:10002");
  EXPECT_EQ(value_of(env, env::kRank), "1");
  EXPECT_EQ(value_of(env, env::kSize), "2");
  EXPECT_EQ(value_of(env, env::kJobId), "job");
  EXPECT_EQ(value_of(env, env::kJobToken), "<unset>") << "the token goes by file only";
  EXPECT_EQ(value_of(env, env::kJobTokenFile), "/run/kf/token");
  EXPECT_EQ(value_of(env, env::kAlgorithm), "<unset>");
  EXPECT_EQ(value_of(env, env::kTimeoutMs), "<unset>");
  EXPECT_EQ(nlohmann::json::parse(value_of(env, env::kCluster)), job.cluster.to_json());
}

TEST(WorkerEnvironment, ReplacesInheritedKfVariables) {
  JobSpec job = two_worker_job();
  job.job_token_file = "/run/token";
  job.algorithm = "tree";
  job.timeout = std::chrono::milliseconds(1500);
  const auto env = worker_environment(
      job, 0, {"KF_SELF=1.2.3.4:5", "KF_JOB_TOKEN=stale", "KF_RANK=7", "KF_LOG_LEVEL=debug"});
  EXPECT_EQ(value_of(env, env::kSelf), "127.0.0.1:10001");
  EXPECT_EQ(value_of(env, env::kJobToken), "<unset>");
  EXPECT_EQ(value_of(env, env::kJobTokenFile), "/run/token");
  EXPECT_EQ(value_of(env, env::kRank), "0");
  EXPECT_EQ(value_of(env, env::kAlgorithm), "tree");
  EXPECT_EQ(value_of(env, env::kTimeoutMs), "1500");
  EXPECT_EQ(value_of(env, env::kLogLevel), "debug");
}

// A document too large for the environment (Linux refuses an exec with a string over 128 KiB)
// goes by file: one per version, readable by this user only.
TEST(WorkerEnvironment, ALargeClusterGoesByFile) {
  JobSpec job = two_worker_job();
  EXPECT_TRUE(fits_environment(job.cluster));
  std::vector<std::uint16_t> ports;
  for (int i = 0; i < 3000; ++i) ports.push_back(static_cast<std::uint16_t>(10000 + i));
  job.cluster = static_cluster("worker-with-a-long-host-name.example.internal", ports, "ring");
  ASSERT_FALSE(fits_environment(job.cluster));
  std::string pattern = (std::filesystem::temp_directory_path() / "kf-env-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  job.cluster_file = write_cluster_file(job.cluster, dir);
  EXPECT_EQ(*job.cluster_file, (dir / "cluster-v1.json").string());
  EXPECT_EQ(write_cluster_file(job.cluster, dir), *job.cluster_file) << "one file per version";
  EXPECT_EQ(std::filesystem::status(*job.cluster_file).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::ifstream in(*job.cluster_file);
  EXPECT_EQ(nlohmann::json::parse(in), job.cluster.to_json());
  const auto env = worker_environment(job, 7, {"KF_CLUSTER=stale"});
  EXPECT_EQ(value_of(env, env::kCluster), "<unset>");
  EXPECT_EQ(value_of(env, env::kClusterFile), *job.cluster_file);
  EXPECT_EQ(value_of(env, env::kSize), "3000");
  std::filesystem::remove_all(dir);
}

TEST(WorkerEnvironment, SetsConfigServerOnlyWhenTheJobHasOne) {
  JobSpec job = two_worker_job();
  const std::vector<std::string> base{"KF_CONFIG_SERVER=http://enclosing:1"};
  EXPECT_EQ(value_of(worker_environment(job, 0, base), env::kConfigServer), "http://enclosing:1");
  EXPECT_EQ(value_of(worker_environment(job, 0, {}), env::kConfigServer), "<unset>");
  job.config_server = "http://127.0.0.1:7070";
  EXPECT_EQ(value_of(worker_environment(job, 0, base), env::kConfigServer),
            "http://127.0.0.1:7070");
}

TEST(WorkerEnvironment, GivesEachSlotItsOwnMetricsPort) {
  JobSpec job = two_worker_job();
  const std::vector<std::string> base{"KF_METRICS_PORT=1"};
  EXPECT_EQ(value_of(worker_environment(job, 1, base), env::kMetricsPort), "<unset>")
      << "an enclosing job's port must not leak in";
  job.metrics_port = 9100;
  EXPECT_EQ(value_of(worker_environment(job, 0, base), env::kMetricsPort), "9100");
  EXPECT_EQ(value_of(worker_environment(job, 1, base), env::kMetricsPort), "9101");
  job.metrics_port = 65535;
  EXPECT_EQ(value_of(worker_environment(job, 1, {}), env::kMetricsPort), "0")
      << "past the last port the kernel picks one";
  job.metrics_port = 0;
  EXPECT_EQ(value_of(worker_environment(job, 1, {}), env::kMetricsPort), "0");
}

TEST(RandomHex, GivesTwoLowercaseHexDigitsPerByte) {
  const std::string a = random_hex(16);
  const std::string b = random_hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(),
                          [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }));
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace kf::tools
