// SPDX-License-Identifier: Apache-2.0
// kf::DistributedOptimizer against plain LibTorch, with ranks as threads of one static job:
// one worker gives exactly the parameters of plain training; two workers on halves of a batch
// give those of one process on the whole batch; a worker with other initial values starts from
// rank 0's exact state; bucketed overlapped and single-allreduce exchanges agree bit for bit;
// and the gradient noise scale is fed from the exchange.
#include "kf/torch/data.hpp"
#include "kf/torch/distributed_optimizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/local_cluster.hpp"

namespace kf {
namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

Net make_net(int seed, torch::Device device = torch::kCPU) {
  torch::manual_seed(seed);
  Net net;
  net->to(device);
  return net;
}

struct Data {
  torch::Tensor x, y;
};

Data make_data(int n) {
  torch::manual_seed(99);
  return {torch::randn({n, 10}), torch::randint(0, 3, {n}, torch::kLong)};
}

std::vector<torch::Tensor> params_of(Net& net) {
  std::vector<torch::Tensor> v;
  for (auto& p : net->parameters()) v.push_back(p.detach().to(torch::kCPU).clone());
  return v;
}

enum class Opt { sgd, adam, adamw, rmsprop, adagrad };

const char* name_of(Opt o) {
  switch (o) {
    case Opt::sgd: return "SgdMomentum";
    case Opt::adam: return "Adam";
    case Opt::adamw: return "AdamW";
    case Opt::rmsprop: return "RmspropCenteredWithMomentum";
    case Opt::adagrad: return "AdagradWithLrDecay";
  }
  return "?";
}

// Every optimizer of LibTorch 1.13 but LBFGS, with the options that give each the most state
// (RMSprop's momentum buffers and gradient averages; Adagrad's step count, which its learning
// rate decay reads).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Net& net, Opt which) {
  switch (which) {
    case Opt::sgd:
      return std::make_unique<torch::optim::SGD>(net->parameters(),
                                                 torch::optim::SGDOptions(0.1).momentum(0.9));
    case Opt::adam:
      return std::make_unique<torch::optim::Adam>(net->parameters(),
                                                  torch::optim::AdamOptions(0.01));
    case Opt::adamw:
      return std::make_unique<torch::optim::AdamW>(
          net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true));
    case Opt::rmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          net->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.5).centered(true));
    case Opt::adagrad:
      return std::make_unique<torch::optim::Adagrad>(
          net->parameters(), torch::optim::AdagradOptions(0.1).lr_decay(0.05));
  }
  return nullptr;
}

// Plain LibTorch on the whole batch.
std::vector<torch::Tensor> train_plain(Opt which, int steps, const Data& d,
                                       torch::Device device = torch::kCPU) {
  Net net = make_net(1, device);
  auto opt = make_optimizer(net, which);
  const auto x = d.x.to(device), y = d.y.to(device);
  for (int i = 0; i < steps; ++i) {
    opt->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt->step();
  }
  return params_of(net);
}

using Job = test::UnstartedJob;

// `n` unstarted peers; on a GPU they run device collectives through staging, since NCCL takes
// one rank per GPU and process.
Job make_job(int n, bool on_gpu = false) {
  if (!on_gpu) return test::make_unstarted_job(n, "torch-test");
  Job j;
  j.cluster.version = 1;
  for (int i = 0; i < n; ++i) {
    PeerOptions o;
    o.job_token = "torch-test";
    o.device_backend = DeviceBackend::staging;
    test::stretch_heartbeat(o);
    j.peers.push_back(std::make_unique<Peer>(o));
    j.cluster.workers.push_back(WorkerSpec{j.peers.back()->endpoint(), i});
  }
  return j;
}

// `n` workers, worker r on rows [r·B/n, (r+1)·B/n) of the batch, initial values from seed 1 + r
// (rank 0's win at join). Returns each worker's parameters and its last metrics.
struct Trained {
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::map<std::string, double>> metrics;
  std::vector<std::size_t> buckets;
  std::vector<double> momentum_sum;  // SGD: the sum of |momentum buffer| over the parameters
};

