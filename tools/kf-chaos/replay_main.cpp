// SPDX-License-Identifier: Apache-2.0
// kf-replay: an availability trace replayed against an elastic job on this host, and the
// throughput it retained (docs/chaos.md, "kf-replay"). Argument parsing only; the work is in
// lib/.
//   kf-replay --trace FILE [--speed X] [--max-workers N] [--notice-s S] [--kill-fraction F]
//             [--seed N] [--settle-ms MS] [--calibrate-ms MS] [--tail-ms MS]
//             [--metrics-every N] [--finish-with KEY=VALUE] [--finish-timeout-s S] [--dir D]
//             [--slurm-nodes N1,N2,... [--slurm-partition P] [--preempt-partition P]
//              [--slurm-signal-s S] --listen ADDR] -- PROG ARGS...
// Exit codes: 0 the job kept its guarantees; 1 it did not, hung or failed, or could not be
// started; 2 a usage error or a trace that cannot be used.
#include <iostream>
#include <random>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "kf-chaos/lib/job.hpp"
#include "kf-chaos/lib/replay.hpp"
#include "kf-chaos/lib/trace.hpp"

int main(int argc, char** argv) {
  constexpr int kUsageError = 2;
  kf::chaos::ReplayOptions o;
  o.seed = std::random_device{}();
  o.kfrun = kf::chaos::default_tool("kfrun");
  o.config_server = kf::chaos::default_tool("kf-config-server");
  CLI::App app{
      "Replays an availability trace (CSV rows t_ms,add|remove,node) against an elastic job on "
      "this host, and reports the throughput it retained."};
  std::string trace;
  int settle_ms = 1000, calibrate_ms = 3000, tail_ms = 2000, finish_timeout_s = 120;
  std::string dir;
  app.add_option("--trace", trace, "the trace (CSV: t_ms,add|remove,node)")->required();
  app.add_option("--speed", o.speed, "trace time per replay time")->capture_default_str();
  app.add_option("--max-workers", o.max_workers,
                 "the most nodes the trace ever has up become this many workers")
      ->capture_default_str();
  app.add_option("--notice-s", o.notice_s, "the notice of a revoke, seconds")
      ->capture_default_str();
  app.add_option("--kill-fraction", o.kill_fraction,
                 "this share of the removals are kill -9 instead of a revoke")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the draws (victims, kills; default: random)");
  app.add_option("--settle-ms", settle_ms, "after a resize, before measuring")
      ->capture_default_str();
  app.add_option("--calibrate-ms", calibrate_ms, "how long each size's throughput is measured")
      ->capture_default_str();
  app.add_option("--tail-ms", tail_ms, "replay time after the trace's last row")
      ->capture_default_str();
  app.add_option("--metrics-every", o.metrics_every, "KF_METRICS_EVERY for the job")
      ->capture_default_str();
  app.add_option("--finish-with", o.finish_with,
                 "after the replay, write this setting (KEY=VALUE) so that the program ends");
  app.add_option("--finish-timeout-s", finish_timeout_s,
                 "longer than this after the replay: a hang")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "work directory (default: a private temporary one)");
  app.add_option("--kfrun", o.kfrun, "the kfrun executable")->capture_default_str();
  app.add_option("--config-server-exe", o.config_server, "the kf-config-server executable")
      ->capture_default_str();
  std::string slurm_nodes;
  kf::chaos::SlurmOptions slurm;
  app.add_option(
      "--slurm-nodes", slurm_nodes,
      "through Slurm: each worker an allocation of one of these nodes (comma-separated), "
      "removals preemptions");
  app.add_option("--slurm-partition", slurm.partition,
                 "the workers' partition (default: Slurm's default)");
  app.add_option("--preempt-partition", slurm.preempt_partition,
                 "a partition whose jobs preempt the workers' (a removal submits one)");
  app.add_option("--slurm-signal-s", slurm.signal_s, "the allocations' --signal=USR1@S")
      ->capture_default_str();
  app.add_option("--listen", o.listen,
                 "the config service's address; through Slurm, one the nodes can reach")
      ->capture_default_str();
  app.add_option("PROG", o.command, "the worker program and its arguments")->required();
  app.positionals_at_end();
  try {
    app.parse(argc, argv);
    o.trace = trace;
    if (settle_ms < 0 || calibrate_ms < 0 || tail_ms < 0) {
      throw std::invalid_argument("--settle-ms, --calibrate-ms and --tail-ms must not be negative");
    }
    o.settle = std::chrono::milliseconds(settle_ms);
    o.calibrate = std::chrono::milliseconds(calibrate_ms);
    o.tail = std::chrono::milliseconds(tail_ms);
    o.finish_timeout = std::chrono::seconds(finish_timeout_s);
    if (!dir.empty()) o.dir = dir;
    if (!slurm_nodes.empty()) {
      std::stringstream list(slurm_nodes);
      for (std::string n; std::getline(list, n, ',');) {
        if (n.empty()) throw std::invalid_argument("--slurm-nodes: an empty node name");
        slurm.nodes.push_back(n);
      }
      o.slurm = slurm;
    } else if (app.count("--slurm-partition") + app.count("--preempt-partition") +
                   app.count("--slurm-signal-s") >
               0) {
      throw std::invalid_argument(
          "--slurm-partition, --preempt-partition and --slurm-signal-s "
          "need --slurm-nodes");
    }
    kf::chaos::check(o);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    std::cerr << "kf-replay: " << e.what() << "\n";
    return kUsageError;
  }
  try {
    return kf::chaos::replay(o, std::cout);
  } catch (const kf::chaos::TraceError& e) {
    std::cerr << "kf-replay: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "kf-replay: " << e.what() << "\n";
    return 1;
  }
}
