// SPDX-License-Identifier: Apache-2.0
// Training modes: the plan of each step, model averaging against synchronous SGD and against
// gradient descent computed in one process, on a quadratic (ranks as threads), and a mode
// switch by a policy making the models of a static job one again at the boundary where it
// takes effect, and a switch decided from the workers' averaged metrics taking effect at the
// same step on every worker.
#include "kf/runtime/training_mode.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "kf/runtime/pair_averaging.hpp"
#include "kf/runtime/parameter_server.hpp"

#include "kf/runtime/session.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

TEST(TrainingMode, SyncSgdAveragesGradientsEveryStep) {
  for (std::int64_t s : {0, 1, 7, 1000}) {
    const ModePlan p = plan_step(ModeSpec{}, s);
    EXPECT_TRUE(p.average_gradients);
    EXPECT_FALSE(p.average_parameters);
  }
}

TEST(TrainingMode, SmaIsSynchronousUntilPostLocalThenAveragesEveryPeriod) {
  const ModeSpec sma = parse_mode("sma:period=4,post_local=3");
  std::vector<int> gradient_steps, average_steps;
  for (int s = 0; s < 12; ++s) {
    const ModePlan p = plan_step(sma, s);
    if (p.average_gradients) gradient_steps.push_back(s);
    if (p.average_parameters) average_steps.push_back(s);
    EXPECT_FALSE(p.average_gradients && p.average_parameters) << "step " << s;
  }
  EXPECT_EQ(gradient_steps, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(average_steps, (std::vector<int>{3, 7, 11}));
  // Period 1: the parameters after every step.
  for (int s = 0; s < 5; ++s) EXPECT_TRUE(plan_step(parse_mode("sma"), s).average_parameters);
}

TEST(TrainingMode, PairAveragingStepsLocallyThenAveragesWithAPair) {
  for (std::int64_t s : {0, 1, 7}) {
    const ModePlan p = plan_step(parse_mode("pair-avg:seed=3"), s);
    EXPECT_FALSE(p.average_gradients);
    EXPECT_FALSE(p.average_parameters);
    EXPECT_TRUE(p.average_with_pair);
  }
}

TEST(TrainingMode, AsyncPsStepsLocallyThenPushesToTheServer) {
  for (std::int64_t s : {0, 1, 7}) {
    const ModePlan p = plan_step(parse_mode("async-ps:max_staleness=2"), s);
    EXPECT_FALSE(p.average_gradients);
    EXPECT_FALSE(p.average_parameters);
    EXPECT_FALSE(p.average_with_pair);
    EXPECT_TRUE(p.exchange_with_server);
  }
}

TEST(PairAveraging, TheScheduleNeverPicksItselfAndReachesEveryPeer) {
  constexpr int n = 5;
  for (int r = 0; r < n; ++r) {
    std::set<int> seen;
    for (std::int64_t s = 0; s < 200; ++s) {
      const int p = PairAverager::partner(7, s, r, n);
      ASSERT_NE(p, r);
      ASSERT_TRUE(p >= 0 && p < n) << p;
      EXPECT_EQ(p, PairAverager::partner(7, s, r, n)) << "deterministic";
      seen.insert(p);
    }
    EXPECT_EQ(seen.size(), std::size_t{n - 1}) << "rank " << r;
  }
  int same = 0;
  for (std::int64_t s = 0; s < 100; ++s) {
    same += PairAverager::partner(7, s, 0, n) == PairAverager::partner(8, s, 0, n) ? 1 : 0;
  }
  EXPECT_LT(same, 60) << "another seed, another schedule";
  EXPECT_EQ(PairAverager::partner(7, 0, 0, 1), -1) << "alone: nobody to push to";
}

TEST(PairAveraging, AWorkerNeverWaitsForItsPeer) {
  // Two workers driven from this one thread: worker 0 exchanges 50 times while worker 1 does
  // nothing, then worker 1 once, then worker 0 again until the answer is in.
  auto peers = test::make_local_cluster(2);
  PairAverager a(*peers[0], "m", 1), b(*peers[1], "m", 1);
  std::vector<float> w0{1, 2, 3, 4}, w1{5, 6, 7, 8};
  int pushes = 0;
  for (int s = 0; s < 50; ++s) {
    const auto rep = a.exchange(w0, s);
    pushes += rep.pushed_to >= 0 ? 1 : 0;
    EXPECT_EQ(rep.corrections, 0);
  }
  EXPECT_EQ(pushes, 1) << "one push, then none while it is unanswered";
  EXPECT_TRUE(a.waiting());
  EXPECT_EQ(w0, (std::vector<float>{1, 2, 3, 4})) << "nothing came, nothing changed";
  PairAverager::Report got;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.models_averaged == 0 && std::chrono::steady_clock::now() < give_up) {
    got = b.exchange(w1, 3, /*push=*/false);
  }
  ASSERT_EQ(got.models_averaged, 1);
  EXPECT_EQ(got.max_staleness, 3) << "pushed at step 0, averaged at 3";
  EXPECT_EQ(w1, (std::vector<float>{3, 4, 5, 6}));
  got = {};
  while (got.corrections == 0 && std::chrono::steady_clock::now() < give_up) {
    got = a.exchange(w0, 60, /*push=*/false);
  }
  ASSERT_EQ(got.corrections, 1);
  EXPECT_EQ(w0, (std::vector<float>{3, 4, 5, 6})) << "both at the pair's average";
  EXPECT_FALSE(a.waiting());
}

