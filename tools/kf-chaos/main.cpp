// SPDX-License-Identifier: Apache-2.0
// kf-chaos: random membership churn against a live elastic job on this host, then a check of
// the elastic guarantees (docs/chaos.md). Argument parsing only; the work is in lib/.
//   kf-chaos [--seed N] [-np N] [--min-workers A] [--max-workers B] [--events N]
//            [--interval-ms A-B] [--stop-ms A-B] [--notice-s S] [--kinds LIST]
//            [--finish-with KEY=VALUE] [--finish-timeout-s S] [--dir D] -- PROG ARGS...
// Exit codes: 0 every guarantee held; 1 one broke, the job hung or failed, or it could not be
// started; 2 a usage error.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kf-chaos/lib/chaos.hpp"
#include "kf-chaos/lib/job.hpp"

namespace {

constexpr int kUsageError = 2;

}  // namespace

int main(int argc, char** argv) {
  kf::chaos::Options o;
  o.seed = std::random_device{}();
  o.kfrun = kf::chaos::default_tool("kfrun");
  o.config_server = kf::chaos::default_tool("kf-config-server");
  CLI::App app{
      "Throws random membership churn at an elastic job on this host (workers added, revoked, "
      "killed, stopped; the config service and the agent restarted), lets it finish and checks "
      "the elastic guarantees from what its workers print."};
  std::string interval = "500-2000", stop = "200-2000", kinds;
  int finish_timeout_s = 120;
  std::string dir;
  app.add_option("--seed", o.seed, "seed of the events (default: random, printed)");
  app.add_option("-n,--np", o.np, "initial workers")->capture_default_str();
  app.add_option("--min-workers", o.min_workers, "no event leaves fewer running workers")
      ->capture_default_str();
  app.add_option("--max-workers", o.max_workers, "no event makes more members (and kfrun's slots)")
      ->capture_default_str();
  app.add_option("--events", o.events, "number of events")->capture_default_str();
  app.add_option("--interval-ms", interval, "time between events, A-B milliseconds")
      ->capture_default_str();
  app.add_option("--stop-ms", stop, "how long SIGSTOP lasts, A-B milliseconds")
      ->capture_default_str();
  app.add_option("--notice-s", o.notice_s, "the notice of a revoke, seconds")
      ->capture_default_str();
  app.add_option("--kinds", kinds,
                 "events to draw from (default all): add, revoke, kill, stop, server-restart, "
                 "agent-restart");
  app.add_option("--finish-with", o.finish_with,
                 "after the last event, write this setting into the cluster document "
                 "(KEY=VALUE) so that the program ends (the test worker: epochs=1)");
  app.add_option("--finish-timeout-s", finish_timeout_s,
                 "the job must have finished this long after the last event (else: a hang)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "work directory (default: a private temporary one)");
  app.add_option("--kfrun", o.kfrun, "the kfrun executable")->capture_default_str();
  app.add_option("--config-server-exe", o.config_server, "the kf-config-server executable")
      ->capture_default_str();
  app.add_option("PROG", o.command, "the worker program and its arguments")->required();
  app.positionals_at_end();
  // "-np N", as kfrun takes it (CLI11 would read "-n p"), before the program's own arguments.
  std::vector<std::string> args;
  bool program = false;
  for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);  // CLI11 wants them reversed
  for (auto it = args.rbegin(); it != args.rend(); ++it) {
    if (*it == "--") program = true;
    if (!program && *it == "-np") *it = "--np";
  }
  try {
    app.parse(args);
    o.interval = kf::chaos::MsRange::parse(interval, "--interval-ms");
    o.stop = kf::chaos::MsRange::parse(stop, "--stop-ms");
    if (!kinds.empty()) o.kinds = kf::chaos::parse_kinds(kinds);
    o.finish_timeout = std::chrono::seconds(finish_timeout_s);
    if (!dir.empty()) o.dir = dir;
    kf::chaos::check(o);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    std::cerr << "kf-chaos: " << e.what() << "\n";
    return kUsageError;
  }
  try {
    return kf::chaos::run(o, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "kf-chaos: " << e.what() << "\n";
    return 1;
  }
}
