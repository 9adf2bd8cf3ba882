// SPDX-License-Identifier: Apache-2.0
// kf-member: reads and changes the membership of an elastic kf job through its
// config service.
//   kf-member --server URL [--token-file F] [--timeout-ms MS] COMMAND
//   COMMAND: list | add [--host H] [--count N] [--port-range A-B] | revoke
//   WORKER [--notice S] | notice HOST|WORKER --in S
//            | kill WORKER | resize N [--host H] [--port-range A-B] | watch
//            [--count K] | set KEY=VALUE...
// Mutations compare-and-swap the cluster document (retrying conflicts) and
// record events. Exit codes: 0 on success; 2 for a usage error; 1 for other
// errors (server down, 401, unknown worker, CAS attempts exhausted).
#include <CLI/CLI.hpp>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "kf-member/lib/commands.hpp"
#include "kf/common/env.hpp"
#include "kf/common/host.hpp"
#include "kf/runtime/config_client.hpp"

namespace {

constexpr int kUsageError = 2;
constexpr int kRuntimeError = 1;

void add_placement(CLI::App* cmd, kf::member::AddOptions& add, std::string& range) {
  cmd->add_option("--host", add.host,
                  "host of the new workers: this machine, or another where an agent runs")
      ->capture_default_str()
      ->check([](const std::string& host) {
        const std::string why = kf::host_problem(host);
        return why.empty() ? why : "--host '" + host + "' is " + why;
      });
  cmd->add_option("--port-range", range,
                  "ports to pick from, A-B (test-bound when --host is this machine; otherwise "
                  "unchecked, and the host's agent moves a worker whose port is in use)")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Lists and changes the workers of an elastic kf job through its config service.",
               "kf-member"};
  app.footer(
      "WORKER is a rank or host:port. revoke and kill change the cluster document and record an "
      "event; the host's `kfrun --watch` agent then lets a revoked worker leave (SIGTERM after the "
      "notice) and SIGKILLs a killed one at once (docs/kfrun.md).\nExit code: 0 on success, 2 for "
      "a usage error, 1 for other errors.");
  app.require_subcommand(1);
  std::string server;
  std::string token_file;
  int timeout_ms = 5000;
  app.add_option("--server", server,
                 "config service URL: http://HOST:PORT (kf-config-server) or "
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcds:// over TLS)")
      ->envname(kf::env::kConfigServer)
      ->required();
  app.add_option("--token-file", token_file, "file holding the job token (needed to change)")
      ->envname(kf::env::kJobTokenFile);
  app.add_option("--timeout-ms", timeout_ms, "deadline of each request in milliseconds")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();

  kf::member::AddOptions add_options;
  std::string port_range = add_options.ports.str();
  std::string worker;
  int notice_seconds = 0;
  int resize_to = 0;
  int watch_count = 0;

  app.add_subcommand("list", "print the version and one line per worker: rank host:port slot");
  auto* add = app.add_subcommand("add", "add workers with free ports");
  add_placement(add, add_options, port_range);
  add->add_option("--count", add_options.count_workers, "how many workers to add")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  auto* revoke =
      app.add_subcommand("revoke",
                         "remove WORKER and record a 'revoked' event with the notice (the worker "
                         "leaves at its next step; its agent sends SIGTERM after the notice)");
  revoke->add_option("WORKER", worker, "rank, or host:port ([v6]:port for IPv6)")->required();
  auto* notice =
      revoke->add_option("--notice", notice_seconds, "seconds of notice, recorded in the event")
          ->check(CLI::Range(0, 86'400));
  auto* notice_cmd = app.add_subcommand(
      "notice",
      "TARGET (a host, or a worker) goes away in S seconds: its workers are revoked with that "
      "notice, and a host's agent starts nothing more and ends once they left");
  std::string target;
  int in_seconds = 0;
  notice_cmd->add_option("TARGET", target, "host, rank, or host:port")->required();
  notice_cmd->add_option("--in", in_seconds, "seconds until it goes away")
      ->required()
      ->check(CLI::Range(0, 86'400));
  auto* kill =
      app.add_subcommand("kill",
                         "remove WORKER and record a 'killed' event, for failure drills (its "
                         "agent sends SIGKILL at once)");
  kill->add_option("WORKER", worker, "rank, or host:port ([v6]:port for IPv6)")->required();
  auto* resize = app.add_subcommand("resize", "add or remove workers at the end to reach N");
  resize->add_option("N", resize_to, "the new number of workers (at least 1)")
      ->required()
      ->check(CLI::Range(1, 4096));
  add_placement(resize, add_options, port_range);
  std::vector<std::string> assignments;
  auto* set = app.add_subcommand(
      "set",
      "change cluster settings, e.g. mode=sma:period=4 compression=topk:0.01 lr=0.05 "
      "(every worker applies them at one step boundary)");
  set->add_option("KEY=VALUE", assignments, "settings to change")->required();
  auto* trace = app.add_subcommand(
      "trace",
      "print the job's events and a sample of its steps as a Chrome trace (JSON that Perfetto "
      "and chrome://tracing open), so that a change sits beside the steps it cost");
  std::string trace_output;
  trace->add_option("--output", trace_output, "write it to this file instead of stdout");
  auto* watch = app.add_subcommand("watch", "print each new version until interrupted");
  watch->add_option("--count", watch_count, "stop after this many changes (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  const bool mutates = add->parsed() || revoke->parsed() || notice_cmd->parsed() ||
                       kill->parsed() || resize->parsed() || set->parsed();
  std::optional<kf::ConfigClient> client;
  nlohmann::json settings;
  try {
    if (set->parsed()) settings = kf::member::parse_assignments(assignments);
    add_options.ports = kf::tools::PortRange::parse(port_range);
    kf::ConfigClientOptions options;
    options.deadline = std::chrono::milliseconds(timeout_ms);
    if (mutates && token_file.empty()) {
      throw std::invalid_argument("changing the cluster needs --token-file (or KF_JOB_TOKEN_FILE)");
    }
    if (token_file.empty()) {
      // With etcd the job's keys are under a prefix derived from its token: without either,
      // kf-member would look elsewhere and find no job at all.
      const kf::ServiceUrl url = kf::ConfigClient::parse_service_url(server);
      if (url.kind == kf::ServiceUrl::Kind::etcd && url.prefix.empty()) {
        throw std::invalid_argument(
            "with etcd the job's keys are under a prefix derived from its token: give "
            "--token-file (or KF_JOB_TOKEN_FILE), or the prefix in the URL "
            "(etcd://HOST:PORT/PREFIX)");
      }
    }
    client.emplace(server, token_file.empty() ? "" : kf::read_token_file(token_file), options);
  } catch (const std::invalid_argument& e) {
    std::cerr << "kf-member: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "kf-member: " << e.what() << "\n";
    return kRuntimeError;
  }

  kf::member::CommandContext ctx{*client, std::cout};
  try {
    if (add->parsed()) {
      kf::member::add(ctx, add_options);
    } else if (revoke->parsed()) {
      kf::member::revoke(ctx, worker,
                         notice->count() > 0 ? std::optional<int>(notice_seconds) : std::nullopt);
    } else if (notice_cmd->parsed()) {
      kf::member::notice(ctx, target, in_seconds);
    } else if (kill->parsed()) {
      kf::member::kill(ctx, worker);
    } else if (resize->parsed()) {
      kf::member::resize(ctx, resize_to, add_options);
    } else if (set->parsed()) {
      kf::member::set_settings(ctx, settings);
    } else if (watch->parsed()) {
      kf::member::watch(ctx, watch_count);
    } else if (trace->parsed()) {
      if (trace_output.empty()) {
        kf::member::trace(ctx);
      } else {
        std::ofstream file(trace_output);
        kf::member::CommandContext to_file{*client, file};
        kf::member::trace(to_file);
        file.flush();
        if (!file) throw std::runtime_error("cannot write the trace to " + trace_output);
      }
    } else {
      kf::member::list(ctx);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kf-member: " << e.what() << "\n";
    return kRuntimeError;
  }
}