TEST(PairAveraging, ConservesTheSumOfTheModelsAndBringsThemTogether) {
  // Four workers as threads exchange 300 times with no update of their own, each at its own
  // pace between allreduces every 5 exchanges (without them a worker's 300 exchanges are over
  // before its first push is answered); then they stop pushing and let what is in flight
  // settle. The sum of the models is what it was, and the models are close to their mean.
  constexpr int n = 4;
  constexpr std::size_t count = 16;
  auto peers = test::make_local_cluster(n);
  std::vector<std::vector<float>> w(n);
  std::vector<int> pushes(n), averaged(n), corrected(n);
  std::vector<double> before(count, 0.0);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      w[r].push_back(static_cast<float>((r + 1) * 8 + static_cast<int>(i)));
      before[i] += w[r][i];
    }
  }
  test::run_all(n, [&](int r) {
    PairAverager avg(*peers[r], "model", 42);
    const auto count_in = [&](const PairAverager::Report& rep) {
      pushes[r] += rep.pushed_to >= 0 ? 1 : 0;
      averaged[r] += rep.models_averaged;
      corrected[r] += rep.corrections;
    };
    for (int s = 0; s < 300; ++s) {
      count_in(avg.exchange(w[r], s));
      std::int32_t tick = 1;
      if (s % 5 == 4) peers[r]->allreduce("tick", buffer(&tick, 1), buffer(&tick, 1)).wait();
    }
    for (int round = 0;; ++round) {
      ASSERT_LT(round, 100000) << "the exchanges in flight never settled";
      count_in(avg.exchange(w[r], 300, /*push=*/false));
      std::int32_t waiting = avg.waiting() ? 1 : 0;
      peers[r]->allreduce("settled", buffer(&waiting, 1), buffer(&waiting, 1)).wait();
      if (waiting == 0) break;
    }
  });
  EXPECT_EQ(std::accumulate(pushes.begin(), pushes.end(), 0),
            std::accumulate(averaged.begin(), averaged.end(), 0));
  EXPECT_EQ(std::accumulate(pushes.begin(), pushes.end(), 0),
            std::accumulate(corrected.begin(), corrected.end(), 0));
  EXPECT_GT(std::accumulate(pushes.begin(), pushes.end(), 0), 100);
  for (std::size_t i = 0; i < count; ++i) {
    double after = 0;
    for (int r = 0; r < n; ++r) after += w[r][i];
    EXPECT_NEAR(after, before[i], 1e-3) << "value " << i;
    for (int r = 0; r < n; ++r) {
      EXPECT_NEAR(w[r][i], before[i] / n, 1e-2) << "rank " << r << " value " << i;
    }
  }
}

TEST(TrainingMode, WhichModesLetModelsDiverge) {
  EXPECT_FALSE(models_may_diverge(parse_mode("sync-sgd")));
  EXPECT_FALSE(models_may_diverge(parse_mode("sma")));
  EXPECT_TRUE(models_may_diverge(parse_mode("sma:period=2")));
  EXPECT_TRUE(models_may_diverge(parse_mode("pair-avg")));
  EXPECT_TRUE(models_may_diverge(parse_mode("async-ps")));
}

