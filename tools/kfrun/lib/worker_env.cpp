// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/worker_env.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include <openssl/rand.h>

#include "kf/common/env.hpp"
#include "kf/common/log.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/ports.hpp"
#include "kfrun/lib/unique_fd.hpp"
#include "kfrun/lib/worker_process.hpp"

namespace kf::tools {

namespace {

// Every variable worker_environment() may set; inherited values of these are dropped.
constexpr std::array kManaged = {
    env::kSelf,     env::kListenFd,     env::kCluster,   env::kClusterFile, env::kJobId,
    env::kJobToken, env::kJobTokenFile, env::kAlgorithm, env::kTimeoutMs,   env::kRank,
    env::kSize,     env::kMetricsPort,  env::kJobFile};

bool is_managed(std::string_view entry, bool sets_config_server) {
  const auto name = entry.substr(0, entry.find('='));
  if (sets_config_server && name == env::kConfigServer) return true;
  return std::any_of(kManaged.begin(), kManaged.end(),
                     [&](const char* managed) { return name == managed; });
}

bool has_name(std::string_view entry, const char* name) {
  return entry.substr(0, entry.find('=')) == name;
}

std::string assign(const char* name, const std::string& value) {
  return std::string(name) + "=" + value;
}

}  // namespace

UniqueFd worker_listener(const Endpoint& self) {
  try {
    UniqueFd fd = bind_worker_port(self.host, self.port);
    if (!fd.is_open()) {
      throw ExecError("its port " + std::to_string(self.port) +
                      " is in use on this host (taken since it was picked)");
    }
    return fd;
  } catch (const std::invalid_argument& e) {
    throw ExecError(e.what());
  } catch (const std::system_error& e) {
    throw ExecError(std::string("cannot bind its port: ") + e.what());
  }
}

void add_listen_fd(std::vector<std::string>& env, int fd) {
  std::erase_if(env, [](const std::string& entry) { return has_name(entry, env::kListenFd); });
  env.push_back(assign(env::kListenFd, std::to_string(fd)));
}

Cluster static_cluster(const std::string& host, const std::vector<std::uint16_t>& ports,
                       const std::optional<std::string>& algorithm) {
  Cluster cluster;
  cluster.version = 1;
  for (std::size_t rank = 0; rank < ports.size(); ++rank) {
    cluster.workers.push_back(WorkerSpec{Endpoint{host, ports[rank]}, static_cast<int>(rank)});
  }
  if (algorithm) cluster.settings["algorithm"] = *algorithm;
  return cluster;
}

namespace {

std::vector<std::string> environment_for(const JobSpec& job, const WorkerSpec& self,
                                         std::optional<int> rank,
                                         const std::vector<std::string>& base) {
  std::vector<std::string> out;
  out.reserve(base.size() + kManaged.size());
  const bool sets_config_server = job.config_server.has_value();
  std::copy_if(base.begin(), base.end(), std::back_inserter(out),
               [&](const std::string& entry) { return !is_managed(entry, sets_config_server); });
  out.push_back(assign(env::kSelf, self.endpoint.str()));
  if (job.cluster_file) {
    out.push_back(assign(env::kClusterFile, *job.cluster_file));
  } else {
    out.push_back(assign(env::kCluster, job.cluster.to_json().dump()));
  }
  out.push_back(assign(env::kJobId, job.job_id));
  if (job.job_token_file) out.push_back(assign(env::kJobTokenFile, *job.job_token_file));
  if (rank) out.push_back(assign(env::kRank, std::to_string(*rank)));
  out.push_back(assign(env::kSize, std::to_string(job.cluster.size())));
  if (job.algorithm) out.push_back(assign(env::kAlgorithm, *job.algorithm));
  if (job.timeout) out.push_back(assign(env::kTimeoutMs, std::to_string(job.timeout->count())));
  if (job.config_server) out.push_back(assign(env::kConfigServer, *job.config_server));
  if (job.job_file) out.push_back(assign(env::kJobFile, *job.job_file));
  if (job.metrics_port) {
    const long port = *job.metrics_port == 0 ? 0 : static_cast<long>(*job.metrics_port) + self.slot;
    out.push_back(assign(env::kMetricsPort, std::to_string(port <= 65535 ? port : 0)));
  }
  return out;
}

}  // namespace

std::vector<std::string> worker_environment(const JobSpec& job, int rank,
                                            const std::vector<std::string>& base) {
  KF_CHECK(rank >= 0 && rank < job.cluster.size(), "worker_environment: rank out of range");
  return environment_for(job, job.cluster.workers[static_cast<std::size_t>(rank)], rank, base);
}

std::vector<std::string> spare_environment(const JobSpec& job, const WorkerSpec& spare,
                                           const std::vector<std::string>& base) {
  KF_CHECK(job.cluster.is_spare(spare.endpoint), "spare_environment: not a spare of the cluster");
  return environment_for(job, spare, std::nullopt, base);
}

bool fits_environment(const Cluster& cluster) {
  return cluster.to_json().dump().size() <= kMaxClusterEnvBytes;
}

std::string write_cluster_file(const Cluster& cluster, const std::filesystem::path& dir) {
  const auto file = dir / ("cluster-v" + std::to_string(cluster.version) + ".json");
  std::error_code ec;
  if (std::filesystem::exists(file, ec)) return file.string();  // this version's, written before
  const std::string text = cluster.to_json().dump() + "\n";
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.is_open() || !write_all(fd.get(), text)) {
    throw std::system_error(errno, std::generic_category(),
                            "kfrun: cannot write the cluster file " + file.string());
  }
  return file.string();
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    out.emplace_back(*entry);
  }
  return out;
}

std::string random_hex(std::size_t count_bytes) {
  std::vector<unsigned char> bytes(count_bytes);
  if (::RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    throw std::runtime_error("cannot generate random bytes (OpenSSL RAND_bytes failed)");
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * count_bytes);
  for (unsigned char b : bytes) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 0xf]);
  }
  return hex;
}

}  // namespace kf::tools
