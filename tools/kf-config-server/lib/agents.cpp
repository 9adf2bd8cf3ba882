// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/agents.hpp"

#include <cctype>

#include "kf-config-server/lib/state.hpp"

namespace kf::config_server {

using nlohmann::json;

std::string check_agent_host(const std::string& host) {
  if (host.empty()) return "the agent's host is empty";
  if (host.size() > 253) return "the agent's host is over 253 characters";
  for (const char c : host) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '.' && c != '-' && c != '_' && c != ':' && c != '[' && c != ']' &&
        c != '%') {
      return "the agent's host holds a character no host name or address has";
    }
  }
  return {};
}

std::string AgentTable::put(const json& body, Clock::time_point now) {
  if (!body.is_object()) {
    return "body must be a JSON object {\"host\": H, \"slots\": N, \"ttl_ms\": T}";
  }
  for (const auto& [k, v] : body.items()) {
    if (k != "host" && k != "slots" && k != "ttl_ms") return "unknown field '" + k + "'";
  }
  const auto host = body.find("host");
  if (host == body.end() || !host->is_string()) return "host must be a string";
  if (auto why = check_agent_host(host->get<std::string>()); !why.empty()) return why;
  const auto ttl = body.find("ttl_ms");
  if (ttl == body.end() || !ttl->is_number_integer() ||
      (ttl->get<std::int64_t>() != 0 && (ttl->get<std::int64_t>() < kMinTtl.count() ||
                                         ttl->get<std::int64_t>() > kMaxTtl.count()))) {
    return "ttl_ms must be 0 (the agent retires) or an integer from " +
           std::to_string(kMinTtl.count()) + " to " + std::to_string(kMaxTtl.count());
  }
  const std::string name = host->get<std::string>();
  if (ttl->get<std::int64_t>() == 0) {
    leases_.erase(name);
    return {};
  }
  const auto slots = body.find("slots");
  if (slots == body.end() || !slots->is_number_integer() || slots->get<std::int64_t>() < 1 ||
      slots->get<std::int64_t>() > kMaxSlots) {
    return "slots must be an integer from 1 to " + std::to_string(kMaxSlots);
  }
  auto it = leases_.find(name);
  if (it == leases_.end() || it->second.expires <= now) {
    it = leases_.insert_or_assign(name, Lease{0, now, now}).first;
  }
  it->second.slots = slots->get<std::int64_t>();
  it->second.expires = now + std::chrono::milliseconds(ttl->get<std::int64_t>());
  it->second.renewed = now;
  return {};
}

json AgentTable::live(Clock::time_point now) {
  std::erase_if(leases_, [&](const auto& e) { return e.second.expires <= now; });
  json agents = json::array();
  for (const auto& [host, lease] : leases_) {
    agents.push_back({{"host", host},
                      {"slots", lease.slots},
                      {"since", format_rfc3339_ms(lease.since)},
                      {"renewed", format_rfc3339_ms(lease.renewed)}});
  }
  return json{{"agents", agents}};
}

}  // namespace kf::config_server
