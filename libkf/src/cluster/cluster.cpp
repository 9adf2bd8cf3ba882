// SPDX-License-Identifier: Apache-2.0
#include "kf/cluster/cluster.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <stdexcept>

#include "kf/common/host.hpp"

namespace kf {

Endpoint Endpoint::parse(std::string_view s) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    throw std::invalid_argument("endpoint '" + std::string(s) + "' is not host:port");
  }
  unsigned port = 0;
  const auto digits = s.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc{} || ptr != digits.data() + digits.size() || port == 0 || port > 65535) {
    throw std::invalid_argument("endpoint '" + std::string(s) + "' has no valid port (1-65535)");
  }
  auto host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (auto why = host_problem(host); !why.empty()) {
    throw std::invalid_argument("endpoint '" + std::string(s) + "' has " + why);
  }
  return Endpoint{std::string(host), static_cast<std::uint16_t>(port)};
}

std::optional<int> Cluster::rank_of(const Endpoint& self) const noexcept {
  for (std::size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].endpoint == self) return static_cast<int>(i);
  }
  return std::nullopt;
}

bool Cluster::is_spare(const Endpoint& self) const noexcept {
  return std::any_of(spares.begin(), spares.end(),
                     [&](const WorkerSpec& s) { return s.endpoint == self; });
}

namespace {

std::string worker_problem(const std::vector<WorkerSpec>& list, const char* what,
                           std::set<std::string>& seen) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i].endpoint;
    const std::string where = std::string(what) + "[" + std::to_string(i) + "]";
    if (e.host.empty()) return where + ".host is empty";
    if (auto why = host_problem(e.host); !why.empty()) return where + ".host is " + why;
    if (e.port == 0) return where + ".port must be 1-65535";
    if (!seen.insert(e.str()).second) {
      return std::string("duplicate ") + (what[0] == 'w' ? "worker " : "spare ") + e.str();
    }
    if (list[i].slot < 0) return where + ".slot is negative";
  }
  return {};
}

}  // namespace

std::string Cluster::validate() const {
  std::set<std::string> seen;
  if (auto why = worker_problem(workers, "workers", seen); !why.empty()) return why;
  if (auto why = worker_problem(spares, "spares", seen); !why.empty()) return why;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    const auto& a = agents[i];
    if (auto why = host_problem(a.host); !why.empty()) {
      return "agents[" + std::to_string(i) + "].host is " + why;
    }
    if (a.port == 0) return "agents[" + std::to_string(i) + "].port must be 1-65535";
  }
  return {};
}

namespace {

Endpoint endpoint_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + " must be an object");
  for (const auto& [k, v] : j.items()) {
    if (k != "host" && k != "port" && k != "slot") {
      throw std::invalid_argument(where + " has unknown field '" + k + "'");
    }
  }
  if (!j.contains("host") || !j["host"].is_string() || j["host"].get<std::string>().empty()) {
    throw std::invalid_argument(where + ".host must be a non-empty string");
  }
  if (!j.contains("port") || !j["port"].is_number_integer() || j["port"].get<std::int64_t>() < 1 ||
      j["port"].get<std::int64_t>() > 65535) {
    throw std::invalid_argument(where + ".port must be an integer in 1-65535");
  }
  return Endpoint{j["host"].get<std::string>(), static_cast<std::uint16_t>(j["port"].get<int>())};
}

WorkerSpec worker_from_json(const nlohmann::json& w, const std::string& where) {
  WorkerSpec spec{endpoint_from_json(w, where), 0};
  if (w.contains("slot")) {
    if (!w["slot"].is_number_integer() || w["slot"].get<std::int64_t>() < 0 ||
        w["slot"].get<std::int64_t>() > 1'000'000) {
      throw std::invalid_argument(where + ".slot must be an integer in 0-1000000");
    }
    spec.slot = w["slot"].get<int>();
  }
  return spec;
}

}  // namespace

nlohmann::json Cluster::to_json() const {
  nlohmann::json ws = nlohmann::json::array();
  for (const auto& w : workers) {
    ws.push_back({{"host", w.endpoint.host}, {"port", w.endpoint.port}, {"slot", w.slot}});
  }
  nlohmann::json as = nlohmann::json::array();
  for (const auto& a : agents) as.push_back({{"host", a.host}, {"port", a.port}});
  nlohmann::json j = {
      {"version", version}, {"workers", ws}, {"agents", as}, {"settings", settings}};
  if (!spares.empty()) {  // a document without spares reads as it did before spares existed
    nlohmann::json ss = nlohmann::json::array();
    for (const auto& w : spares) {
      ss.push_back({{"host", w.endpoint.host}, {"port", w.endpoint.port}, {"slot", w.slot}});
    }
    j["spares"] = std::move(ss);
  }
  return j;
}

Cluster Cluster::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("cluster must be a JSON object");
  for (const auto& [k, v] : j.items()) {
    if (k != "version" && k != "workers" && k != "spares" && k != "agents" && k != "settings") {
      throw std::invalid_argument("cluster has unknown field '" + k + "'");
    }
  }
  Cluster c;
  if (j.contains("version")) {
    if (!j["version"].is_number_unsigned() &&
        !(j["version"].is_number_integer() && j["version"].get<std::int64_t>() >= 0)) {
      throw std::invalid_argument("cluster.version must be a non-negative integer");
    }
    c.version = j["version"].get<std::uint64_t>();
  }
  if (!j.contains("workers") || !j["workers"].is_array()) {
    throw std::invalid_argument("cluster.workers must be an array");
  }
  for (std::size_t i = 0; i < j["workers"].size(); ++i) {
    c.workers.push_back(worker_from_json(j["workers"][i], "workers[" + std::to_string(i) + "]"));
  }
  if (j.contains("spares")) {
    if (!j["spares"].is_array()) throw std::invalid_argument("cluster.spares must be an array");
    for (std::size_t i = 0; i < j["spares"].size(); ++i) {
      c.spares.push_back(worker_from_json(j["spares"][i], "spares[" + std::to_string(i) + "]"));
    }
  }
  if (j.contains("agents")) {
    if (!j["agents"].is_array()) throw std::invalid_argument("cluster.agents must be an array");
    for (std::size_t i = 0; i < j["agents"].size(); ++i) {
      c.agents.push_back(endpoint_from_json(j["agents"][i], "agents[" + std::to_string(i) + "]"));
    }
  }
  if (j.contains("settings")) {
    if (!j["settings"].is_object())
      throw std::invalid_argument("cluster.settings must be an object");
    c.settings = j["settings"];
  }
  if (auto why = c.validate(); !why.empty()) throw std::invalid_argument(why);
  return c;
}

std::vector<WorkerSpec> promote_spares(Cluster& cluster, std::size_t count,
                                       const std::vector<std::string>& avoid_hosts) {
  std::vector<WorkerSpec> promoted;
  for (auto it = cluster.spares.begin(); it != cluster.spares.end() && promoted.size() < count;) {
    if (std::find(avoid_hosts.begin(), avoid_hosts.end(), it->endpoint.host) != avoid_hosts.end()) {
      ++it;
      continue;
    }
    promoted.push_back(*it);
    cluster.workers.push_back(*it);
    it = cluster.spares.erase(it);
  }
  return promoted;
}

}  // namespace kf
