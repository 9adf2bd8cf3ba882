// SPDX-License-Identifier: Apache-2.0
// kf::Session in one process (ranks as threads, no config service: a static job), so that the
// sanitizer builds run it: forming a job from rank 0's state, committing at every boundary,
// ChangeRecord and the membership check, and a lost peer in a static job being reported.
// The elastic paths (joins, revoke, kill -9, a config service) are tested across processes in
// tests/multiproc/elastic_test.cpp.
#include "kf/runtime/session.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <unistd.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "kf/common/error.hpp"
#include "kf/runtime/parameter_server.hpp"
#include "kf/runtime/piece_sampler.hpp"
#include "kf/runtime/training_mode.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

using Job = test::UnstartedJob;

Job make_job(int n) { return test::make_unstarted_job(n, "session-test"); }

TEST(Session, StaticJobFormsFromRankZeroAndCommitsEveryStep) {
  constexpr int n = 3, steps = 25;
  Job job = make_job(n);
  std::vector<std::vector<double>> w(n);
  std::vector<std::int64_t> commits(n), final_step(n);
  std::vector<std::size_t> records(n);
  test::run_all(n, [&](int r) {
    State state;
    w[r].assign(8, static_cast<double>(r + 1));  // different on every rank before join()
    state.add("w", buffer(w[r].data(), w[r].size()));
    std::int64_t& step = state.counter("step");
    Session s(std::move(job.peers[r]), job.cluster, state, SessionOptions{});
    ASSERT_TRUE(s.join());
    EXPECT_EQ(s.size(), n);
    for (int i = 0; i < steps; ++i) {
      const auto out = s.step([&] {
        std::vector<double> g(w[r].size(), 1.0);
        s.peer().allreduce("g", buffer(g.data(), g.size()), buffer(g.data(), g.size())).wait();
        for (std::size_t k = 0; k < g.size(); ++k) w[r][k] -= 0.5 * g[k];
        ++step;
      });
      ASSERT_EQ(out, Session::Outcome::committed);
    }
    EXPECT_GT(s.last_check_us(), 0.0);
    commits[r] = s.commits();
    final_step[r] = step;
    records[r] = s.changes().size();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(commits[r], steps);
    EXPECT_EQ(final_step[r], steps);
    EXPECT_EQ(records[r], 1u) << "one ChangeRecord: the join";
    EXPECT_EQ(w[r], w[0]) << "rank " << r;
  }
  // Rank 0's initial 1.0, then 25 steps of -0.5 * 3.
  EXPECT_DOUBLE_EQ(w[0][0], 1.0 - steps * 1.5);
}

TEST(Session, StaticJobRollsBackNothingAndReportsALostPeer) {
  constexpr int n = 2;
  Job job = make_job(n);
  std::atomic<bool> failed_with_peer_lost{false};
  std::atomic<int> joined{0};
  test::run_all(n, [&](int r) {
    State state;
    std::vector<float> v(4, 1.f);
    state.add("v", buffer(v.data(), v.size()));
    auto s =
        std::make_unique<Session>(std::move(job.peers[r]), job.cluster, state, SessionOptions{});
    ASSERT_TRUE(s->join());
    ++joined;
    ASSERT_EQ(s->step([] {}), Session::Outcome::committed);
    if (r == 1) {
      s.reset();  // this worker goes away (its peer says goodbye)
      return;
    }
    try {
      for (int i = 0; i < 100; ++i) {
        s->step([&] {
          s->peer().allreduce("x", buffer(v.data(), v.size()), buffer(v.data(), v.size())).wait();
        });
      }
    } catch (const Error& e) {
      failed_with_peer_lost = e.code() == errcond::peer_failure;
    }
  });
  EXPECT_EQ(joined.load(), n);
  EXPECT_TRUE(failed_with_peer_lost) << "a static job cannot recover: the error reaches the loop";
}

// Every worker lost: a new job with the same checkpoint path goes on from the last saved commit.
TEST(Session, NewJobContinuesFromTheCheckpoint) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("kf-session-ckpt-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(path);
  SessionOptions o;
  o.checkpoint_path = path;
  o.checkpoint_every = 4;
  constexpr int n = 2;
  std::vector<std::int64_t> first_steps(n), second_start(n);
  std::vector<std::vector<double>> w(n);
  for (int round = 0; round < 2; ++round) {
    Job job = make_job(n);
    test::run_all(n, [&](int r) {
      State state;
      w[r].assign(3, 0.0);
      state.add("w", buffer(w[r].data(), w[r].size()));
      std::int64_t& step = state.counter("step");
      Session s(std::move(job.peers[r]), job.cluster, state, o);
      ASSERT_TRUE(s.join());
      if (round == 1) second_start[r] = step;
      for (int i = 0; i < 10; ++i) {
        s.step([&] {
          w[r][0] += 1.0;
          ++step;
        });
      }
      if (round == 0) first_steps[r] = step;
    });
  }
  std::filesystem::remove(path);
  EXPECT_EQ(first_steps[0], 10);
  // Commits every step, saved every 4th commit: the last save holds step 8.
  EXPECT_EQ(second_start[0], 8);
  EXPECT_EQ(second_start[1], 8) << "the checkpoint reached every worker of the new job";
  EXPECT_EQ(w[0][0], 18.0);
  EXPECT_EQ(w[1][0], 18.0);
}

// Runs `cmd` and returns what it printed on stdout.
std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char chunk[4096];
    std::size_t got = 0;
    while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) out.append(chunk, got);
    ::pclose(f);
  }
  return out;
}

