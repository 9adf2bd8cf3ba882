// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent_setup.hpp"

#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "kf/common/env.hpp"
#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/agent_rules.hpp"
#include "kfrun/lib/ports.hpp"

namespace kf::tools {

void check_agent_options(const AgentOptions& options) {
  const auto usage = [](const std::string& what) { return std::invalid_argument(what); };
  if (options.config_server.empty()) {
    throw usage("--watch needs --config-server URL (http://HOST:PORT) or --config-server builtin");
  }
  if (!options.slots) throw usage("--watch needs --slots N (how many workers may run here)");
  if (*options.slots < 1) {
    throw usage("--slots must be at least 1 (got " + std::to_string(*options.slots) + ")");
  }
  const bool builtin = options.config_server == kBuiltin;
  if (builtin && !options.np) {
    throw usage("--config-server builtin needs -np K (the workers of the initial cluster)");
  }
  if (options.np && *options.np < 1) {
    throw usage("-np must be at least 1 (got " + std::to_string(*options.np) + ")");
  }
  if (options.join && !options.np) throw usage("--join needs -np K (the workers to place here)");
  if (options.np && *options.np > *options.slots) {
    throw usage("-np " + std::to_string(*options.np) + " is more than --slots " +
                std::to_string(*options.slots));
  }
  if (!builtin && !options.job_token_file) {
    throw usage("--config-server URL needs --job-token-file F (the job token the agent presents)");
  }
  if (!builtin && options.state_file) {
    throw usage("--state is for --config-server builtin only");
  }
  if (options.command.empty() || options.command.front().empty()) {
    throw usage("no program given: kfrun --watch [options] -- PROG ARGS...");
  }
  if (options.host.empty()) throw usage("--host must not be empty");
  if (options.job_id && options.job_id->empty()) throw usage("--job-id must not be empty");
  if (options.algorithm && options.algorithm->empty()) {
    throw usage("--algorithm must not be empty");
  }
  if (options.timeout && options.timeout->count() <= 0) {
    throw usage("--timeout-ms must be positive");
  }
  if (options.leave_grace.count() < 0) throw usage("--leave-grace-ms must not be negative");
  if (builtin && options.orphans == Orphans::adopt) {
    throw usage(
        "--orphans adopt needs an external config service: the builtin one dies with this agent, "
        "so no agent could adopt its workers (they would train on without a control plane)");
  }
  const NoticeOptions& notice = options.notice;
  if (notice.grace < std::chrono::seconds(1) || notice.grace > std::chrono::hours(24)) {
    throw usage("--grace must be from 1 to 86400 seconds (got " +
                std::to_string(notice.grace.count() / 1000.0) + ")");
  }
  if (notice.poll < std::chrono::milliseconds(10) || notice.poll > std::chrono::hours(1)) {
    throw usage("--notice-poll-ms must be from 10 to 3600000 (got " +
                std::to_string(notice.poll.count()) + ")");
  }
  if (notice.file && notice.file->empty()) throw usage("--notice-file must not be empty");
  if (notice.command && notice.command->empty()) {
    throw usage("--notice-command must not be empty");
  }
  if (!builtin) {
    try {
      ConfigClient::parse_service_url(options.config_server);
    } catch (const std::invalid_argument& e) {
      throw usage(std::string("--config-server: ") + e.what());
    }
  }
}

Orphans orphans_for(const AgentOptions& options) noexcept {
  if (options.orphans) return *options.orphans;
  return options.config_server == kBuiltin ? Orphans::kill : Orphans::adopt;
}

AgentSetup prepare_agent(const AgentOptions& options, FdWriter& err) {
  AgentSetup setup;
  if (options.config_server == kBuiltin) {
    BuiltinServerOptions builtin;
    if (options.state_file) builtin.state_file = *options.state_file;
    if (options.job_token_file) builtin.token_file = *options.job_token_file;
    setup.builtin = std::make_unique<BuiltinServer>(builtin);
    setup.url = setup.builtin->url();
    setup.token = setup.builtin->token();
    setup.job.job_token_file = setup.builtin->token_file().string();
    err.write("kfrun: config server " + setup.url + "\n");
    err.write("kfrun: job token file " + *setup.job.job_token_file + "\n");
  } else {
    setup.url = options.config_server;
    try {
      setup.token = read_token_file(*options.job_token_file);
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(std::string("--job-token-file: ") + e.what());
    }
    // Absolute, so that a worker that changes directory still finds it.
    setup.job.job_token_file = std::filesystem::absolute(*options.job_token_file).string();
  }
  setup.job.job_id = options.job_id.value_or(job_id_for_token(setup.token));
  setup.job.algorithm = options.algorithm;
  setup.job.timeout = options.timeout;
  setup.job.metrics_port = options.metrics_port;
  setup.job.job_file = options.job_file;
  setup.job.config_server = setup.url;
  if (options.np) setup.initial_ports = pick_free_ports(options.host, options.ports, *options.np);
  return setup;
}

}  // namespace kf::tools