// Worker r's part of the objective: f_r(w) = 1/2 sum_i (a_ri . w - b_ri)^2 over 4 rows, so the
// job minimises the sum over workers; its gradient at w, as floats.
struct Quadratic {
  static constexpr int kDim = 3, kRows = 4;
  std::vector<float> a, b;
  explicit Quadratic(int rank) {
    for (int i = 0; i < kRows; ++i) {
      for (int d = 0; d < kDim; ++d) {
        a.push_back(0.25f * static_cast<float>(((rank + 1) * (i + 2) + d * 3) % 7 + 1));
      }
      b.push_back(static_cast<float>(rank - i) * 0.5f);
    }
  }
  std::vector<float> gradient(const std::vector<float>& w) const {
    std::vector<float> g(kDim, 0.0f);
    for (int i = 0; i < kRows; ++i) {
      float err = -b[static_cast<std::size_t>(i)];
      for (int d = 0; d < kDim; ++d) err += a[static_cast<std::size_t>(i * kDim + d)] * w[d];
      for (int d = 0; d < kDim; ++d) g[d] += err * a[static_cast<std::size_t>(i * kDim + d)];
    }
    return g;
  }
};

// Runs `steps` steps of `mode` with 3 workers from w = 0 and returns every worker's model.
std::vector<std::vector<float>> train(const ModeSpec& mode, int steps, float lr) {
  constexpr int n = 3;
  auto peers = test::make_local_cluster(n);
  std::vector<std::vector<float>> w(n, std::vector<float>(Quadratic::kDim, 0.0f));
  test::run_all(n, [&](int r) {
    const Quadratic q(r);
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    for (int s = 0; s < steps; ++s) {
      const ModePlan plan = plan_step(mode, s);
      std::vector<float> g = q.gradient(w[r]);
      if (plan.average_gradients) {
        CollOptions o;
        o.op = ReduceOp::avg;
        peer.allreduce("g", buffer(g.data(), g.size()), buffer(g.data(), g.size()), o).wait();
      }
      for (int d = 0; d < Quadratic::kDim; ++d) w[r][d] -= lr * g[d];
      if (plan.average_parameters) average_parameters(peer, "w", w[r].data(), w[r].size());
    }
  });
  return w;
}

// async-ps on the quadratic: `steps` steps with 3 workers from w = 0, each a plain SGD step on
// the worker's own part, pushed to the server. With `boundary`, the workers pass an allreduce
// after each step, as a session's boundary makes them; without, each runs at its own pace.
// Returns every worker's model; `most_stale` gets each worker's largest staleness, `pushed`
// the sum of every update each worker made.
std::vector<std::vector<float>> train_async(const ParameterServer::Options& o, int steps, float lr,
                                            bool boundary,
                                            std::vector<std::int64_t>* most_stale = nullptr,
                                            std::vector<std::vector<double>>* pushed = nullptr) {
  constexpr int n = 3;
  auto peers = test::make_local_cluster(n);
  std::vector<std::vector<float>> w(n, std::vector<float>(Quadratic::kDim, 0.0f));
  if (most_stale) most_stale->assign(n, 0);
  if (pushed) pushed->assign(n, std::vector<double>(Quadratic::kDim, 0.0));
  test::run_all(n, [&](int r) {
    const Quadratic q(r);
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    ParameterServer ps(peer, "ps", o);
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> start = w[r];
      const std::vector<float> g = q.gradient(w[r]);
      for (int d = 0; d < Quadratic::kDim; ++d) w[r][d] -= lr * g[d];
      if (pushed) {
        for (int d = 0; d < Quadratic::kDim; ++d) (*pushed)[r][d] += w[r][d] - start[d];
      }
      const auto rep = ps.step(w[r], start, s);
      if (most_stale) (*most_stale)[r] = std::max((*most_stale)[r], rep.staleness);
      if (boundary) {
        std::int32_t tick = 1;
        peer.allreduce("tick", buffer(&tick, 1), buffer(&tick, 1)).wait();
      }
    }
  });
  return w;
}

