// SPDX-License-Identifier: Apache-2.0
// synthetic-worker: a data-parallel training step of a synthetic model with --params float32
// parameters, under kf::Session (started by kfrun; a static job). Each step computes a gradient
// (one pass over the parameters: a per-worker pattern that depends on the step and on the
// weights), averages it with Session::allreduce_gradients, and applies SGD. With the monitors on
// (the default; KF_MONITORS=0 turns them off) the session takes the gradient norms, feeds the GNS
// and throughput monitors and carries their words in the control collective; off, it only
// averages. Used by monitor-bench to measure what the monitors cost.
// Rank 0 prints one line at the end:
//   "synthetic workers=K params=N monitors=on|off steps=S median_ms=.. mean_ms=.. b_simple=.."
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <vector>

#include <CLI/CLI.hpp>

#include "kf/runtime/session.hpp"

int main(int argc, char** argv) {
  CLI::App app{"synthetic data-parallel training steps under kf::Session", "synthetic-worker"};
  std::size_t params = 10'000'000;
  int steps = 60, warmup = 5, batch = 32;
  app.add_option("--params", params, "float32 parameters")->check(CLI::Range(1, 1 << 30));
  app.add_option("--steps", steps, "timed steps")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1000000));
  app.add_option("--batch", batch, "samples per worker per step")->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  try {
    kf::State state;
    std::vector<float> w(params, 0.0f), g(params), pattern(params);
    state.add("w", kf::buffer(w.data(), w.size()));
    auto session = kf::Session::from_environment(state);
    if (!session->join()) return 0;
    const int rank = session->rank();
    for (std::size_t i = 0; i < params; ++i) {
      // A fixed "signal" plus a per-worker "noise" pattern.
      pattern[i] =
          0.01f + 0.05f * static_cast<float>(((i * 2654435761u + rank * 40503u) % 1000)) / 1000.0f -
          0.025f;
    }
    std::vector<double> ms;
    for (int s = 0; s < warmup + steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const float phase = 1.0f + 0.001f * static_cast<float>(s % 7);
      session->step([&] {
        for (std::size_t i = 0; i < params; ++i) g[i] = pattern[i] * phase + 1e-4f * w[i];
        session->allreduce_gradients(g, batch);
        for (std::size_t i = 0; i < params; ++i) w[i] -= 0.01f * g[i];
      });
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) ms.push_back(t);
    }
    if (rank == 0) {
      const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
      std::sort(ms.begin(), ms.end());
      const auto& m = session->metrics();
      std::printf(
          "synthetic workers=%d params=%zu monitors=%s steps=%d median_ms=%.3f "
          "mean_ms=%.3f b_simple=%g\n",
          session->size(), params, m.count("gns.skipped") ? "on" : "off", steps, ms[ms.size() / 2],
          mean, m.count("gns.b_simple") ? m.at("gns.b_simple") : -1.0);
    }
  } catch (const std::exception& e) {
    std::cerr << "synthetic-worker: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
