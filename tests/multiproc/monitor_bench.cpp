// SPDX-License-Identifier: Apache-2.0
// monitor-bench: what the built-in monitors (GNS + throughput + communication) cost on the step
// time of a synthetic model (synthetic-worker, 10 M float32 parameters by default), for each
// worker count. Jobs with the monitors off (KF_MONITORS=0) and on alternate, RUNS pairs per
// count, and the table gives the median step time of each and their ratio, all from this one
// run (the machine is shared: compare the ratio, not the absolute times).
// Usage: build/tests/multiproc/monitor-bench [--runs N] [--params N] [--steps N] [--np 2,4]
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "support/process.hpp"

namespace {

std::string sibling(const char* argv0, const std::string& rel) {
  const std::string self = argv0;
  return self.substr(0, self.rfind('/') + 1) + rel;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"monitor overhead on a synthetic model's step time", "monitor-bench"};
  int runs = 3, steps = 40;
  std::size_t params = 10'000'000;
  std::vector<int> counts{2, 4};
  app.add_option("--runs", runs, "off/on pairs per worker count")->check(CLI::Range(1, 100));
  app.add_option("--steps", steps, "timed steps per job")->check(CLI::Range(1, 100000));
  app.add_option("--params", params, "float32 parameters")->check(CLI::Range(1, 1 << 30));
  app.add_option("--np", counts, "worker counts")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const std::string kfrun = sibling(argv[0], "../../tools/kfrun/kfrun");
  const std::string worker = sibling(argv[0], "synthetic-worker");
  const std::regex re(R"(median_ms=([0-9.]+))");

  std::printf("%-8s %-6s %-14s %-14s %-8s\n", "workers", "pairs", "off median ms", "on median ms",
              "on/off");
  for (int np : counts) {
    std::vector<double> off, on, ratios;
    for (int r = 0; r < runs; ++r) {
      // Alternate which goes first, so that drift of the machine hits both alike.
      for (int k = 0; k < 2; ++k) {
        const bool monitors = (k == 0) == (r % 2 == 1);
        const auto ran = kf::test::run_shell("KF_MONITORS=" + std::string(monitors ? "1" : "0") +
                                             " " + kfrun + " -np " + std::to_string(np) + " -- " +
                                             worker + " --params " + std::to_string(params) +
                                             " --steps " + std::to_string(steps) + " 2>&1");
        std::smatch m;
        if (ran.exit_code != 0 || !std::regex_search(ran.output, m, re)) {
          std::cerr << "monitor-bench: a job failed:\n" << ran.output << "\n";
          return 1;
        }
        (monitors ? on : off).push_back(std::stod(m[1]));
      }
      ratios.push_back(on.back() / off.back());
    }
    std::printf("%-8d %-6d %-14.2f %-14.2f %-8.3f\n", np, runs, median(off), median(on),
                median(ratios));
    std::fflush(stdout);
  }
  return 0;
}