TEST(TrainingMode, SmaWithPeriodOneEqualsSynchronousSgdOnTheSameData) {
  // Averaging the models after one local step from a common model is a step with the averaged
  // gradient: w - lr * mean(g_r) = mean(w - lr * g_r), up to the rounding of the two orders.
  constexpr int steps = 100;
  constexpr float lr = 0.05f;
  const auto sgd = train(parse_mode("sync-sgd"), steps, lr);
  const auto sma = train(parse_mode("sma"), steps, lr);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sgd[r], sgd[0]) << "synchronous SGD: every worker the same model";
    EXPECT_EQ(sma[r], sma[0]) << "SMA, after its average: every worker the same model";
    for (int d = 0; d < Quadratic::kDim; ++d) {
      EXPECT_NEAR(sma[r][d], sgd[r][d], 1e-5f * (1.0f + std::fabs(sgd[r][d])))
          << "rank " << r << ", coordinate " << d;
    }
  }
  // Both follow gradient descent on the whole objective, computed here in one process.
  std::vector<float> ref(Quadratic::kDim, 0.0f);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> mean(Quadratic::kDim, 0.0f);
    for (int r = 0; r < 3; ++r) {
      const auto g = Quadratic(r).gradient(ref);
      for (int d = 0; d < Quadratic::kDim; ++d) mean[d] += g[d] / 3.0f;
    }
    for (int d = 0; d < Quadratic::kDim; ++d) ref[d] -= lr * mean[d];
  }
  for (int d = 0; d < Quadratic::kDim; ++d) {
    EXPECT_NEAR(sgd[0][d], ref[d], 1e-4f * (1.0f + std::fabs(ref[d])));
    EXPECT_NE(ref[d], 0.0f);
  }
}

TEST(AsyncPs, WithNoStalenessAndAGroupOfEveryWorkerItIsSynchronousSgd) {
  // soft_sync 3 of 3 workers: the server applies the mean of the step's updates, each worker
  // then holds the server's parameters (max_staleness 0): w - lr * mean(g_r).
  constexpr int steps = 100;
  constexpr float lr = 0.05f;
  const auto sgd = train(parse_mode("sync-sgd"), steps, lr);
  const auto ps = train_async({.max_staleness = 0, .soft_sync = 3, .scale_lr = true}, steps, lr,
                              /*boundary=*/true);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ps[r], ps[0]) << "every worker holds the server's parameters";
    for (int d = 0; d < Quadratic::kDim; ++d) {
      EXPECT_NEAR(ps[r][d], sgd[r][d], 1e-5f * (1.0f + std::fabs(sgd[r][d])))
          << "rank " << r << ", coordinate " << d;
    }
  }
}