Trained train_kf(int n, Opt which, int steps, const Data& d, DistributedOptimizerOptions o = {},
                 torch::Device device = torch::kCPU,
                 const nlohmann::json& settings = nlohmann::json::object()) {
  Job job = make_job(n, device.is_cuda());
  job.cluster.settings = settings;
  Trained t;
  t.params.resize(n);
  t.metrics.resize(n);
  t.buckets.resize(n);
  t.momentum_sum.resize(n);
  std::vector<Net> nets;
  for (int r = 0; r < n; ++r) nets.push_back(make_net(1 + r, device));
  const auto rows = d.x.size(0);
  test::run_all(n, [&](int r) {
    State state;
    auto opt = make_optimizer(nets[r], which);
    Session s(std::move(job.peers[r]), job.cluster, state, SessionOptions{});
    DistributedOptimizer dist(s, *opt, o);
    dist.register_state(state, *nets[r]);
    ASSERT_TRUE(s.join());
    const auto lo = rows * r / n, hi = rows * (r + 1) / n;
    const auto x = d.x.slice(0, lo, hi).to(device), y = d.y.slice(0, lo, hi).to(device);
    for (int i = 0; i < steps; ++i) {
      ASSERT_EQ(s.step([&] {
        dist.zero_grad();
        dist.begin_step(hi - lo, rows);
        torch::nn::functional::cross_entropy(nets[r]->forward(x), y).backward();
        dist.step();
      }),
                Session::Outcome::committed);
    }
    t.params[r] = params_of(nets[r]);
    t.metrics[r] = s.metrics();
    t.buckets[r] = dist.buckets();
    for (const auto& [key, entry] : opt->state()) {
      if (const auto* ps = dynamic_cast<const torch::optim::SGDParamState*>(entry.get())) {
        t.momentum_sum[r] += ps->momentum_buffer().abs().sum().item<double>();
      }
    }
  });
  return t;
}

class TorchAdapter : public ::testing::TestWithParam<Opt> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(TorchAdapter, OneWorkerGivesExactlyThePlainParameters) {
  const Data d = make_data(32);
  const auto want = train_plain(GetParam(), 15, d);
  const Trained got = train_kf(1, GetParam(), 15, d);
  ASSERT_EQ(got.params[0].size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.params[0][i], want[i])) << "parameter " << i;
  }
}

TEST_P(TorchAdapter, TwoWorkersOnHalvesMatchOneProcessOnTheWholeBatch) {
  const Data d = make_data(32);
  const auto want = train_plain(GetParam(), 15, d);
  const Trained got = train_kf(2, GetParam(), 15, d);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.params[0][i], got.params[1][i])) << "workers differ at " << i;
    EXPECT_TRUE(torch::allclose(got.params[0][i], want[i], 1e-4, 1e-5))
        << "parameter " << i << ": max difference "
        << (got.params[0][i] - want[i]).abs().max().item<float>();
  }
}

TEST_P(TorchAdapter, UnevenShardsAreWeightedBySamples) {
  // 3 workers on 32 rows: 10, 11 and 11 samples.
  const Data d = make_data(32);
  const auto want = train_plain(GetParam(), 10, d);
  const Trained got = train_kf(3, GetParam(), 10, d);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.params[2][i], want[i], 1e-4, 1e-5)) << "parameter " << i;
  }
}

