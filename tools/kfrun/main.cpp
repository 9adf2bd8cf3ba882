// SPDX-License-Identifier: Apache-2.0
// kfrun: starts the workers of a kf job (docs/kfrun.md).
//   static: kfrun -np N [--host H] [--port-range A-B] [--job-token-file F] [--job-id ID]
//                 [--algorithm A] [--timeout-ms MS] -- PROG ARGS...
//   agent:  kfrun --watch --config-server URL|builtin --slots N [-np K] [--state FILE]
//                 [--leave-grace-ms MS] [--orphans adopt|kill] [--on-sigterm leave|stop]
//                 [--notice-signal SIG] [--grace S] [--notice-file F] [--notice-command CMD]
//                 [the options above] -- PROG ARGS...
// Exit codes, static mode: 0 when every worker succeeded; the first failing worker's code (128 +
// signal when killed by one); 127 when PROG cannot be executed. Watch mode: 0 when the job
// finished and every local worker exited 0 or left, or they left on a notice; 128 + signal when
// stopped by one; 1 when a local worker failed. Both: 2 for a usage error; 1 for other errors.
#include <chrono>
#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kf/runtime/job_file.hpp"
#include "kfrun/lib/agent.hpp"
#include "kfrun/lib/launcher.hpp"
#include "kfrun/lib/ports.hpp"
#include "kfrun/lib/slurm.hpp"

namespace {

constexpr int kUsageError = 2;
constexpr int kRuntimeError = 1;

// mpirun and horovodrun spell the worker count "-np"; CLI11 reads a single dash as a short
// option with its value attached ("-n" "p"), so that spelling is rewritten to "--np" among
// kfrun's own options: before "--" or the first argument that is neither an option of `app`
// nor an option's value (the program). Returns the arguments in the reverse order CLI11 takes.
std::vector<std::string> arguments(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--" || !arg.starts_with("-")) break;
    if (arg == "-np") arg = "--np";
    if (arg.starts_with("-np=")) arg = "--np=" + arg.substr(4);
    const CLI::Option* option = app.get_option_no_throw(arg);
    if (option != nullptr && option->get_expected_min() > 0) ++i;  // skip its value
  }
  return {args.rbegin(), args.rend()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Starts N local workers of a kf job (static mode), or runs as the per-host agent of an "
      "elastic job (--watch): starts and stops local workers to match the cluster held by the "
      "config service.",
      "kfrun"};
  app.footer(
      "Arguments after PROG are passed to it unchanged; \"--\" before PROG is optional.\n"
      "Exit code (static): 0 when every worker succeeds, else the first failing worker's (128 + "
      "signal when killed by one); 127 when PROG cannot be executed. (--watch): 0 when the job "
      "finished and every local worker exited 0 or left, or the workers left on a notice; 128 + "
      "signal when stopped; 1 when a "
      "local worker failed. Both: 2 for a usage error. See docs/kfrun.md.");
  kf::tools::LaunchOptions options;
  kf::tools::AgentOptions agent;
  std::optional<int> np;
  std::string port_range = options.ports.str();
  std::optional<int> timeout_ms;
  std::optional<int> leave_grace_ms;