TEST(AsyncPs, EachUpdateIsScaledByItsStalenessAndGroupsAreAveraged) {
  // Two workers whose every update adds 1 (rank 0) and 2 (rank 1) to each value, in lockstep
  // (a boundary after each step) with max_staleness 0: both hold the server's view of the
  // step before, so in soft_sync 1 rank 0's push is the version after it (τ = 1) and rank 1's
  // the one after that (τ = 2).
  // A group's mean is weighted by the pushes' weights (rank 1's 3 in the last case).
  struct Case {
    ParameterServer::Options o;
    float per_step;
    std::int64_t tau;
    double weight1 = 1.0;
  };
  for (const Case c :
       {Case{{.max_staleness = 0, .soft_sync = 1, .scale_lr = true}, 1 + 2 / 2.0f, 2},
        Case{{.max_staleness = 0, .soft_sync = 1, .scale_lr = false}, 1 + 2, 2},
        Case{{.max_staleness = 0, .soft_sync = 2, .scale_lr = true}, (1 + 2) / 2.0f, 1},
        Case{{.max_staleness = 0, .soft_sync = 2, .scale_lr = true}, (1 + 3 * 2) / 4.0f, 1, 3.0}}) {
    auto peers = test::make_local_cluster(2);
    std::vector<std::vector<float>> w(2, std::vector<float>(4, 0.0f));
    std::vector<std::int64_t> tau(2, 0);
    test::run_all(2, [&](int r) {
      ParameterServer ps(*peers[r], "ps", c.o);
      for (int s = 0; s < 10; ++s) {
        const std::vector<float> start = w[r];
        for (float& v : w[r]) v += static_cast<float>(r + 1);
        const auto rep = ps.step(w[r], start, s, r == 1 ? c.weight1 : 1.0);
        EXPECT_EQ(rep.staleness, 0);
        if (r == 0) tau[0] = std::max(tau[0], rep.max_tau);
        std::int32_t tick = 1;
        peers[r]->allreduce("tick", buffer(&tick, 1), buffer(&tick, 1)).wait();
      }
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(w[r], std::vector<float>(4, 10 * c.per_step))
          << "soft_sync " << c.o.soft_sync << " scale_lr " << c.o.scale_lr << " weight "
          << c.weight1 << ", rank " << r;
    }
    EXPECT_EQ(tau[0], c.tau);
  }
}

TEST(AsyncPs, NoWorkerExceedsTheStalenessBoundAndNoUpdateIsLost) {
  // Three workers at their own pace (no boundary): after every step each holds parameters at
  // most max_staleness steps old. Without scaling, rank 0's model at the end is the start plus
  // every update every worker made, once each; and the job descends about as far as
  // synchronous SGD with the same step (lr times the sum of the gradients) does.
  constexpr float lr = 0.002f;
  const auto objective = [](const std::vector<float>& w) {
    double f = 0;
    for (int r = 0; r < 3; ++r) {
      const Quadratic q(r);
      for (int i = 0; i < Quadratic::kRows; ++i) {
        double e = -q.b[static_cast<std::size_t>(i)];
        for (int d = 0; d < Quadratic::kDim; ++d) {
          e += q.a[static_cast<std::size_t>(i * Quadratic::kDim + d)] * w[d];
        }
        f += 0.5 * e * e;
      }
    }
    return f;
  };
  const double sgd = objective(train(parse_mode("sync-sgd"), 600, 3 * lr)[0]);
  const double start = objective(std::vector<float>(Quadratic::kDim, 0.0f));
  ASSERT_LT(sgd, 0.9 * start);
  for (const int bound : {0, 2}) {
    std::vector<std::int64_t> most_stale;
    std::vector<std::vector<double>> pushed;
    const auto w = train_async({.max_staleness = bound, .soft_sync = 1, .scale_lr = false}, 600, lr,
                               /*boundary=*/false, &most_stale, &pushed);
    for (int r = 0; r < 3; ++r) EXPECT_LE(most_stale[r], bound) << "rank " << r;
    for (int d = 0; d < Quadratic::kDim; ++d) {
      const double sum = pushed[0][d] + pushed[1][d] + pushed[2][d];
      EXPECT_NEAR(w[0][d], sum, 1e-4 * (1.0 + std::fabs(sum))) << "coordinate " << d;
    }
    EXPECT_GT(start - objective(w[0]), 0.95 * (start - sgd))
        << "max_staleness " << bound << ": from " << start << " to " << objective(w[0])
        << ", synchronous SGD to " << sgd;
  }
}

TEST(AsyncPs, BadOptionsAndSizesAreRefused) {
  auto peers = test::make_local_cluster(2);
  EXPECT_THROW(ParameterServer(*peers[0], "ps", {.max_staleness = -1}), std::invalid_argument);
  EXPECT_THROW(ParameterServer(*peers[0], "ps", {.soft_sync = 0}), std::invalid_argument);
  ParameterServer ps(*peers[1], "ps", {});
  std::vector<float> w(3), start(4);
  try {
    ps.step(w, start, 0);
    ADD_FAILURE() << "stepped with a start of another size";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "ParameterServer::step: the model has 3 values and its start 4");
  }
  std::vector<float> start3(3);
  EXPECT_THROW(ps.step(w, start3, 0, 0.0), std::invalid_argument);
  EXPECT_THROW(ps.step(w, start3, 0, NAN), std::invalid_argument);
}

TEST(TrainingMode, SmaWithALongerPeriodDivergesBetweenAveragesAndAgreesAfterThem) {
  const auto after_average = train(parse_mode("sma:period=4"), 40, 0.05f);  // step 39 averages
  const auto between = train(parse_mode("sma:period=4"), 38, 0.05f);
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(after_average[r], after_average[0]);
    EXPECT_NE(between[r], between[0]) << "local steps since the last average";
  }
}