// What register_state puts into the State: the model, then each optimizer's own state, so that
// a restore or a joiner's sync brings back the optimizer as it was.
TEST_P(TorchAdapter, TheOptimizersStateIsRegistered) {
  Net net = make_net(1);
  auto opt = make_optimizer(net, GetParam());
  Job job = make_job(1);
  State state;
  Session s(std::move(job.peers[0]), job.cluster, state, SessionOptions{});
  DistributedOptimizer dist(s, *opt);
  dist.register_state(state, *net);
  const std::string layout = state.layout();
  const std::map<Opt, std::vector<std::string>> want{
      {Opt::sgd, {"optimizer/0/momentum:"}},
      {Opt::adam, {"optimizer/0/exp_avg:", "optimizer/0/exp_avg_sq:", "optimizer/adam_step"}},
      {Opt::adamw, {"optimizer/0/exp_avg:", "optimizer/0/max_exp_avg_sq:", "optimizer/adamw_step"}},
      {Opt::rmsprop,
       {"optimizer/0/square_avg:", "optimizer/0/momentum:", "optimizer/0/grad_avg:",
        "optimizer/rmsprop_step"}},
      {Opt::adagrad, {"optimizer/0/sum:", "optimizer/adagrad_step"}},
  };
  EXPECT_NE(layout.find("model/"), std::string::npos) << layout;
  for (const auto& name : want.at(GetParam())) {
    EXPECT_NE(layout.find(name), std::string::npos) << name << " in " << layout;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TorchAdapter,
                         ::testing::Values(Opt::sgd, Opt::adam, Opt::adamw, Opt::rmsprop,
                                           Opt::adagrad),
                         [](const auto& p) { return std::string(name_of(p.param)); });

// LBFGS steps through a closure that evaluates the model again: its state cannot be registered.
TEST(TorchAdapterState, LbfgsIsRefusedNamingTheOnesThatWork) {
  Net net = make_net(1);
  torch::optim::LBFGS lbfgs(net->parameters(), torch::optim::LBFGSOptions(0.1));
  Job job = make_job(1);
  State state;
  Session s(std::move(job.peers[0]), job.cluster, state, SessionOptions{});
  DistributedOptimizer dist(s, lbfgs);
  try {
    dist.register_state(state, *net);
    FAIL() << "LBFGS's state was registered";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("AdamW, RMSprop and Adagrad"), std::string::npos)
        << e.what();
  }
}

// Model averaging after every step, from one model, on equal shards: each worker's momentum
// follows the same linear recursion as the whole batch's, so the averaged model is synchronous
// SGD's (up to rounding), and every worker holds it.
TEST(TorchAdapterModes, SmaWithPeriodOneMatchesSynchronousSgdWithMomentum) {
  torch::set_num_threads(1);
  const Data d = make_data(32);
  const Trained sync = train_kf(2, Opt::sgd, 12, d);
  const Trained sma = train_kf(2, Opt::sgd, 12, d, {}, torch::kCPU, {{"mode", "sma"}});
  for (std::size_t i = 0; i < sync.params[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(sma.params[0][i], sma.params[1][i])) << "workers differ at " << i;
    EXPECT_TRUE(torch::allclose(sma.params[0][i], sync.params[0][i], 1e-4, 1e-5))
        << "parameter " << i << ": max difference "
        << (sma.params[0][i] - sync.params[0][i]).abs().max().item<float>();
  }
  EXPECT_EQ(sync.metrics[0].count("gns.step_sqr"), 1u);
  EXPECT_EQ(sma.metrics[0].count("gns.step_sqr"), 0u) << "no averaged gradient, no noise scale";
}

TEST(TorchAdapterModes, CompressedGradientsKeepWorkersIdenticalAndLosslessOnesExact) {
  torch::set_num_threads(1);
  const Data d = make_data(32);
  const Trained plain = train_kf(2, Opt::sgd, 10, d);
  DistributedOptimizerOptions unmasked;
  unmasked.momentum_masking = false;
  const Trained all =
      train_kf(2, Opt::sgd, 10, d, unmasked, torch::kCPU, {{"compression", "topk:1"}});
  const Trained half = train_kf(2, Opt::sgd, 10, d, {}, torch::kCPU, {{"compression", "fp16"}});
  const Trained some =
      train_kf(2, Opt::sgd, 10, d, {}, torch::kCPU, {{"compression", "topk:0.25"}});
  bool sparse_differs = false;
  for (std::size_t i = 0; i < plain.params[0].size(); ++i) {
    for (const Trained* t : {&all, &half, &some}) {
      EXPECT_TRUE(torch::equal(t->params[0][i], t->params[1][i])) << "workers differ at " << i;
    }
    // With momentum correction (unmasked): the compressors carry SGD's momentum, which at ratio
    // 1 is momentum SGD again.
    EXPECT_TRUE(torch::allclose(all.params[0][i], plain.params[0][i], 1e-5, 1e-6))
        << "topk:1 sends every value";
    EXPECT_TRUE(torch::allclose(half.params[0][i], plain.params[0][i], 1e-2, 1e-3))
        << "fp16 is close";
    sparse_differs = sparse_differs || !torch::equal(some.params[0][i], plain.params[0][i]);
  }
  EXPECT_TRUE(sparse_differs) << "topk:0.25 leaves values in the residual";
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(plain.momentum_sum[r], 0.0);
    EXPECT_GT(half.momentum_sum[r], 0.0) << "fp16 leaves the momentum to SGD";
    EXPECT_EQ(all.momentum_sum[r], 0.0) << "the sparse kinds carry the momentum themselves";
    EXPECT_EQ(some.momentum_sum[r], 0.0);
  }
  EXPECT_LT(some.metrics[0].at("comm_bytes"), plain.metrics[0].at("comm_bytes"));
}