// Metrics are averaged over the workers in the control record; a policy sees the same average
// on every rank and its settings change (static job: applied at once) lands at the same step.
// The endpoint counts the decisions by policy and action, and shows the mode now in use.
TEST(Session, StaticJobPoliciesSeeAveragedMetricsAndChangeSettingsTogether) {
  class Halver : public Policy {
   public:
    std::string name() const override { return "halver"; }
    void after_step(PolicyContext& c) override {
      seen.push_back(c.metric("rank_plus_one"));
      if (c.step() == 5) {
        c.set_batch_size(c.settings().value("batch_size", 64) / 2, "step 5");
        c.set_algorithm("ring");
        c.set_mode("sma:period=2");
      }
    }
    std::vector<double> seen;
  };
  constexpr int n = 3;
  Job job = make_job(n);
  job.cluster.settings = {{"batch_size", 64}};
  std::vector<std::vector<std::int64_t>> batch_at(n);
  std::vector<std::vector<double>> seen(n);
  std::vector<std::string> scraped(n);
  std::vector<std::deque<PolicyDecision>> decided(n);
  test::run_all(n, [&](int r) {
    State state;
    auto halver = std::make_unique<Halver>();
    Halver* h = halver.get();
    PolicyRunner runner;
    runner.add(std::move(halver));
    SessionOptions o;
    o.metrics_port = 0;
    Session s(std::move(job.peers[r]), job.cluster, state, o);
    s.set_policies(&runner);
    const int slot = s.add_metric("rank_plus_one");
    ASSERT_TRUE(s.join());
    EXPECT_THROW(s.add_metric("late"), std::logic_error);
    for (int i = 0; i < 8; ++i) {
      batch_at[r].push_back(s.settings().value("batch_size", 0));
      s.step([&] { s.set_metric(slot, r + 1.0); });
    }
    seen[r] = h->seen;
    decided[r] = s.decisions();
    scraped[r] =
        run_command("curl -s http://127.0.0.1:" + std::to_string(s.metrics_port()) + "/metrics");
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(batch_at[r], (std::vector<std::int64_t>{64, 64, 64, 64, 64, 32, 32, 32}))
        << "rank " << r;
    ASSERT_EQ(seen[r].size(), 8u);
    for (double v : seen[r]) EXPECT_EQ(v, 2.0) << "mean of 1, 2, 3 on rank " << r;
    // The one proposal, as the session applied it.
    ASSERT_EQ(decided[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(decided[r][0].step, 5);
    EXPECT_EQ(decided[r][0].hook, "after_step");
    EXPECT_EQ(decided[r][0].proposal.batch_size, std::optional<std::int64_t>(32));
    EXPECT_EQ(decided[r][0].proposal.reasons.size(), 3u);
    for (const char* action : {"batch_size", "algorithm", "mode"}) {
      EXPECT_NE(scraped[r].find("kf_policy_decisions_total{action=\"" + std::string(action) +
                                "\",policy=\"halver\"} 1\n"),
                std::string::npos)
          << scraped[r];
    }
    EXPECT_NE(scraped[r].find("kf_mode_info{boundaries=\"every-step\",compression=\"none\","
                              "mode=\"sync-sgd\"} 0\n"),
              std::string::npos);
    EXPECT_NE(scraped[r].find("kf_mode_info{boundaries=\"every-step\",compression=\"none\","
                              "mode=\"sma:period=2\"} 1\n"),
              std::string::npos)
        << scraped[r];
  }
}

// Gradients with a known noise scale: every coordinate of the true gradient G is 0.1 (D = 500:
// |G|² = 5) and a micro-batch of b = 16 samples adds noise of variance 0.02 per coordinate, so
// the per-example covariance has trace D·0.02·16 = 160 and B_simple = 160 / 5 = 32.
std::vector<float> noisy_gradient(int rank, int step) {
  std::mt19937 gen(static_cast<unsigned>(1000 * step + rank));
  std::normal_distribution<float> noise(0.0f, std::sqrt(0.02f));
  std::vector<float> g(500);
  for (float& v : g) v = 0.1f + noise(gen);
  return g;
}

TEST(Session, MonitorsGiveEveryWorkerTheSameEstimatesAndServeThem) {
  constexpr int n = 3, steps = 120, nan_step = 70;
  Job job = make_job(n);
  const auto jsonl = std::filesystem::temp_directory_path() /
                     ("kf-session-metrics-" + std::to_string(::getpid()) + ".jsonl");
  std::filesystem::remove(jsonl);
  std::vector<std::map<std::string, double>> last(n);
  std::vector<std::vector<double>> skipped(n), b_simple(n);
  std::vector<std::string> scraped(n);
  test::run_all(n, [&](int r) {
    State state;
    SessionOptions o;
    o.monitor.gns_theta = 0.95;
    o.metrics_port = 0;
    o.metrics_jsonl = jsonl.string();
    Session s(std::move(job.peers[r]), job.cluster, state, o);
    ASSERT_NE(s.metrics_port(), 0);
    ASSERT_TRUE(s.join());
    std::vector<float> mean(500);
    for (int i = 0; i < steps; ++i) {
      std::vector<float> g = noisy_gradient(r, i);
      if (i == nan_step && r == 1) g[7] = std::numeric_limits<float>::quiet_NaN();
      ASSERT_EQ(s.step([&] {
        if (i % 2 == 0) {
          s.allreduce_gradients(g, 16);  // in place
        } else {
          s.allreduce_gradients(std::span<const float>(g), mean, 16);
        }
      }),
                Session::Outcome::committed);
      skipped[r].push_back(s.metrics().count("gns.skipped") ? s.metrics().at("gns.skipped") : -1);
      b_simple[r].push_back(s.metrics().count("gns.b_simple") ? s.metrics().at("gns.b_simple")
                                                              : -1);
    }
    last[r] = s.metrics();
    scraped[r] =
        run_command("curl -s http://127.0.0.1:" + std::to_string(s.metrics_port()) + "/metrics");
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(last[r], last[0]) << "rank " << r << " holds other metrics than rank 0";
    EXPECT_EQ(b_simple[r], b_simple[0]) << "rank " << r;
    EXPECT_EQ(skipped[r], skipped[0]) << "rank " << r;
  }
  for (int i = 0; i < steps; ++i) EXPECT_EQ(skipped[0][i], i == nan_step ? 1.0 : 0.0) << i;
  const auto& m = last[0];
  ASSERT_EQ(m.count("gns.valid"), 1u);
  EXPECT_EQ(m.at("gns.valid"), 1.0);
  ASSERT_EQ(m.count("gns.b_simple"), 1u);
  EXPECT_NEAR(m.at("gns.b_simple"), 32.0, 8.0);
  EXPECT_EQ(m.at("gns.noise_dominated"), 0.0);
  EXPECT_EQ(m.at("comm_bytes"), 500.0 * sizeof(float));
  EXPECT_GT(m.at("comm_time"), 0.0);
  EXPECT_GT(m.at("algbw"), 0.0);
  EXPECT_EQ(m.at("samples"), 16.0 * n);
  EXPECT_GT(m.at("throughput"), 0.0);
  EXPECT_GT(m.at("step_time"), 0.0);
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(scraped[r].find("kf_gns_simple_noise_scale "), std::string::npos) << scraped[r];
    EXPECT_NE(scraped[r].find("kf_throughput_samples_per_second "), std::string::npos);
    EXPECT_NE(scraped[r].find("kf_steps_total " + std::to_string(steps) + "\n"), std::string::npos);
    EXPECT_NE(scraped[r].find("kf_cluster_size 3\n"), std::string::npos);
    EXPECT_NE(scraped[r].find("kf_build_info{version=\""), std::string::npos);
    EXPECT_NE(scraped[r].find("kf_mode_info{boundaries=\"every-step\",compression=\"none\","
                              "mode=\"sync-sgd\"} 1\n"),
              std::string::npos)
        << scraped[r];
    EXPECT_NE(
        scraped[r].find("kf_collective_bytes_total " + std::to_string(steps * 500 * 4) + "\n"),
        std::string::npos);
    // Every step but the first (which has no start) in the step histogram.
    EXPECT_NE(scraped[r].find("kf_step_duration_seconds_count " + std::to_string(steps - 1) + "\n"),
              std::string::npos);
    EXPECT_NE(scraped[r].find("kf_step_duration_seconds_bucket{le=\"+Inf\"} "), std::string::npos);
    EXPECT_NE(scraped[r].find("kf_resize_phase_duration_seconds_count{phase=\"sync\"} 1\n"),
              std::string::npos)
        << "the join";
    EXPECT_NE(scraped[r].find("kf_membership_changes_total{kind=\"join\"} 1\n"), std::string::npos);
  }
  // Prometheus's own linter on what each worker serves (Debian's prometheus package).
  if (run_command("command -v promtool").empty()) {
    std::printf("promtool not found: the exposition was not linted (apt install prometheus)\n");
  } else {
    for (int r = 0; r < n; ++r) {
      const auto file = std::filesystem::temp_directory_path() /
                        ("kf-session-scrape-" + std::to_string(::getpid()) + ".prom");
      std::ofstream(file) << scraped[r];
      const std::string said =
          run_command("promtool check metrics < " + file.string() + " 2>&1; echo rc=$?");
      std::filesystem::remove(file);
      EXPECT_EQ(said, "rc=0\n") << "rank " << r << ":\n" << scraped[r];
    }
  }
  // Rank 0 wrote one JSON line per step.
  std::ifstream in(jsonl);
  std::string line, final_line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    final_line = line;
  }
  EXPECT_EQ(lines, steps);
  const auto doc = nlohmann::json::parse(final_line);
  EXPECT_EQ(doc.at("step"), steps);
  EXPECT_EQ(doc.at("metrics").at("kf_gns_valid"), 1.0);
  std::filesystem::remove(jsonl);
}

TEST(Session, BalancedBatchesFollowEachWorkersSpeedTheSameOnEveryWorker) {
  // Three workers report their samples and a compute time of 1 ms per sample, rank 2 of 3 ms
  // (a worker 3x slower). Without "balance" every step splits equally; with it, from the
  // second step (the first boundary measures), the parts approach 3 : 3 : 1, and every worker
  // computes the same split: the parts cover the step once, in rank order.
  constexpr int n = 3, steps = 12;
  constexpr std::size_t samples = 70;
  for (const bool balance : {false, true}) {
    Job job = make_job(n);
    if (balance) job.cluster.settings = {{"balance", true}};
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> parts(n);
    std::vector<std::vector<double>> speeds(n);
    test::run_all(n, [&](int r) {
      State state;
      Session s(std::move(job.peers[r]), job.cluster, state, SessionOptions{});
      ASSERT_TRUE(s.join());
      for (int i = 0; i < steps; ++i) {
        const auto part = s.batch_part(samples);
        parts[r].push_back(part);
        ASSERT_EQ(s.step([&] {
          s.report_samples(static_cast<double>(part.second));
          s.report_compute(static_cast<double>(part.second) * (r == 2 ? 3e-3 : 1e-3));
        }),
                  Session::Outcome::committed);
      }
      speeds[r] = s.speeds();
    });
    for (int i = 0; i < steps; ++i) {
      std::size_t next = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(parts[r][i].first, next) << "step " << i << " rank " << r;
        next += parts[r][i].second;
      }
      EXPECT_EQ(next, samples) << "step " << i;
    }
    const auto equal = std::make_pair(std::size_t{0}, std::size_t{24});
    EXPECT_EQ(parts[0][0], equal) << "the first step: nothing measured yet";
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(speeds[r], speeds[0]) << "rank " << r;
      ASSERT_EQ(speeds[r].size(), 3u);
    }
    EXPECT_NEAR(speeds[0][0], 1000.0, 1e-6);
    EXPECT_NEAR(speeds[0][2], 1000.0 / 3, 1e-6);
    if (balance) {
      EXPECT_EQ(parts[2][steps - 1], std::make_pair(std::size_t{60}, std::size_t{10}));
    } else {
      EXPECT_EQ(parts[2][steps - 1], std::make_pair(std::size_t{47}, std::size_t{23}));
    }
  }
}

