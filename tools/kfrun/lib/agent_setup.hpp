// SPDX-License-Identifier: Apache-2.0
// What kfrun --watch does before its loop (agent.cpp): check the options, start the builtin
// config service when asked to, read the token and make the workers' job (everything that can
// fail for a usage error happens here, before a worker starts). Thread-safety: free functions;
// call from the agent's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kfrun/lib/agent.hpp"
#include "kfrun/lib/builtin_server.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/worker_env.hpp"

namespace kf::tools {

/// --config-server's value that runs the service inside kfrun.
inline constexpr std::string_view kBuiltin = "builtin";

/// Where the agent talks to and what it gives its workers.
struct AgentSetup {
  std::unique_ptr<BuiltinServer> builtin;  ///< with --config-server builtin
  std::string url;                         ///< of the config service
  std::string token;
  JobSpec job;                                              ///< everything but the cluster
  std::optional<std::vector<std::uint16_t>> initial_ports;  ///< picked for -np
};

/// Throws: std::invalid_argument naming the option that is missing or wrong.
void check_agent_options(const AgentOptions& options);

/// --orphans, or its default: kill with the builtin service, adopt with an external one.
Orphans orphans_for(const AgentOptions& options) noexcept;

/// Starts the builtin service (and prints its URL and token file on `err`), reads the token,
/// derives the job and picks the ports of -np. Requires: check_agent_options(options) passed.
/// Throws: std::invalid_argument for an unreadable token file (naming --job-token-file) or too
/// few free ports; what BuiltinServer and pick_free_ports throw.
AgentSetup prepare_agent(const AgentOptions& options, FdWriter& err);

}  // namespace kf::tools
