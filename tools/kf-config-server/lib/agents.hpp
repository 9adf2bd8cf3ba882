// SPDX-License-Identifier: Apache-2.0
// The agents a kf-config-server knows to be alive, each with the slots it offers, under a lease
// that the agent renews (PUT /v1/agents) and that runs out by itself when it stops renewing
// (docs/config-server.md, "Agents"). Leases are kept in memory only: after a restart of the
// service the agents are listed again at their next renewal.
// Thread-safety: none; the service calls it from its I/O thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace kf::config_server {

class AgentTable {
 public:
  using Clock = std::chrono::system_clock;
  static constexpr std::int64_t kMaxSlots = 4096;
  static constexpr std::chrono::milliseconds kMinTtl{100}, kMaxTtl{600'000};

  /// Reads the body of PUT /v1/agents ({"host": H, "slots": N, "ttl_ms": T}) and lists H as
  /// alive until now + T, offering N slots; a renewal keeps its `since`. T = 0 ends H's lease
  /// (slots may then be left out). Returns the reason when the body is not valid (nothing
  /// changes then), or "".
  std::string put(const nlohmann::json& body, Clock::time_point now);
  /// {"agents": [{"host", "slots", "since", "renewed"}, ...]}: the agents alive at `now`, by
  /// host (`renewed`: their last announcement or renewal, their heartbeat).
  /// Forgets the expired ones.
  nlohmann::json live(Clock::time_point now);

 private:
  struct Lease {
    std::int64_t slots = 0;
    Clock::time_point since, expires;
    Clock::time_point renewed;  // the last announcement or renewal
  };
  std::map<std::string, Lease> leases_;
};

/// Why `host` cannot name an agent (empty, over 253 characters, or a character that no host
/// name or address has), or "".
std::string check_agent_host(const std::string& host);

}  // namespace kf::config_server