TEST(Session, OneWorkerHasNoNoiseScaleAndMonitorsCanBeOff) {
  Job job = make_job(1);
  State state;
  Session s(std::move(job.peers[0]), job.cluster, state, SessionOptions{});
  ASSERT_TRUE(s.join());
  for (int i = 0; i < 5; ++i) {
    std::vector<float> g = noisy_gradient(0, i);
    s.step([&] { s.allreduce_gradients(g, 16); });
  }
  EXPECT_EQ(s.metrics().at("gns.valid"), 0.0);
  EXPECT_EQ(s.metrics().count("gns.b_simple"), 0u);
  EXPECT_EQ(s.metrics().at("samples"), 16.0);

  Job job2 = make_job(1);
  State state2;
  SessionOptions off;
  off.monitors = false;
  Session quiet(std::move(job2.peers[0]), job2.cluster, state2, off);
  ASSERT_TRUE(quiet.join());
  std::vector<float> g(4, 2.0f);
  quiet.step([&] { quiet.allreduce_gradients(g, 16); });
  EXPECT_TRUE(quiet.metrics().empty());
  EXPECT_EQ(g, std::vector<float>(4, 2.0f)) << "the mean over one worker is its gradient";
}

// Boundaries on change (docs/elastic.md): three workers, one of them 3x slower, each through its
// own pieces of the epoch (PieceSampler). Nobody waits for the slow one between boundaries, so the
// fast workers take more steps; the boundaries are far fewer than the steps; every sample of each
// of the 3 epochs is taken exactly once; and a policy runs at the boundaries only, seeing the
// same step (rank 0's) on every worker.
TEST(Session, BoundariesOnChangeLetEachWorkerGoAtItsPaceAndTakeEverySampleOnce) {
  class StepRecorder : public Policy {
   public:
    std::string name() const override { return "step-recorder"; }
    void after_step(PolicyContext& c) override { steps.push_back(c.step()); }
    std::vector<std::int64_t> steps;
  };
  constexpr int n = 3, epochs = 3;
  constexpr std::size_t samples = 600;
  Job job = make_job(n);
  std::vector<std::atomic<int>> taken(epochs * samples);
  std::vector<std::int64_t> steps(n), boundaries(n);
  std::vector<int> on_change(n);
  std::vector<std::vector<std::int64_t>> policy_steps(n);
  test::run_all(n, [&](int r) {
    State state;
    PieceSampler pieces(samples, 5, state);
    SessionOptions o;
    o.default_settings = {{"mode", "pair-avg"}, {"boundaries", "on-change"}};
    o.boundary_interval = std::chrono::milliseconds(50);
    auto recorder = std::make_unique<StepRecorder>();
    StepRecorder* rec = recorder.get();
    PolicyRunner runner;
    runner.add(std::move(recorder));
    Session s(std::move(job.peers[r]), job.cluster, state, o);
    s.set_policies(&runner);
    ASSERT_TRUE(s.join());
    on_change[r] = s.boundaries_on_change();
    std::set<std::pair<std::uint64_t, std::uint64_t>> seen;
    for (;;) {
      ASSERT_FALSE(pieces.settle(s).has_value()) << "no failure here";
      seen.emplace(s.version(), s.boundaries_in_version());
      if (pieces.epoch() >= epochs) break;
      const auto mine = pieces.take(s, 4);
      const auto out = s.step([&] {
        for (std::size_t id : mine) {
          taken[static_cast<std::size_t>(pieces.epoch()) * samples + id].fetch_add(1);
        }
        // Compute: 1 ms a step, 3 ms on the slow worker.
        std::this_thread::sleep_for(std::chrono::milliseconds(r == n - 1 ? 3 : 1));
      });
      ASSERT_EQ(out, Session::Outcome::committed);
    }
    steps[r] = s.steps();
    boundaries[r] = static_cast<std::int64_t>(seen.size());
    policy_steps[r] = rec->steps;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(policy_steps[r], policy_steps[0]) << "rank " << r;
  EXPECT_LT(policy_steps[0].size(), static_cast<std::size_t>(steps[0]) / 3);
  EXPECT_TRUE(std::is_sorted(policy_steps[0].begin(), policy_steps[0].end()));
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(on_change[r]);
    std::printf("rank %d: %lld steps, %lld boundaries\n", r, static_cast<long long>(steps[r]),
                static_cast<long long>(boundaries[r]));
  }
  EXPECT_LT(boundaries[0] * 3, steps[0]) << "a boundary at most steps of a fast worker";
  EXPECT_GT(steps[0], steps[n - 1] * 3 / 2) << "a fast worker waited for the slow one";
  for (std::size_t i = 0; i < taken.size(); ++i) {
    ASSERT_EQ(taken[i].load(), 1) << "epoch " << i / samples << " sample " << i % samples;
  }
}

// The parameter server with boundaries on change (kf::ParameterServer, asynchronously): each
// worker's update adds 1 to its own coordinate of the model, so that the server's parameters
// count the pushes it applied. Then every worker's own coordinate counts its steps exactly (the
// server's count plus its pushes not applied yet), another's never goes back nor past that
// worker's steps, and the staleness bound holds except in the two steps before a boundary. The
// server (rank 0) never waits; with rank 0 slow the others wait for it as the bound says, and its
// marked answers before each boundary keep a waiting worker from holding the boundary up (a hang
// here). The steps each took are printed: a fast worker's pace against the slow one's is a
// benchmark's (elastic-bench --changes async), not this test's.
TEST(Session, ParameterServerOnChangeWaitsForNobodyButTheServerAndKeepsItsCounts) {
  constexpr int n = 3, boundaries = 12;
  for (const int slow : {2, 0}) {
    for (const int staleness : {0, 2}) {
      SCOPED_TRACE("slow rank " + std::to_string(slow) + ", max_staleness " +
                   std::to_string(staleness));
      Job job = make_job(n);
      std::vector<std::int64_t> steps(n), waits(n);
      std::vector<std::vector<float>> views(n);
      test::run_all(n, [&](int r) {
        State state;
        SessionOptions o;
        o.default_settings = {{"mode", "async-ps"}, {"boundaries", "on-change"}};
        o.boundary_interval = std::chrono::milliseconds(20);
        Session s(std::move(job.peers[r]), job.cluster, state, o);
        ASSERT_TRUE(s.join());
        ASSERT_TRUE(s.boundaries_on_change());
        ParameterServer ps(s, "ps",
                           {.max_staleness = staleness, .soft_sync = 1, .scale_lr = false});
        std::vector<float> w(n, 0.0f), start(n), seen(n, 0.0f);
        std::int64_t own = 0;
        while (s.boundaries_in_version() < boundaries) {
          ASSERT_EQ(s.step([&] {
            std::this_thread::sleep_for(std::chrono::microseconds(r == slow ? 3000 : 500));
            start = w;
            w[static_cast<std::size_t>(r)] += 1.0f;
            const auto rep = ps.step(w, start, s.steps());
            ++own;
            waits[r] += rep.waited;
            ASSERT_EQ(w[static_cast<std::size_t>(r)], static_cast<float>(own));
            // A worker does not wait in the step that ends at a boundary, nor in the step where
            // rank 0's mark comes if that step's own boundary was decided already.
            ASSERT_LE(rep.staleness, staleness + 2) << "step " << own;
            for (int q = 0; q < n; ++q) {
              if (q == r) continue;
              ASSERT_GE(w[static_cast<std::size_t>(q)], seen[static_cast<std::size_t>(q)]);
              seen[static_cast<std::size_t>(q)] = w[static_cast<std::size_t>(q)];
            }
          }),
                    Session::Outcome::committed);
        }
        steps[r] = own;
        views[r] = seen;
        std::printf("slow %d, staleness %d, rank %d: %lld steps, waited %lld times\n", slow,
                    staleness, r, static_cast<long long>(own), static_cast<long long>(waits[r]));
      });
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) {
          if (q != r) {
            EXPECT_LE(views[r][q], static_cast<float>(steps[q])) << r << " of " << q;
          }
        }
      }
      EXPECT_EQ(waits[0], 0) << "the server waits for nobody";
      if (slow == 0) {
        // A worker runs at most max_staleness + 1 steps past each of the server's, and two more
        // into a boundary.
        const int fast = 1;
        EXPECT_LE(steps[fast], (steps[0] + 1) * (staleness + 2)) << "the bound did not hold";
        EXPECT_GT(waits[fast], 0) << "nobody waited for a slow server";
      }
    }
  }
}