TEST(TorchAdapterModes, SmaWithALongerPeriodAveragesEveryPeriodthStep) {
  torch::set_num_threads(1);
  const Data d = make_data(32);
  const nlohmann::json mode = {{"mode", "sma:period=4"}};
  const Trained averaged = train_kf(2, Opt::adam, 8, d, {}, torch::kCPU, mode);  // step 8 averages
  const Trained between = train_kf(2, Opt::adam, 6, d, {}, torch::kCPU, mode);
  bool differ = false;
  for (std::size_t i = 0; i < averaged.params[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(averaged.params[0][i], averaged.params[1][i])) << "parameter " << i;
    differ = differ || !torch::equal(between.params[0][i], between.params[1][i]);
  }
  EXPECT_TRUE(differ) << "two local steps after an average, the workers' models differ";
}

TEST(TorchAdapterBuckets, OverlappedBucketsAndOneAllreduceAgreeBitForBit) {
  torch::set_num_threads(1);
  const Data d = make_data(32);
  DistributedOptimizerOptions small;
  small.bucket_bytes = 256;  // several buckets for this small model
  DistributedOptimizerOptions one;
  one.overlap = false;
  const Trained a = train_kf(2, Opt::sgd, 8, d, small);
  const Trained b = train_kf(2, Opt::sgd, 8, d, one);
  EXPECT_GT(a.buckets[0], 2u);
  EXPECT_EQ(b.buckets[0], 1u);
  for (std::size_t i = 0; i < a.params[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(a.params[0][i], b.params[0][i])) << "parameter " << i;
  }
}

// A layer of 4 MiB: its gradient bucket and, with model averaging, the parameter vector are
// exchanged in pieces too large for the shared-memory rings, which go single-copy, and both live in
// kf::SharedMemory, so the peer on this host reduces them in place. The workers end with the same
// model either way.
TEST(TorchAdapterBuckets, LargeBucketsAndAveragedModelsAreReadInPlace) {
  torch::set_num_threads(1);
  for (const char* mode : {"sync", "sma"}) {
    Job job = make_job(2);
    job.cluster.settings = {{"mode", mode}};
    std::vector<torch::nn::Linear> nets;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(1 + r);
      nets.emplace_back(torch::nn::LinearOptions(1024, 1024).bias(false));
    }
    torch::manual_seed(7);
    const torch::Tensor x = torch::randn({8, 1024}), y = torch::randn({8, 1024});
    std::vector<std::uint64_t> in_place(2);
    test::run_all(2, [&](int r) {
      State state;
      torch::optim::SGD opt(nets[r]->parameters(), torch::optim::SGDOptions(0.01));
      Session s(std::move(job.peers[r]), job.cluster, state, SessionOptions{});
      DistributedOptimizer dist(s, opt, DistributedOptimizerOptions{});
      dist.register_state(state, *nets[r]);
      ASSERT_TRUE(s.join());
      const auto half = x.slice(0, 4 * r, 4 * r + 4), target = y.slice(0, 4 * r, 4 * r + 4);
      for (int i = 0; i < 2; ++i) {
        ASSERT_EQ(s.step([&] {
          dist.zero_grad();
          torch::mse_loss(nets[r]->forward(half), target).backward();
          dist.step();
        }),
                  Session::Outcome::committed);
      }
      in_place[r] = s.peer().transport_stats().shared_read_bytes;
    });
    EXPECT_TRUE(torch::equal(nets[0]->weight, nets[1]->weight)) << mode;
    for (int r = 0; r < 2; ++r) EXPECT_GT(in_place[r], 0u) << mode << ", rank " << r;
  }
}