TEST(TrainingMode, LeavingADivergingModeGivesEveryWorkerRankZerosModel) {
  // A static job in sma with period 8: after 3 local steps the models differ; a policy
  // switches to sync-sgd at step 3, and at that boundary every worker takes rank 0's model.
  class Switch : public Policy {
   public:
    std::string name() const override { return "switch"; }
    void after_step(PolicyContext& c) override {
      if (c.step() == 3) c.set_mode("sync-sgd", "test");
    }
  };
  constexpr int n = 3;
  auto job = test::make_unstarted_job(n, "mode-test");
  job.cluster.settings = {{"mode", "sma:period=8"}};
  std::vector<std::vector<double>> w(n);
  std::vector<std::vector<double>> at_switch(n);
  std::vector<std::string> modes(n);
  test::run_all(n, [&](int r) {
    State state;
    w[r].assign(4, 0.0);
    state.add("w", buffer(w[r].data(), w[r].size()));
    PolicyRunner runner;
    runner.add(std::make_unique<Switch>());
    Session s(std::move(job.peers[static_cast<std::size_t>(r)]), job.cluster, state,
              SessionOptions{});
    s.set_policies(&runner);
    ASSERT_TRUE(s.join());
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(s.mode().mode, TrainingMode::sma);
      s.step([&] {
        for (double& v : w[r]) v += r + 1.0;  // a local update that differs by rank
      });
    }
    at_switch[r] = w[r];
    modes[r] = s.mode().str();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(modes[r], "sync-sgd");
    EXPECT_EQ(at_switch[r], std::vector<double>(4, 3.0)) << "rank " << r << ": rank 0's model";
  }
}

TEST(TrainingMode, APolicysModeSwitchTakesEffectAtTheSameStepOnEveryWorker) {
  // Each worker reports a metric of its own (rank × step); the policy sees their mean, which
  // only the boundary makes common, and switches sync-sgd -> sma:period=4 once it passes 10,
  // then -> sync-sgd once it passes 20. The mean is step (ranks 0, 1, 2), so the switches are
  // proposed at the boundaries of steps 11 and 21 and take effect in steps 12 and 22. Every
  // worker's mode is recorded at every step: the records must be identical.
  class ByMetric : public Policy {
   public:
    std::string name() const override { return "by-metric"; }
    void after_step(PolicyContext& c) override {
      const double mean = c.metric("local");
      const auto& s = c.settings();
      const bool averaging = s.contains("mode") && s["mode"] != "sync-sgd";
      if (mean > 20 && averaging) {
        c.set_mode("sync-sgd", "past 20");
      } else if (mean > 10 && mean <= 20 && !s.contains("mode")) {
        c.set_mode("sma:period=4", "past 10");
      }
    }
  };
  constexpr int n = 3;
  constexpr int steps = 30;
  auto job = test::make_unstarted_job(n, "mode-switch-test");
  std::vector<std::vector<std::string>> modes(n);
  test::run_all(n, [&](int r) {
    State state;
    std::vector<double> w(2, 0.0);
    state.add("w", buffer(w.data(), w.size()));
    PolicyRunner runner;
    runner.add(std::make_unique<ByMetric>());
    Session s(std::move(job.peers[static_cast<std::size_t>(r)]), job.cluster, state,
              SessionOptions{});
    const int local = s.add_metric("local");
    s.set_policies(&runner);
    ASSERT_TRUE(s.join());
    for (int i = 0; i < steps; ++i) {
      modes[r].push_back(s.mode().str());
      s.step([&] { s.set_metric(local, r * static_cast<double>(s.steps())); });
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(modes[r], modes[0]) << "rank " << r;
  std::vector<std::string> want(steps, "sync-sgd");
  for (int i = 12; i < 22; ++i) want[i] = "sma:period=4";
  EXPECT_EQ(modes[0], want);
}

TEST(TrainingMode, DefaultSettingsGiveTheModeWhereTheClusterHasNone) {
  for (const bool cluster_has_one : {false, true}) {
    constexpr int n = 2;
    auto job = test::make_unstarted_job(n, "mode-test");
    if (cluster_has_one) job.cluster.settings = {{"mode", "sync-sgd"}};
    std::vector<std::string> modes(n);
    test::run_all(n, [&](int r) {
      State state;
      SessionOptions o;
      o.default_settings = {{"mode", "sma:period=8"}, {"compression", "fp16"}};
      Session s(std::move(job.peers[static_cast<std::size_t>(r)]), job.cluster, state, o);
      ASSERT_TRUE(s.join());
      modes[r] = s.mode().str() + " " + s.compression().str();
    });
    for (const auto& m : modes) {
      EXPECT_EQ(m, cluster_has_one ? "sync-sgd fp16" : "sma:period=8 fp16");
    }
  }
}

}  // namespace
}  // namespace kf