// Boundaries on change in sma (period 4): the averaging steps are the boundaries, and no other
// step meets anyone, not even one whose loop asked for a boundary (it waits for the next
// averaging). After each averaging every worker holds the same model.
TEST(Session, BoundariesOnChangeInSmaAreItsAveragingSteps) {
  constexpr int n = 3, period = 4, steps = 22;
  Job job = make_job(n);
  std::vector<std::vector<std::uint64_t>> passed(n);
  std::vector<std::vector<double>> models(n);
  test::run_all(n, [&](int r) {
    State state;
    SessionOptions o;
    o.default_settings = {{"mode", "sma:period=" + std::to_string(period)},
                          {"boundaries", "on-change"}};
    o.boundary_interval = std::chrono::milliseconds(1);  // adds no boundary in sma
    Session s(std::move(job.peers[r]), job.cluster, state, o);
    ASSERT_TRUE(s.join());
    ASSERT_TRUE(s.boundaries_on_change());
    float w = 0.0f;
    for (int i = 0; i < steps; ++i) {
      if (i % 3 == 1) s.request_boundary();
      ASSERT_EQ(s.step([&] {
        w += static_cast<float>(r + 1);
        if (plan_step(s.mode(), s.steps()).average_parameters) {
          average_parameters(s.peer(), "model", &w, 1);
          models[r].push_back(w);
        }
      }),
                Session::Outcome::committed);
      passed[r].push_back(s.boundaries_in_version());
    }
  });
  std::vector<std::uint64_t> expected;
  for (int i = 0; i < steps; ++i) expected.push_back(static_cast<std::uint64_t>((i + 1) / period));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(passed[r], expected) << "rank " << r;
    EXPECT_EQ(models[r], models[0]) << "rank " << r;
  }
  ASSERT_EQ(models[0].size(), static_cast<std::size_t>(steps / period));
  EXPECT_FLOAT_EQ(models[0][0], 4.0f * 2.0f) << "4 steps of the mean drift (1 + 2 + 3) / 3";
}

TEST(Session, RejectsAPeerOutsideItsClusterOrAlreadyStarted) {
  Job job = make_job(2);
  Cluster other;
  other.version = 1;
  other.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 1}, 0});
  State state;
  EXPECT_THROW(Session(std::move(job.peers[0]), other, state, SessionOptions{}),
               std::invalid_argument);
  job.peers[1]->start(job.cluster);
  State state2;
  EXPECT_THROW(Session(std::move(job.peers[1]), job.cluster, state2, SessionOptions{}),
               std::invalid_argument);
  SessionOptions bad;
  bad.config_server = "http://127.0.0.1:1";
  Job job2 = make_job(1);
  State state3;
  EXPECT_THROW(Session(std::move(job2.peers[0]), job2.cluster, state3, bad), std::invalid_argument)
      << "a config service needs the job token";
}

}  // namespace
}  // namespace kf