TEST(TorchAdapterMonitors, TheExchangeFeedsTheNoiseScaleAndCommunication) {
  torch::set_num_threads(1);
  const Data d = make_data(64);
  const Trained t = train_kf(2, Opt::sgd, 5, d);
  for (int r = 0; r < 2; ++r) {
    const auto& m = t.metrics[r];
    ASSERT_EQ(m.count("gns.step_sqr"), 1u) << "rank " << r;
    EXPECT_EQ(m.at("gns.skipped"), 0.0);
    EXPECT_EQ(m.at("samples"), 64.0);
    EXPECT_GT(m.at("comm_bytes"), 0.0);
    EXPECT_EQ(m, t.metrics[0]) << "every worker sees the same metrics";
  }
}

// CUDA parameters: buckets on the device, norms computed there, collectives on device buffers.
// In one process every worker shares the GPU, so these go through the staging backend; the
// NCCL backend is run by tests/gpu in separate processes.
class TorchAdapterCuda : public ::testing::TestWithParam<Opt> {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device for LibTorch here (Debian's LibTorch is CPU only; "
                      "tools/gpu-check builds against a CUDA LibTorch)";
    }
  }
  const torch::Device gpu{torch::kCUDA, 0};
};

TEST_P(TorchAdapterCuda, OneWorkerGivesThePlainParameters) {
  const Data d = make_data(32);
  const auto want = train_plain(GetParam(), 15, d, gpu);
  const Trained got = train_kf(1, GetParam(), 15, d, {}, gpu);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.params[0][i], want[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST_P(TorchAdapterCuda, TwoWorkersOnHalvesMatchOneProcessOnTheWholeBatch) {
  const Data d = make_data(32);
  const auto want = train_plain(GetParam(), 15, d, gpu);
  DistributedOptimizerOptions small;
  small.bucket_bytes = 256;  // several buckets, started from backward's hooks
  const Trained got = train_kf(2, GetParam(), 15, d, small, gpu);
  EXPECT_GT(got.buckets[0], 2u);
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(got.params[0][i], got.params[1][i])) << "workers differ at " << i;
    EXPECT_TRUE(torch::allclose(got.params[0][i], want[i], 1e-4, 1e-5)) << "parameter " << i;
  }
  EXPECT_EQ(got.metrics[0], got.metrics[1]) << "every worker sees the same metrics";
  EXPECT_EQ(got.metrics[0].count("gns.step_sqr"), 1u);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TorchAdapterCuda, ::testing::Values(Opt::sgd, Opt::adam),
                         [](const auto& p) {
                           return std::string(p.param == Opt::sgd ? "SgdMomentum" : "Adam");
                         });

// A torch::data dataset whose example i is ([i, 2i], i % 3).
class Counting : public torch::data::datasets::Dataset<Counting> {
 public:
  torch::data::Example<> get(std::size_t i) override {
    const auto v = static_cast<float>(i);
    return {torch::tensor({v, 2 * v}), torch::tensor(static_cast<std::int64_t>(i % 3))};
  }
  torch::optional<std::size_t> size() const override { return 10; }
};

TEST(TorchData, TheSamplersShareOfADatasetIsStackedInItsOrder) {
  Counting data;
  ElasticSampler sampler(*data.size(), /*seed=*/3);
  sampler.start_epoch(0);
  std::vector<std::size_t> all;
  for (int rank = 0; rank < 2; ++rank) {
    const auto mine = sampler.batch(rank, 2, 4);
    const torch::data::Example<> b = elastic_batch(data, mine);
    ASSERT_EQ(b.data.sizes(), (std::vector<std::int64_t>{2, 2}));
    for (std::size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(b.data[k][0].item<float>(), static_cast<float>(mine[k]));
      EXPECT_EQ(b.target[k].item<std::int64_t>(), static_cast<std::int64_t>(mine[k] % 3));
      all.push_back(mine[k]);
    }
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "no example twice";
  EXPECT_FALSE(elastic_batch(data, {}).data.defined());
}

}  // namespace
}  // namespace kf
