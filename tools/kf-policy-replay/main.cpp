// SPDX-License-Identifier: Apache-2.0
// kf-policy-replay: runs a job file's policies offline over a recording of policy runs
// (PolicyRunner::record_to: one JSON line per hook call with its inputs and the proposal made
// live) and prints every decision with the step and the inputs that caused it, so that a policy
// can be tested without a cluster.
//   kf-policy-replay --job JOB.yaml RECORD.jsonl [--check] [--all]
// --check compares each replayed proposal with the recorded one and fails on a difference.
// Exit codes: 0 success; 1 a run error, a bad record line, or (with --check) a difference;
// 2 a usage error (bad options, an invalid job file, an unknown policy or a bad parameter).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kf/common/json.hpp"
#include "kf/policies/builtin.hpp"
#include "kf/policies/policy.hpp"
#include "kf/runtime/job_file.hpp"
#include "kf/runtime/policy_runner.hpp"

namespace {

constexpr int kRuntimeError = 1;
constexpr int kUsageError = 2;

std::string brief(const kf::PolicyInputs& in) {
  std::string s = "workers=" + std::to_string(in.workers) + " v" + std::to_string(in.version) +
                  " settings=" + in.settings.dump();
  if (!in.metrics.empty()) s += " metrics=" + nlohmann::json(in.metrics).dump();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Runs a job file's policies over a recording of policy runs and prints each "
      "decision with the step and the inputs that caused it.",
      "kf-policy-replay"};
  std::string job_path, record_path;
  bool check = false, all = false;
  app.add_option("--job", job_path, "the job file naming the policies and plugins")->required();
  app.add_option("RECORD", record_path, "JSON lines written by PolicyRunner::record_to")
      ->required();
  app.add_flag("--check", check, "fail when a replayed proposal differs from the recorded one");
  app.add_flag("--all", all, "print every run, also those that propose nothing");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;
  }

  kf::PolicyRunner runner;
  try {
    const kf::JobFile job = kf::load_job_file(job_path);
    kf::PolicyRegistry registry;
    kf::register_builtin_policies(registry);
    for (const auto& plugin : job.plugins) registry.load_plugin(plugin);
    for (const auto& spec : job.policies) {
      try {
        runner.add(registry.make(spec.name, spec.params));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(job_path + ":" + std::to_string(spec.line) + ": " + e.what());
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "kf-policy-replay: " << e.what() << "\n";
    return kUsageError;
  }

  std::ifstream in(record_path);
  if (!in) {
    std::cerr << "kf-policy-replay: cannot read '" << record_path << "'\n";
    return kRuntimeError;
  }
  int line_no = 0, runs = 0, decisions = 0, differences = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    kf::PolicyHook hook;
    kf::PolicyInputs inputs;
    nlohmann::json recorded;
    try {
      const auto j = kf::parse_json(line);
      hook = kf::parse_policy_hook(j.at("hook").get<std::string>());
      inputs = kf::PolicyInputs::from_json(j.at("inputs"));
      recorded = j.value("proposal", nlohmann::json());
    } catch (const std::exception& e) {
      std::cerr << "kf-policy-replay: " << record_path << ":" << line_no << ": " << e.what()
                << "\n";
      return kRuntimeError;
    }
    const kf::Proposal p = runner.run(hook, inputs);
    ++runs;
    const nlohmann::json replayed = p.to_json();
    if (!p.empty()) ++decisions;
    if (!p.empty() || all) {
      std::cout << "step " << inputs.step << " " << kf::to_string(hook) << ": "
                << (p.empty() ? std::string("no change") : replayed.dump()) << "  <- "
                << brief(inputs) << "\n";
    }
    if (check && !recorded.is_null() && recorded != replayed) {
      ++differences;
      std::cout << "DIFFERENCE at " << record_path << ":" << line_no << ": recorded "
                << recorded.dump() << ", replayed " << replayed.dump() << "\n";
    }
  }
  for (const auto& d : runner.disabled()) std::cout << "disabled: " << d << "\n";
  std::cout << runs << " runs, " << decisions << " decisions";
  if (check) std::cout << ", " << differences << " differences from the recording";
  std::cout << std::endl;
  return differences == 0 ? 0 : kRuntimeError;
}
