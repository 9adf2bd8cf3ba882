// SPDX-License-Identifier: Apache-2.0
#include "kf/common/env.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>

namespace kf {

std::optional<std::string> env::get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

namespace {

using env::get;

std::string require(const char* name) {
  auto v = get(name);
  if (!v) throw std::invalid_argument(std::string(name) + " is not set (start workers with kfrun)");
  return *v;
}

// The variable as an integer in [lo, hi], nullopt when unset. Throws: std::invalid_argument
// naming the variable, its value and what it should be.
std::optional<std::int64_t> get_integer(const char* name, std::int64_t lo, std::int64_t hi,
                                        const char* what) {
  auto t = get(name);
  if (!t) return std::nullopt;
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), v);
  if (ec != std::errc{} || p != t->data() + t->size() || v < lo || v > hi) {
    throw std::invalid_argument(std::string(name) + "='" + *t + "' is not " + what);
  }
  return v;
}

// The variable as a number strictly between lo and hi, nullopt when unset. Throws: as above.
std::optional<double> get_fraction(const char* name, double lo, double hi, const char* what) {
  auto t = get(name);
  if (!t) return std::nullopt;
  double v = 0;
  auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), v);
  if (ec != std::errc{} || p != t->data() + t->size() || !(v > lo && v < hi)) {
    throw std::invalid_argument(std::string(name) + "='" + *t + "' is not " + what);
  }
  return v;
}

// The variables of the runtime (kf::Session): checkpoint, monitors and metrics.
void read_session_variables(Env& e) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  e.job_file = get(env::kJobFile);
  e.checkpoint = get(env::kCheckpoint);
  e.checkpoint_every = get_integer(env::kCheckpointEvery, 1, kMax, "an integer >= 1");
  if (auto v = get_integer(env::kMonitors, 0, 1, "0 or 1")) e.monitors = *v == 1;
  e.gns_theta = get_fraction(env::kGnsTheta, 0.0, 1.0, "a number in (0, 1)");
  if (auto v = get_integer(env::kMetricsPort, 0, 65535, "a port number in 0-65535")) {
    e.metrics_port = static_cast<std::uint16_t>(*v);
  }
  e.metrics_host = get(env::kMetricsHost);
  e.metrics_jsonl = get(env::kMetricsJsonl);
  e.metrics_every = get_integer(env::kMetricsEvery, 1, kMax, "an integer >= 1");
  if (auto v =
          get_integer(env::kServiceTimeoutMs, 1, 86'400'000, "a positive number of milliseconds")) {
    e.service_timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kRecoveryWriterWaitMs, 0, 3'600'000,
                           "a number of milliseconds in 0-3600000")) {
    e.recovery_writer_wait = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kRecoveryJoinerWaitMs, 0, 3'600'000,
                           "a number of milliseconds in 0-3600000")) {
    e.recovery_joiner_wait = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kSpareSyncMs, 0, 86'400'000,
                           "a number of milliseconds in 0-86400000 (0: every commit)")) {
    e.spare_sync = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kBoundaryIntervalMs, 1, 86'400'000,
                           "a number of milliseconds in 1-86400000")) {
    e.boundary_interval = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kSummaryIntervalMs, 0, 86'400'000,
                           "a number of milliseconds in 0-86400000 (0: no summaries)")) {
    e.summary_interval = std::chrono::milliseconds(*v);
  }
  e.agent_pid = get_integer(env::kAgentPid, 1, kMax, "a process id >= 1");
  if (auto v = get_integer(env::kNoProgressTimeoutMs, 0, 86'400'000,
                           "a number of milliseconds in 0-86400000 (0: off)")) {
    e.no_progress_timeout = std::chrono::milliseconds(*v);
  }
}

}  // namespace

namespace {

// Whether this is the first warning of `kind` about the token file `path` in this process.
bool first_warning(const std::string& path, const char* kind) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lk(mu);
  return warned.insert(std::string(kind) + " " + path).second;
}

}  // namespace