  app.add_option("-n,--np", np, "number of workers (also -np); with --watch, the initial workers")
      ->check(CLI::Range(1, 65535));
  app.add_option("--host", options.host, "host the workers listen on")->capture_default_str();
  app.add_option("--port-range", port_range, "ports to pick from, A-B")->capture_default_str();
  app.add_option("--job-token-file", options.job_token_file,
                 "file holding the job token (static default: a random token in KF_JOB_TOKEN)");
  app.add_option("--job-id", options.job_id, "job id (default: random; --watch: from the token)");
  app.add_option("--algorithm", options.algorithm, "job default collective algorithm");
  app.add_option("--timeout-ms", timeout_ms, "collective deadline in milliseconds")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  std::optional<std::string> job_path;
  app.add_option("--job", job_path,
                 "a job file (docs/job-file.md): its workers.initial, algorithm, timeouts, ports "
                 "and metrics port are the defaults of -np, --algorithm, --timeout-ms, "
                 "--port-range and --metrics-port; its settings go into the cluster; the workers "
                 "get it as KF_JOB_FILE (policies, plugins, commits, checkpoints)");
  std::optional<int> metrics_port;
  app.add_option("--metrics-port", metrics_port,
                 "workers serve their metrics for Prometheus on this port + their slot "
                 "(KF_METRICS_PORT); 0: each on a port the kernel picks (logged)")
      ->check(CLI::Range(0, 65535));
  std::string bind = "auto";
  auto* bind_option =
      app.add_option("--bind", bind,
                     "auto: hold worker i to core i mod n (n: the cores kfrun may use) when -np "
                     "is more than n; none: never. Not with --watch, whose workers come and go")
          ->check(CLI::IsMember({"auto", "none"}))
          ->capture_default_str();
  bool watch_mode = false;
  auto* watch = app.add_flag("--watch", watch_mode, "run as the per-host agent of an elastic job")
                    ->excludes(bind_option);
  app.add_option("--config-server", agent.config_server,
                 "config service URL: http://HOST:PORT (kf-config-server), "
                 "etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (etcd; etcds:// over TLS), or "
                 "'builtin' to run one in kfrun")
      ->needs(watch);
  app.add_option("--slots", agent.slots, "most workers running at once on this host")->needs(watch);
  app.add_option("--state", agent.state_file, "state file of the builtin config service")
      ->needs(watch);
  app.add_option("--metrics-sd-file", agent.metrics_sd_file,
                 "with --metrics-port above 0: keep this file listing the metrics endpoints of "
                 "this host's workers for Prometheus's file-based discovery (file_sd_configs)")
      ->needs(watch);
  app.add_option("--leave-grace-ms", leave_grace_ms,
                 "how long a worker that left the cluster may run before SIGTERM (default 30000)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->needs(watch);
  std::optional<std::string> orphans;
  app.add_option("--orphans", orphans,
                 "when the agent dies without stopping its workers (kill -9): adopt, they train "
                 "on and a restarted agent takes them over; kill, they get SIGKILL at once "
                 "(default: adopt with an external service, kill with builtin)")
      ->check(CLI::IsMember({"adopt", "kill"}))
      ->needs(watch);
  bool slurm = false;
  app.add_flag("--slurm", slurm,
               "inside a Slurm allocation (one agent per node, started by srun): --slots from "
               "SLURM_GPUS_ON_NODE or SLURM_CPUS_ON_NODE, --host from the route to the config "
               "service, -np the slots with --join, and USR1 and TERM notices (docs/slurm.md)")
      ->needs(watch);
  bool requeue = false;
  app.add_flag("--requeue", requeue,
               "with --slurm: once the workers left on Slurm's signal (a preemption or the time "
               "limit, not SIGTERM), ask Slurm to requeue this allocation (scontrol requeue), so "
               "that it runs again and rejoins the job (docs/slurm.md)")
      ->needs(watch);
  app.add_flag("--join", agent.join,
               "place the -np workers on this host also when the job exists already (unless it "
               "has workers here)")
      ->needs(watch);
  std::string on_sigterm = "leave";
  app.add_option("--on-sigterm", on_sigterm,
                 "leave: SIGTERM is a notice (the workers leave the job with notice, the agent "
                 "exits 0 within --grace); stop: stop the workers at once, as failures")
      ->check(CLI::IsMember({"leave", "stop"}))
      ->capture_default_str()
      ->needs(watch);
  std::vector<std::string> notice_signals;
  app.add_option("--notice-signal", notice_signals,
                 "another signal that is a notice, e.g. USR1 for Slurm's --signal=USR1@N "
                 "(repeatable; the workers start with it ignored)")
      ->expected(1)
      ->needs(watch);
  int grace_s = 30;
  app.add_option("--grace", grace_s,
                 "seconds from a notice until the agent must be gone: what still runs gets "
                 "SIGTERM 2 s before, SIGKILL at the end")
      ->check(CLI::Range(1, 86'400))
      ->capture_default_str()
      ->needs(watch);
  app.add_option("--notice-file", agent.notice.file,
                 "a notice when this file exists (its first line may give the seconds left)")
      ->needs(watch);
  app.add_option("--notice-command", agent.notice.command,
                 "a notice when this shell command exits 0 (its first line of output may give "
                 "the seconds left)")
      ->needs(watch);
  int notice_poll_ms = 1000;
  app.add_option("--notice-poll-ms", notice_poll_ms,
                 "how often --notice-file and --notice-command are looked at")
      ->check(CLI::Range(10, 3'600'000))
      ->capture_default_str()
      ->needs(watch);
  app.add_option("PROG", options.command, "the worker program and its arguments")->required();
  app.positionals_at_end();

  try {
    app.parse(arguments(app, argc, argv));
    if (!watch_mode && !np && !job_path) throw CLI::RequiredError("--np");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  try {
    if (job_path) {
      // Options given on the command line win over the file.
      const kf::JobFile job = kf::load_job_file(*job_path);
      if (!np) np = job.workers.initial;
      if (!options.algorithm) options.algorithm = std::string(kf::to_string(job.algorithm));
      if (!timeout_ms) timeout_ms = static_cast<int>(job.timeouts.collective.count());
      if (app.count("--port-range") == 0) {
        port_range = std::to_string(job.ports.first) + "-" + std::to_string(job.ports.last);
      }
      if (!metrics_port && job.metrics && job.metrics->port > 0) metrics_port = job.metrics->port;
      options.settings = job.to_settings();
      options.job_file = std::filesystem::absolute(*job_path).string();
    }
    options.ports = kf::tools::PortRange::parse(port_range);
    if (timeout_ms) options.timeout = std::chrono::milliseconds(*timeout_ms);
    if (metrics_port) options.metrics_port = static_cast<std::uint16_t>(*metrics_port);
    if (agent.metrics_sd_file && (!metrics_port || *metrics_port == 0)) {
      throw std::invalid_argument(
          "--metrics-sd-file needs --metrics-port above 0 (the targets' ports are it plus the "
          "workers' slots)");
    }
    options.bind = *kf::tools::parse_bind(bind);  // checked by CLI11 above
    if (!watch_mode) {
      options.np = *np;
      return kf::tools::run_static(options);
    }
    agent.host = options.host;
    agent.np = np;
    agent.ports = options.ports;
    agent.job_token_file = options.job_token_file;
    agent.job_id = options.job_id;
    agent.algorithm = options.algorithm;
    agent.timeout = options.timeout;
    agent.metrics_port = options.metrics_port;
    agent.settings = options.settings;
    agent.job_file = options.job_file;
    if (leave_grace_ms) agent.leave_grace = std::chrono::milliseconds(*leave_grace_ms);
    if (orphans) {
      agent.orphans = *orphans == "kill" ? kf::tools::Orphans::kill : kf::tools::Orphans::adopt;
    }
    agent.notice.on_sigterm =
        on_sigterm == "stop" ? kf::tools::OnSigterm::stop : kf::tools::OnSigterm::leave;
    for (const auto& sig : notice_signals) {
      agent.notice.signals.push_back(kf::tools::parse_notice_signal(sig));
    }
    agent.notice.grace = std::chrono::seconds(grace_s);
    agent.notice.poll = std::chrono::milliseconds(notice_poll_ms);
    agent.command = options.command;
    if (slurm) kf::tools::apply_slurm(agent, app.count("--host") > 0, kf::tools::process_env);
    if (requeue && !slurm) throw std::invalid_argument("--requeue needs --slurm");
    if (requeue) kf::tools::apply_slurm_requeue(agent, kf::tools::process_env);
    return kf::tools::run_agent(agent);
  } catch (const kf::JobFileError& e) {
    std::cerr << "kfrun: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::invalid_argument& e) {
    std::cerr << "kfrun: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "kfrun: " << e.what() << "\n";
    return kRuntimeError;
  }
}
