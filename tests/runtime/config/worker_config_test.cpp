// SPDX-License-Identifier: Apache-2.0
// The precedence of a worker's configuration: defaults < job file < cluster settings <
// environment (which carries kfrun's command line). Pure: no environment is read.
#include "config/worker_config.hpp"

#include <gtest/gtest.h>

namespace kf::detail {
namespace {

using namespace std::chrono_literals;

Env base_env() {
  Env e;
  e.self = Endpoint{"127.0.0.1", 5000};
  e.cluster.version = 1;
  e.cluster.workers = {WorkerSpec{{"127.0.0.1", 5000}, 0}};
  e.job_id = "job";
  e.job_token = "token";
  return e;
}

JobFile job() {
  return parse_job_file(
      "job: {name: test}\n"
      "algorithm: tree\n"
      "commit_every: 4\n"
      "timeouts: {collective_ms: 1500, heartbeat_ms: 2000, connect_ms: 9000}\n"
      "checkpoint: {path: /job/ckpt, every: 7}\n"
      "metrics: {jsonl: /job/metrics.jsonl}\n",
      "job.yaml");
}

TEST(WorkerConfig, DefaultsWithoutJobFileSettingsOrVariables) {
  const auto c = resolve_worker_config(base_env(), std::nullopt);
  const PeerOptions peer_defaults;
  const SessionOptions session_defaults;
  EXPECT_EQ(c.peer.timeout, peer_defaults.timeout);
  EXPECT_EQ(c.peer.heartbeat_timeout, peer_defaults.heartbeat_timeout);
  EXPECT_EQ(c.peer.default_algorithm, Algorithm::auto_select);
  EXPECT_EQ(c.session.commit_every, session_defaults.commit_every);
  EXPECT_EQ(c.session.checkpoint_path, std::nullopt);
  EXPECT_EQ(c.session.monitors, true);
  EXPECT_EQ(c.peer.listen, (Endpoint{"127.0.0.1", 5000}));
  EXPECT_EQ(c.peer.job_token, "token");
}

TEST(WorkerConfig, JobFileOverridesTheDefaults) {
  const auto c = resolve_worker_config(base_env(), job());
  EXPECT_EQ(c.peer.timeout, 1500ms);
  EXPECT_EQ(c.peer.heartbeat_timeout, 2000ms);
  EXPECT_EQ(c.peer.connect_timeout, 9000ms);
  EXPECT_EQ(c.peer.default_algorithm, Algorithm::tree);
  EXPECT_EQ(c.session.commit_every, 4);
  EXPECT_EQ(c.session.checkpoint_path, "/job/ckpt");
  EXPECT_EQ(c.session.checkpoint_every, 7);
  EXPECT_EQ(c.session.metrics_jsonl, "/job/metrics.jsonl");
}

TEST(WorkerConfig, ClusterSettingsOverrideTheJobFile) {
  Env e = base_env();
  e.cluster.settings = {{"algorithm", "ring"}};
  EXPECT_EQ(resolve_worker_config(e, job()).peer.default_algorithm, Algorithm::ring);
}

TEST(WorkerConfig, EnvironmentOverridesSettingsAndJobFile) {
  Env e = base_env();
  e.cluster.settings = {{"algorithm", "ring"}};
  e.algorithm = "star";
  e.timeout = 700ms;
  e.heartbeat_timeout = 400ms;
  e.checkpoint = "/env/ckpt";
  e.checkpoint_every = 3;
  e.metrics_jsonl = "/env/metrics.jsonl";
  e.metrics_every = 5;
  e.monitors = false;
  e.gns_theta = 0.5;
  e.metrics_port = 0;
  e.service_timeout = 3000ms;
  e.recovery_writer_wait = 0ms;
  const auto c = resolve_worker_config(e, job());
  EXPECT_EQ(c.peer.default_algorithm, Algorithm::star);
  EXPECT_EQ(c.peer.timeout, 700ms);
  EXPECT_EQ(c.peer.heartbeat_timeout, 400ms);
  EXPECT_EQ(c.peer.heartbeat_interval, 100ms);
  EXPECT_EQ(c.peer.connect_timeout, 9000ms);  // no variable: the job file's
  EXPECT_EQ(c.session.commit_every, 4);
  EXPECT_EQ(c.session.checkpoint_path, "/env/ckpt");
  EXPECT_EQ(c.session.checkpoint_every, 3);
  EXPECT_EQ(c.session.metrics_jsonl, "/env/metrics.jsonl");
  EXPECT_EQ(c.session.metrics_every, 5);
  EXPECT_FALSE(c.session.monitors);
  EXPECT_EQ(c.session.monitor.gns_theta, 0.5);
  EXPECT_EQ(c.session.metrics_port, std::uint16_t{0});
  EXPECT_EQ(c.session.service_timeout, 3000ms);
  EXPECT_EQ(c.session.recovery_writer_wait, 0ms);
}

TEST(WorkerConfig, TheConnectTimeoutVariableOverridesTheJobFile) {
  Env e = base_env();
  e.connect_timeout = 1500ms;
  EXPECT_EQ(resolve_worker_config(e, job()).peer.connect_timeout, 1500ms);
}

// Every peer variable reaches a session's peer, not only Peer::from_environment's.
TEST(WorkerConfig, FrameAuthAndDeviceBackendVariablesReachThePeer) {
  const auto defaults = resolve_worker_config(base_env(), std::nullopt);
  EXPECT_TRUE(defaults.peer.frame_auth);
  EXPECT_EQ(defaults.peer.device_backend, DeviceBackend::automatic);
  Env e = base_env();
  e.frame_auth = "off";
  e.device_backend = "staging";
  auto c = resolve_worker_config(e, job());
  EXPECT_FALSE(c.peer.frame_auth);
  EXPECT_EQ(c.peer.device_backend, DeviceBackend::staging);
  e.frame_auth = "openssl";
  e.device_backend = "nccl";
  c = resolve_worker_config(e, job());
  EXPECT_TRUE(c.peer.frame_auth);
  EXPECT_TRUE(c.peer.frame_auth_openssl);
  EXPECT_EQ(c.peer.device_backend, DeviceBackend::nccl);
}

TEST(WorkerConfig, AMistypedClusterSettingIsReportedAndIgnoredNotThrown) {
  Env e = base_env();
  e.cluster.settings = {{"algorithm", 5}, {"max_workers", "8"}, {"batch_size", 16}};
  const auto c = resolve_worker_config(e, job());
  ASSERT_EQ(c.settings_errors.size(), 2u);
  EXPECT_EQ(c.settings_errors[0],
            "settings.algorithm: expected one of \"auto\", \"star\", \"ring\", \"tree\", "
            "\"clique\", \"rhd\", got 5");
  EXPECT_EQ(c.settings_errors[1], "settings.max_workers: expected an integer >= 0, got \"8\"");
  EXPECT_EQ(c.peer.default_algorithm, Algorithm::tree);  // the job file's, below the settings
  EXPECT_EQ(c.cluster.settings, (nlohmann::json{{"batch_size", 16}}));
}

TEST(WorkerConfig, ABadVariableValueIsAnErrorNamingIt) {
  Env e = base_env();
  e.transport = "carrier-pigeon";
  try {
    resolve_worker_config(e, std::nullopt);
    FAIL() << "no error";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("KF_TRANSPORT"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kf::detail