std::string read_token_file(const std::string& path) {
  constexpr std::size_t kMaxTokenBytes = 4096;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error("cannot read job token file '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw std::runtime_error("job token file '" + path + "' is not a regular file");
  }
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read job token file '" + path + "'");
  std::string head(kMaxTokenBytes + 1, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  std::string token = head.substr(0, head.find('\n'));
  if (token.size() > kMaxTokenBytes) {
    throw std::runtime_error("job token file '" + path + "': the first line is longer than " +
                             std::to_string(kMaxTokenBytes) + " bytes");
  }
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw std::runtime_error("job token file '" + path + "' is empty");
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0 && first_warning(path, "mode")) {
    KF_LOG(warn, "auth",
           "job token file '{}' may be read by {} (mode {:o}): whoever reads it can join and "
           "change the job; chmod 600 it",
           printable(path), (st.st_mode & S_IROTH) != 0 ? "every user" : "its group",
           st.st_mode & 0777);
  }
  // The job id and etcd's key prefix are hashes of the token: a short one can be found offline.
  constexpr std::size_t kShortToken = 16;
  if (token.size() < kShortToken && first_warning(path, "short")) {
    KF_LOG(warn, "auth",
           "job token file '{}' holds a token of {} bytes: the job id and etcd's key prefix are "
           "hashes of it, so a short one can be found offline; make it 32 random bytes: "
           "(umask 077; head -c 32 /dev/urandom | base64 > FILE)",
           printable(path), token.size());
  }
  return token;
}

Env Env::from_environment() {
  Env e;
  try {
    e.self = Endpoint::parse(require(env::kSelf));
  } catch (const std::invalid_argument& ex) {
    throw std::invalid_argument(std::string(env::kSelf) + ": " + ex.what());
  }
  // 0-2 are stdin, stdout and stderr.
  if (auto v = get_integer(env::kListenFd, 3, std::numeric_limits<int>::max(),
                           "a descriptor number >= 3")) {
    e.listen_fd = static_cast<int>(*v);
  }
  // The document in the environment, or (a large one) in the file it names.
  const char* source = env::kCluster;
  std::string cluster_text;
  if (auto inline_text = get(env::kCluster)) {
    cluster_text = std::move(*inline_text);
  } else if (auto file = get(env::kClusterFile)) {
    source = env::kClusterFile;
    constexpr std::uintmax_t kMaxClusterFileBytes = std::uintmax_t{64} << 20;
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(*file, ec);
    if (ec || bytes > kMaxClusterFileBytes) {
      throw std::invalid_argument(
          std::string(env::kClusterFile) + ": '" + *file + "' " +
          (ec ? "cannot be read: " + ec.message() : "is larger than 64 MiB"));
    }
    std::ifstream in(*file, std::ios::binary);
    cluster_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      throw std::invalid_argument(std::string(env::kClusterFile) + ": cannot read '" + *file + "'");
    }
  } else {
    throw std::invalid_argument(std::string("neither ") + env::kCluster + " nor " +
                                env::kClusterFile + " is set");
  }
  try {
    e.cluster = Cluster::from_json(parse_json(cluster_text));
  } catch (const std::exception& ex) {
    throw std::invalid_argument(std::string(source) + ": " + ex.what());
  }
  e.job_id = get(env::kJobId).value_or("kf");
  if (auto t = get(env::kJobToken)) {
    e.job_token = *t;
  } else if (auto f = get(env::kJobTokenFile)) {
    e.job_token = read_token_file(*f);
  } else {
    throw std::invalid_argument(std::string("neither ") + env::kJobToken + " nor " +
                                env::kJobTokenFile + " is set");
  }
  e.config_server = get(env::kConfigServer);
  e.algorithm = get(env::kAlgorithm);
  e.transport = get(env::kTransport);
  e.frame_auth = get(env::kFrameAuth);
  e.device_backend = get(env::kDeviceBackend);
  if (auto v = get_integer(env::kTimeoutMs, 1, 86'400'000, "a positive number of milliseconds")) {
    e.timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kHeartbeatMs, 0, 86'400'000,
                           "a number of milliseconds (0 disables heartbeats)")) {
    e.heartbeat_timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kConnectTimeoutMs, 1, 3'600'000,
                           "a number of milliseconds in 1-3600000")) {
    e.connect_timeout = std::chrono::milliseconds(*v);
  }
  if (auto v = get_integer(env::kSpinUs, 0, 1'000'000, "a number of microseconds in 0-1000000")) {
    e.spin = std::chrono::microseconds(*v);
  }
  if (auto v = get_integer(env::kExpressBytes, 0, 65536, "a number of bytes in 0-65536")) {
    e.express_bytes = static_cast<std::size_t>(*v);
  }
  read_session_variables(e);
  return e;
}

}  // namespace kf
