// SPDX-License-Identifier: Apache-2.0
// cluster-bench: how fast an elastic job across test hosts (3 hosts x 2 workers, the config
// service on host 1; tests/cluster/cluster_job.hpp) notices a host fault and trains on, RUNS
// times each, with p50/p95/max:
//   vanish     host 3 goes silent and its processes die (its link down first, so that no peer
//              hears a connection close: a machine reclaimed without a word): -> the survivors'
//              detection -> their first step at the new size (4 workers)
//   partition  host 1 (with the service) cut off from hosts 2 and 3 (nftables): -> detection on
//              host 1's side -> its first step at the new size (2 workers)
// Times come from the workers' own change records (detected_us, resumed_us) against the moment
// of the fault. Needs root; the executables are taken from the build tree it is in.
// Usage: build/tests/cluster/cluster-bench [--runs N] [--only vanish|partition]
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cluster/cluster_job.hpp"
#include "support/series.hpp"

namespace {

using namespace kf::test;

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The recovery records ("change {...}" lines) in the agents' logs: the earliest detection and
// the latest first step at `to_size`.
bool recovery_times(const std::string& logs, int to_size, std::int64_t& detected,
                    std::int64_t& resumed) {
  detected = 0;
  resumed = 0;
  std::istringstream in(logs);
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("] change ");
    if (at == std::string::npos) continue;
    const auto rec = nlohmann::json::parse(line.substr(at + 9), nullptr, false);
    if (!rec.is_object() || rec.value("kind", "") != "recovery" ||
        rec.value("to_size", 0) != to_size) {
      continue;
    }
    const std::int64_t d = rec.value("detected_us", std::int64_t{0});
    const std::int64_t r = rec.value("resumed_us", std::int64_t{0});
    if (d > 0 && (detected == 0 || d < detected)) detected = d;
    resumed = std::max(resumed, r);
  }
  return detected > 0 && resumed > 0;
}

bool run_fault(const std::string& kind, int run, std::map<std::string, Series>& out) {
  const Hosts hosts((kind == "vanish" ? "cv" : "cp") + std::to_string(run % 100), 3);
  if (!hosts.error().empty()) {
    std::cerr << "cluster-bench: no test hosts: " << hosts.error() << "\n";
    return false;
  }
  ClusterJob job(hosts, "bench-" + kind + std::to_string(run), 3);
  job.grow_to_two_per_host();
  if (::testing::Test::HasFailure()) return false;
  const std::int64_t t0 = now_us();
  int to_size = 0;
  if (kind == "vanish") {
    hosts.link(3, false);
    hosts.vanish(3);
    to_size = 4;
  } else {
    if (hosts.partition("1", "2 3").exit_code != 0) return false;
    to_size = 2;
  }
  if (!job.wait_size(to_size)) {
    std::cerr << job.logs();
    return false;
  }
  // The first step at the new size has happened once the size is reported; read the records
  // once the job has gone a little further (each worker prints its record after that step).
  job.wait_progress(job.progress() + 5);
  std::int64_t detected = 0, resumed = 0;
  if (!recovery_times(job.logs(), to_size, detected, resumed)) return false;
  out[kind + ": fault -> detected"].add(static_cast<double>(detected - t0) / 1000.0);
  out[kind + ": detected -> first step at new size"].add(static_cast<double>(resumed - detected) /
                                                         1000.0);
  out[kind + ": fault -> first step at new size"].add(static_cast<double>(resumed - t0) / 1000.0);
  if (kind == "partition") hosts.heal();
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"times host faults of an elastic job across test hosts", "cluster-bench"};
  int runs = 10;
  std::string only;
  app.add_option("--runs", runs)->check(CLI::Range(1, 1000));
  app.add_option("--only", only, "vanish or partition")
      ->check(CLI::IsMember({"vanish", "partition"}));
  CLI11_PARSE(app, argc, argv);
  kf::test::use_build_tree_executables();
  if (std::getenv("KF_CLUSTER_HOSTS") == nullptr) {
    std::cerr << "cluster-bench: set KF_CLUSTER_HOSTS to tests/cluster/hosts\n";
    return 2;
  }
  // The side cut off from the service stops soon, so that runs do not wait on it.
  ::setenv("KF_SERVICE_TIMEOUT_MS", "3000", 0);
  std::map<std::string, Series> out;
  int failed = 0;
  for (int i = 0; i < runs; ++i) {
    for (const std::string kind : {"vanish", "partition"}) {
      if (!only.empty() && kind != only) continue;
      failed += !run_fault(kind, i, out);
    }
    std::cerr << "run " << i + 1 << "/" << runs << " done\n";
  }
  std::cout << "cluster-bench: " << runs << " runs, 3 hosts x 2 workers, heartbeat timeout "
            << (std::getenv("KF_HEARTBEAT_MS") ? std::getenv("KF_HEARTBEAT_MS") : "750") << " ms, "
            << failed << " failed runs\n";
  for (const auto& [name, s] : out) std::printf("%-44s %s ms\n", name.c_str(), s.str().c_str());
  return failed == 0 ? 0 : 1;
}
