// SPDX-License-Identifier: Apache-2.0
// kfrun: starts the workers of a kf job. Static mode (this file's only mode so far):
//   kfrun -np N [--host H] [--port-range A-B] [--job-token-file F] [--job-id ID]
//         [--algorithm A] [--timeout-ms MS] -- PROG ARGS...
// Exit codes: 0 when every worker succeeded; the first failing worker's code (128 + signal when
// killed by one); 127 when PROG cannot be executed; 2 for a usage error; 1 for other errors.
#include <chrono>
#include <exception>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kfrun/lib/launcher.hpp"
#include "kfrun/lib/ports.hpp"

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
      "Starts N local workers of a kf job, tags each output line with the worker's rank, "
      "and stops the job when a worker fails.",
      "kfrun"};
  app.footer(
      "Arguments after PROG are passed to it unchanged; \"--\" before PROG is optional.\n"
      "Exit code: 0 when every worker succeeds, else the first failing worker's (128 + signal "
      "when killed by one); 127 when PROG cannot be executed; 2 for a usage error.");
  kf::tools::LaunchOptions options;
  std::string port_range = options.ports.str();
  std::optional<std::string> token_file;
  std::optional<std::string> job_id;
  std::optional<std::string> algorithm;
  std::optional<int> timeout_ms;

  app.add_option("-n,--np", options.np, "number of workers (also -np)")
      ->required()
      ->check(CLI::Range(1, 65535));
  app.add_option("--host", options.host, "host the workers listen on")->capture_default_str();
  app.add_option("--port-range", port_range, "ports to pick from, A-B")->capture_default_str();
  app.add_option("--job-token-file", token_file,
                 "file holding the job token (default: a random token in KF_JOB_TOKEN)");
  app.add_option("--job-id", job_id, "job id (default: random)");
  app.add_option("--algorithm", algorithm, "job default collective algorithm");
  app.add_option("--timeout-ms", timeout_ms, "collective deadline in milliseconds")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("PROG", options.command, "the worker program and its arguments")->required();
  app.positionals_at_end();

  try {
    app.parse(arguments(app, argc, argv));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  try {
    options.ports = kf::tools::PortRange::parse(port_range);
    options.job_token_file = token_file;
    options.job_id = job_id;
    options.algorithm = algorithm;
    if (timeout_ms) options.timeout = std::chrono::milliseconds(*timeout_ms);
    return kf::tools::run_static(options);
  } catch (const std::invalid_argument& e) {
    std::cerr << "kfrun: " << e.what() << "\n";
    return kUsageError;
  } catch (const std::exception& e) {
    std::cerr << "kfrun: " << e.what() << "\n";
    return kRuntimeError;
  }
}
