// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent_rules.hpp"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <stdexcept>

#include <openssl/evp.h>

#include "kfrun/lib/worker_env.hpp"

namespace kf::tools {

std::vector<int> owned_ranks(const Cluster& cluster, const std::string& host) {
  std::vector<int> ranks;
  for (int rank = 0; rank < cluster.size(); ++rank) {
    if (cluster.workers[static_cast<std::size_t>(rank)].endpoint.host == host) {
      ranks.push_back(rank);
    }
  }
  return ranks;
}

Cluster initial_cluster(const std::string& host, const std::vector<std::uint16_t>& ports,
                        const std::optional<std::string>& algorithm) {
  Cluster cluster = static_cluster(host, ports, algorithm);
  cluster.version = 0;
  return cluster;
}

bool marked_finished(const Cluster& cluster) {
  if (!cluster.settings.is_object()) return false;
  const auto it = cluster.settings.find("finished");
  return it != cluster.settings.end() && it->is_boolean() && it->get<bool>();
}

bool marked_suspended(const Cluster& cluster) {
  if (!cluster.settings.is_object()) return false;
  const auto it = cluster.settings.find("suspended");
  return it != cluster.settings.end() && it->is_boolean() && it->get<bool>();
}

Cluster suspended_cluster(Cluster current) {
  if (!current.settings.is_object()) current.settings = nlohmann::json::object();
  current.settings["suspended"] = true;
  return current;
}

Cluster resumed_cluster(Cluster current, const std::string& host,
                        const std::vector<std::uint16_t>& ports) {
  current.workers.clear();
  current.spares.clear();
  for (std::size_t i = 0; i < ports.size(); ++i) {
    current.workers.push_back(WorkerSpec{Endpoint{host, ports[i]}, static_cast<int>(i)});
  }
  if (current.settings.is_object()) current.settings.erase("suspended");
  return current;
}

std::vector<WorkerSpec> owned_spares(const Cluster& cluster, const std::string& host) {
  std::vector<WorkerSpec> spares;
  std::copy_if(cluster.spares.begin(), cluster.spares.end(), std::back_inserter(spares),
               [&](const WorkerSpec& w) { return w.endpoint.host == host; });
  return spares;
}

bool is_member(const Cluster& cluster, const std::string& worker) {
  const auto named = [&](const WorkerSpec& w) { return w.endpoint.str() == worker; };
  return std::any_of(cluster.workers.begin(), cluster.workers.end(), named) ||
         std::any_of(cluster.spares.begin(), cluster.spares.end(), named);
}

Cluster without_worker(Cluster cluster, const std::string& worker) {
  const auto named = [&](const WorkerSpec& w) { return w.endpoint.str() == worker; };
  std::erase_if(cluster.workers, named);
  std::erase_if(cluster.spares, named);
  return cluster;
}

const char* to_string(Departure::Kind kind) noexcept {
  switch (kind) {
    case Departure::Kind::killed: return "killed";
    case Departure::Kind::revoked: return "revoked";
    case Departure::Kind::removed: return "removed";
    case Departure::Kind::unknown: break;
  }
  return "unknown";
}

std::optional<std::chrono::seconds> parse_notice(std::string_view detail) {
  constexpr std::string_view kNotice = "notice ";
  const auto at = detail.rfind(kNotice);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view rest = detail.substr(at + kNotice.size());
  long long seconds = 0;
  const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), seconds);
  if (ec != std::errc{} || ptr == rest.data() || seconds < 0) return std::nullopt;
  if (ptr == rest.data() + rest.size() || *ptr != 's') return std::nullopt;
  return std::chrono::seconds(seconds);
}

bool is_departure_event(const std::string& type) noexcept {
  return type == "killed" || type == "revoked" || type == "removed" || type == "released";
}

std::optional<Departure> find_departure(const std::vector<ConfigEvent>& events,
                                        const std::string& worker, std::uint64_t after_version) {
  for (auto e = events.rbegin(); e != events.rend(); ++e) {
    if (e->worker != worker || !is_departure_event(e->type)) continue;
    if (e->version && *e->version <= after_version) continue;
    if (e->type == "killed") return Departure{Departure::Kind::killed, std::nullopt};
    if (e->type == "revoked") return Departure{Departure::Kind::revoked, parse_notice(e->detail)};
    return Departure{Departure::Kind::removed, std::nullopt};
  }
  return std::nullopt;
}

std::chrono::milliseconds grace_for(const Departure& departure,
                                    std::chrono::milliseconds leave_grace) {
  if (departure.kind == Departure::Kind::killed) return std::chrono::milliseconds::zero();
  if (departure.notice) return *departure.notice;
  return leave_grace;
}

std::string job_id_for_token(const std::string& token) {
  // A label keeps this hash apart from any other use of the token.
  const std::string message = "kf job id\n" + token;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(message.data(), message.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("cannot hash the job token (OpenSSL EVP_Digest failed)");
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string id = "kf-";
  for (unsigned int i = 0; i < 8 && i < length; ++i) {
    id.push_back(kDigits[digest[i] >> 4]);
    id.push_back(kDigits[digest[i] & 0xf]);
  }
  return id;
}

}  // namespace kf::tools
