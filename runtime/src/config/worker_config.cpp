// SPDX-License-Identifier: Apache-2.0
#include "config/worker_config.hpp"

#include "kf/runtime/cluster_settings.hpp"

namespace kf::detail {

namespace {

// The job file's values, over the defaults.
void apply_job_file(const JobFile& job, PeerOptions& peer, SessionOptions& session) {
  peer.timeout = job.timeouts.collective;
  peer.heartbeat_timeout = job.timeouts.heartbeat;
  peer.connect_timeout = job.timeouts.connect;
  peer.default_algorithm = job.algorithm;
  session.commit_every = job.commit_every;
  if (job.checkpoint) {
    session.checkpoint_path = job.checkpoint->path;
    session.checkpoint_every = job.checkpoint->every;
  }
  if (job.metrics && job.metrics->jsonl) session.metrics_jsonl = job.metrics->jsonl;
}

// The environment's values, over everything else.
void apply_environment(const Env& e, PeerOptions& peer, SessionOptions& session) {
  const PeerOptions from_env = Peer::options_from(e);  // identity, transport, algorithm, ...
  peer.listen = from_env.listen;
  peer.listen_fd = from_env.listen_fd;
  peer.job_id = from_env.job_id;
  peer.job_token = from_env.job_token;
  if (e.timeout) peer.timeout = from_env.timeout;
  if (e.spin) peer.spin = from_env.spin;
  if (e.express_bytes) peer.express_bytes = from_env.express_bytes;
  if (e.heartbeat_timeout) {
    peer.heartbeat_timeout = from_env.heartbeat_timeout;
    peer.heartbeat_interval = from_env.heartbeat_interval;
  }
  if (e.connect_timeout) peer.connect_timeout = from_env.connect_timeout;
  if (e.transport) peer.transport = from_env.transport;
  if (e.algorithm) peer.default_algorithm = from_env.default_algorithm;
  if (e.frame_auth) {
    peer.frame_auth = from_env.frame_auth;
    peer.frame_auth_openssl = from_env.frame_auth_openssl;
  }
  if (e.device_backend) peer.device_backend = from_env.device_backend;
  session.config_server = e.config_server;
  session.job_token = e.job_token;
  if (e.checkpoint) session.checkpoint_path = e.checkpoint;
  if (e.checkpoint_every) session.checkpoint_every = *e.checkpoint_every;
  if (e.monitors) session.monitors = *e.monitors;
  if (e.gns_theta) session.monitor.gns_theta = *e.gns_theta;
  if (e.metrics_port) session.metrics_port = e.metrics_port;
  if (e.metrics_host) session.metrics_host = *e.metrics_host;
  if (e.metrics_jsonl) session.metrics_jsonl = e.metrics_jsonl;
  if (e.metrics_every) session.metrics_every = *e.metrics_every;
  if (e.service_timeout) session.service_timeout = *e.service_timeout;
  session.agent_pid = e.agent_pid;
  if (e.no_progress_timeout) session.no_progress_timeout = *e.no_progress_timeout;
  if (e.recovery_writer_wait) session.recovery_writer_wait = *e.recovery_writer_wait;
  if (e.recovery_joiner_wait) session.recovery_joiner_wait = *e.recovery_joiner_wait;
  if (e.spare_sync) session.spare_sync = *e.spare_sync;
  if (e.boundary_interval) session.boundary_interval = *e.boundary_interval;
  if (e.summary_interval) session.summary_interval = *e.summary_interval;
}

}  // namespace

WorkerConfig resolve_worker_config(const Env& env, const std::optional<JobFile>& job) {
  WorkerConfig out;
  const ParsedSettings settings = parse_cluster_settings(env.cluster.settings);
  out.settings_errors = settings.errors;
  out.cluster = env.cluster;
  out.cluster.settings = settings.valid;
  if (job) apply_job_file(*job, out.peer, out.session);
  if (settings.typed.algorithm) out.peer.default_algorithm = *settings.typed.algorithm;
  Env checked = env;
  checked.cluster = out.cluster;  // Peer::options_from reads the algorithm setting too
  apply_environment(checked, out.peer, out.session);
  return out;
}

}  // namespace kf::detail
