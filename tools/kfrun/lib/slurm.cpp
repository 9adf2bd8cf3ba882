// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/slurm.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <stdexcept>

#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/agent_setup.hpp"
#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

namespace {

// A positive integer Slurm variable; SLURM_GPUS_ON_NODE may also be 0. Slurm writes some counts
// as "2(x3)" for several nodes; the agent's own node has one plain count.
std::optional<int> slurm_count(const EnvLookup& env, const char* name, int least) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  int value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc{} || end != text->data() + text->size() || value < least) {
    throw std::invalid_argument("--slurm: " + std::string(name) + "='" + *text +
                                "' is not a count of at least " + std::to_string(least));
  }
  return value;
}

}  // namespace

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string local_address_towards(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int r = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); r != 0) {
    throw std::invalid_argument("--slurm: the config service's host '" + host +
                                "' does not resolve: " + ::gai_strerror(r));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, ::freeaddrinfo);
  UniqueFd fd(::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.is_open() || ::connect(fd.get(), found->ai_addr, found->ai_addrlen) != 0) {
    throw std::invalid_argument("--slurm: no route from this node to the config service's host '" +
                                host + "': " + std::strerror(errno) + " (give --host)");
  }
  sockaddr_storage local{};
  socklen_t size = sizeof local;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &size) != 0) {
    throw std::invalid_argument(std::string("--slurm: getsockname: ") + std::strerror(errno));
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* address =
      local.ss_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  if (::inet_ntop(local.ss_family, address, text, sizeof text) == nullptr) {
    throw std::invalid_argument(std::string("--slurm: inet_ntop: ") + std::strerror(errno));
  }
  return text;
}

void apply_slurm(AgentOptions& options, bool host_given, const EnvLookup& env) {
  if (!env("SLURM_JOB_ID")) {
    throw std::invalid_argument(
        "--slurm: not inside a Slurm allocation (SLURM_JOB_ID is not set); start the agents with "
        "srun, one per node");
  }
  if (options.config_server == kBuiltin) {
    throw std::invalid_argument(
        "--slurm needs a config service every node reaches (--config-server http://HOST:PORT or "
        "etcd://...), not builtin");
  }
  if (!options.slots) {
    const auto gpus = slurm_count(env, "SLURM_GPUS_ON_NODE", 0);
    if (gpus && *gpus > 0) {
      options.slots = *gpus;
    } else if (const auto cpus = slurm_count(env, "SLURM_CPUS_ON_NODE", 1)) {
      options.slots = *cpus;
    } else {
      throw std::invalid_argument(
          "--slurm: neither SLURM_GPUS_ON_NODE nor SLURM_CPUS_ON_NODE is set; give --slots");
    }
  }
  if (!host_given) {
    const ServiceUrl url = ConfigClient::parse_service_url(options.config_server);
    const Endpoint& service = url.endpoints.at(0);
    options.host = local_address_towards(service.host, service.port);
  }
  if (!options.np) options.np = options.slots;
  options.join = true;
  // Slurm's preemption signal, and the SIGTERM that scancel and a time limit send to every
  // process of the step: both notices, and both ignored by the workers.
  if (options.notice.signals.empty()) options.notice.signals = {SIGUSR1, SIGTERM};
}

void apply_slurm_requeue(AgentOptions& options, const EnvLookup& env) {
  const auto id = env("SLURM_JOB_ID");
  // It goes on a command line: nothing but a job id.
  if (!id || !std::regex_match(*id, std::regex(R"(\d{1,20}(_\d{1,10})?)"))) {
    throw std::invalid_argument("--requeue: SLURM_JOB_ID '" + id.value_or("") +
                                "' is not a Slurm job id");
  }
  options.requeue_job = *id;
}

}  // namespace kf::tools
