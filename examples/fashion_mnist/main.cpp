// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST with LibTorch on kf: an MLP or a small CNN trained data-parallel by every worker
// of a kf job, elastic when started by `kfrun --watch`, adaptive when the job file names policies
// (kfrun --job). Start it with kfrun (see docs/torch.md and tools/run-demo):
//   kfrun -np 2 --job examples/fashion_mnist/job.yaml -- build/examples/fashion_mnist
// The global batch and the learning rate are the cluster's settings `batch_size` and `lr`, so a
// policy that changes them changes them on every worker at the same step. The training state
// (model, optimizer, epoch and position in it) is a kf::State: it is committed every step,
// restored after a failure and sent to joiners. Rank 0 prints a progress line every --log-every
// steps and the test accuracy after each epoch (every worker evaluates a shard of the test set;
// in a mode whose models differ, the accuracy at the end is that of their average, the job's
// model), and at the end the membership changes, the batch sizes used, and
//   final test accuracy: 0.NNN (workers at end: N, membership changes: N)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "idx.hpp"
#include "kf/runtime/elastic_sampler.hpp"
#include "kf/runtime/piece_sampler.hpp"
#include "kf/runtime/session.hpp"
#include "kf/torch/data.hpp"
#include "kf/torch/distributed_optimizer.hpp"

namespace {

constexpr double kMean = 0.2860, kStd = 0.3530;  // of Fashion-MNIST's training pixels

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 128));
    fc3 = register_module("fc3", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1(x.view({-1, 784})));
    return fc3(torch::relu(fc2(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)));
    fc1 = register_module("fc1", torch::nn::Linear(32 * 4 * 4, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x.view({-1, 1, 28, 28}))), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Cnn);

// One split of Fashion-MNIST as a torch::data dataset: normalized [784] float images and their
// labels, read from the IDX bytes on demand.
class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  FashionMnist(const fmnist::Split& split, std::size_t limit)
      : split_(split),
        size_(limit > 0 ? std::min(limit, split.images.count) : split.images.count) {}
  torch::data::Example<> get(std::size_t i) override {
    torch::Tensor x = torch::empty({784});
    float* px = x.data_ptr<float>();
    const std::uint8_t* img = split_.images.pixels.data() + i * 784;
    for (int k = 0; k < 784; ++k) px[k] = static_cast<float>((img[k] / 255.0 - kMean) / kStd);
    return {x, torch::tensor(static_cast<std::int64_t>(split_.labels[i]), torch::kLong)};
  }
  torch::optional<std::size_t> size() const override { return size_; }

 private:
  const fmnist::Split& split_;
  std::size_t size_;
};

// FNV-1a over the parameters' bytes: equal on two workers iff they hold the same model.
std::uint64_t parameters_hash(torch::nn::Module& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& dp : model.parameters()) {
    const torch::Tensor p = dp.detach().to(torch::kCPU).contiguous();
    const auto* b = static_cast<const unsigned char*>(p.data_ptr());
    for (std::int64_t i = 0; i < p.numel() * static_cast<std::int64_t>(sizeof(float)); ++i) {
      h = (h ^ b[i]) * 1099511628211ull;
    }
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST with LibTorch on kf (start it with kfrun)", "fashion_mnist"};
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string model_name = "mlp";
  int epochs = 3, log_every = 50, threads = 1, seed = 1;
  std::int64_t batch = 64;
  double lr = 0.05, momentum = 0.9;
  std::size_t limit = 0;
  bool no_overlap = false;
  double stop_at = 0;
  app.add_option("--data", data, "directory of the IDX files (gzip or not)")->capture_default_str();
  app.add_option("--model", model_name, "mlp or cnn")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--epochs", epochs)->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", batch, "global batch when the cluster settings have none")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", lr, "learning rate when the cluster settings have none")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--momentum", momentum)->check(CLI::Range(0.0, 0.999))->capture_default_str();
  app.add_option("--log-every", log_every, "steps between progress lines")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--threads", threads, "LibTorch threads per worker")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--seed", seed, "initial weights (rank 0's are used)")->capture_default_str();
  app.add_option("--limit", limit, "train on the first N images only (0: all)");
  app.add_flag("--no-overlap", no_overlap, "one allreduce after backward instead of buckets");
  std::size_t bucket_kb = 4096;
  app.add_option("--bucket-kb", bucket_kb, "gradient bucket size in KiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  std::int64_t eval_every = 0;
  app.add_option("--eval-every", eval_every,
                 "also evaluate every N training samples; prints 'eval samples S step T "
                 "train_time SECONDS test accuracy A batch B' (train_time leaves evaluations out), "
                 "and once more at the end, of the averaged model, in a mode whose models differ")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--stop-at", stop_at, "stop once the test accuracy reaches this (0: never)")
      ->check(CLI::Range(0.0, 1.0));
  std::string mode_name = "sync-sgd", compression = "none";
  int period = 1;
  std::int64_t post_local = 0;
  app.add_option("--mode", mode_name,
                 "training mode when the cluster settings have none (docs/training-modes.md)")
      ->check(CLI::IsMember({"sync-sgd", "sma", "pair-avg", "async-ps"}))
      ->capture_default_str();
  app.add_option("--period", period, "sma: steps between model averages")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--post-local", post_local, "sma: synchronous SGD for the first N steps")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  int max_staleness = -1, soft_sync = -1, scale_lr = -1;
  app.add_option("--max-staleness", max_staleness,
                 "async-ps: steps the server's parameters in a worker's model may lag (default 4)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--soft-sync", soft_sync,
                 "async-ps: the server applies the mean of each N updates as one (default 1)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--scale-lr", scale_lr,
                 "async-ps: 1 divides each update by its staleness, 0 does not (default 1)")
      ->check(CLI::Range(0, 1));
  app.add_option("--compression", compression,
                 "none, fp16, bf16, topk:RATIO, randomk:RATIO or powersgd:RANK, when the cluster "
                 "settings have none")
      ->capture_default_str();
  int momentum_correction = 1;
  app.add_option("--momentum-correction", momentum_correction,
                 "topk and randomk: 1 lets the compressors carry the momentum (momentum "
                 "correction), 0 leaves it to SGD")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  int momentum_masking = 1;
  app.add_option("--momentum-masking", momentum_masking,
                 "with momentum correction: 1 restarts the velocity of each value sent at zero, "
                 "0 does not")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  std::string boundaries;
  app.add_option("--boundaries", boundaries,
                 "every-step or on-change, when the cluster settings do not say (settings "
                 "\"boundaries\"; in pair-avg, on-change lets each worker train at its own pace "
                 "through its own pieces of the epoch: docs/elastic.md)")
      ->check(CLI::IsMember({"every-step", "on-change"}));
  bool balance = false;
  app.add_flag("--balance", balance,
               "batch parts by each worker's measured speed, when the cluster settings do not "
               "say (settings \"balance\"; docs/training-modes.md, \"Stragglers\")");
  int slow_rank = -1;
  app.add_option("--slow-rank", slow_rank,
                 "the worker of this rank computes 3x slower (it sleeps twice its compute time "
                 "each step): what a straggler costs each mode")
      ->check(CLI::Range(0, 1 << 20));
  std::string device_name = "cpu";
  bool one_gpu = false;
  app.add_option("--device", device_name, "where the model trains: cpu or cuda (docs/gpu.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--one-gpu", one_gpu,
               "the workers share one GPU (tests): each sets NCCL_HOSTID to its own address");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // a usage error
  }
  // The mode and compression as settings text, checked before any worker starts training.
  nlohmann::json defaults = nlohmann::json::object();
  try {
    if (mode_name != "sma" && (period != 1 || post_local != 0)) {
      std::cerr << "fashion_mnist: --period and --post-local are for --mode sma\n";
      return 2;
    }
    if (mode_name != "async-ps" && (max_staleness >= 0 || soft_sync >= 0 || scale_lr >= 0)) {
      std::cerr << "fashion_mnist: --max-staleness, --soft-sync and --scale-lr are for --mode "
                   "async-ps\n";
      return 2;
    }
    std::string mode_text = mode_name;
    if (mode_name == "sma" && (period != 1 || post_local != 0)) {
      mode_text += ":period=" + std::to_string(period);
      if (post_local != 0) mode_text += ",post_local=" + std::to_string(post_local);
    }
    std::vector<std::string> ps_params;
    if (max_staleness >= 0) ps_params.push_back("max_staleness=" + std::to_string(max_staleness));
    if (soft_sync >= 0) ps_params.push_back("soft_sync=" + std::to_string(soft_sync));
    if (scale_lr >= 0) ps_params.push_back("scale_lr=" + std::to_string(scale_lr));
    for (std::size_t i = 0; i < ps_params.size(); ++i) {
      mode_text += (i == 0 ? ":" : ",") + ps_params[i];
    }
    const kf::ModeSpec mode = kf::parse_mode(mode_text);
    defaults["mode"] = mode.str();
    defaults["compression"] = kf::parse_compression(compression).str();
    if (balance) defaults["balance"] = true;
    if (!boundaries.empty()) defaults["boundaries"] = boundaries;
  } catch (const std::invalid_argument& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 2;
  }

  fmnist::Split train, test;
  try {
    train = fmnist::read_split(data, "train");
    test = fmnist::read_split(data, "t10k");
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
  if (train.images.rows != 28 || train.images.cols != 28) {
    std::cerr << "fashion_mnist: " << data << ": images are " << train.images.rows << "x"
              << train.images.cols << ", expected 28x28\n";
    return 1;
  }
  FashionMnist train_set(train, limit), test_set(test, 0);
  const std::size_t train_count = *train_set.size();

  if (device_name == "cuda" && !torch::cuda::is_available()) {
    std::cerr << "fashion_mnist: --device cuda, but LibTorch sees no CUDA device (this "
                 "LibTorch may be built without CUDA)\n";
    return 1;
  }
  if (one_gpu) {
    if (const char* self = std::getenv("KF_SELF")) {
      setenv("NCCL_HOSTID", (std::string("kf-") + self).c_str(), 1);
    }
  }
  const torch::Device device =
      device_name == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::set_num_threads(threads);
  torch::manual_seed(seed);
  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (model_name == "mlp") {
    Mlp m;
    model = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  } else {
    Cnn m;
    model = m.ptr();
    forward = [m](const torch::Tensor& x) mutable { return m->forward(x); };
  }
  model->to(device);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));

  kf::State state;
  std::int64_t& epoch = state.counter("epoch");
  std::int64_t& position = state.counter("position");
  // The last test accuracy in millionths: in the state, so that a joiner knows it too.
  std::int64_t& accuracy_ppm = state.counter("test_accuracy_ppm");
  // With boundaries on change: the workers' pieces of each epoch, and the job's samples at the
  // last evaluation.
  kf::PieceSampler pieces(train_count, /*seed=*/7, state);
  std::int64_t& evaluated_at = state.counter("evaluated_at");
  std::unique_ptr<kf::Session> session;
  std::unique_ptr<kf::DistributedOptimizer> opt;
  int loss_slot = -1, acc_slot = -1;
  try {
    session = kf::Session::from_environment(state, defaults);
    kf::DistributedOptimizerOptions o;
    o.overlap = !no_overlap;
    o.bucket_bytes = bucket_kb << 10;
    o.momentum_correction = momentum_correction == 1;
    o.momentum_masking = momentum_masking == 1;
    opt = std::make_unique<kf::DistributedOptimizer>(*session, sgd, o);
    opt->register_state(state, *model);
    loss_slot = session->add_metric("loss");
    acc_slot = session->add_metric("train_accuracy");
    if (!session->join()) return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }

  kf::ElasticSampler sampler(train_count, /*seed=*/7);
  const auto test_accuracy = [&] { return static_cast<double>(accuracy_ppm) / 1e6; };
  std::vector<std::pair<std::int64_t, std::int64_t>> batches;  // (step, global batch) changes
  const auto t_start = std::chrono::steady_clock::now();
  // After the first step of each membership change every worker prints the model it holds, so
  // that a joiner's state can be checked against the survivors' ("membership v4 step 120 params
  // <hash>"): had the joiner started from another state, its model would differ after the step.
  // (A change is recorded once its first step has committed; a joiner's join once it joined.)
  // In a mode whose models differ between averages (sma with a period), the hash is the one
  // the worker held when that first step began: the model the change gave every worker.
  // Every worker evaluates its shard of the test set; one allreduce adds them up. The time it
  // takes is kept out of train_seconds().
  double eval_seconds = 0;
  double exposed_seconds = 0;  // allreduce time not hidden by backward, summed over the steps
  const auto evaluate = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    const std::size_t n = test.images.count;
    const std::size_t lo = n * session->rank() / session->size();
    const std::size_t hi = n * (session->rank() + 1) / session->size();
    double counts[2] = {0, static_cast<double>(hi - lo)};
    for (std::size_t at = lo; at < hi; at += 1000) {
      std::vector<std::size_t> idx;
      for (std::size_t i = at; i < std::min(hi, at + 1000); ++i) idx.push_back(i);
      const torch::data::Example<> b = kf::elastic_batch(test_set, idx);
      counts[0] +=
          forward(b.data.to(device)).argmax(1).eq(b.target.to(device)).sum().item<double>();
    }
    session->peer().allreduce("fmnist.eval", kf::buffer(counts, 2), kf::buffer(counts, 2)).wait();
    eval_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return counts[0] / counts[1];
  };
  const auto train_seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() -
           eval_seconds;
  };
  // Rank 0's lines: the test accuracy after each epoch, and every --eval-every samples.
  const auto print_epoch = [&] {
    if (session->rank() != 0) return;
    std::printf("epoch %lld test accuracy %.4f (%.1f s)\n", static_cast<long long>(epoch),
                test_accuracy(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
    std::fflush(stdout);
  };
  const auto print_eval = [&](std::int64_t trained, std::int64_t step, double acc,
                              std::int64_t gbatch) {
    if (session->rank() != 0) return;
    std::printf("eval samples %lld step %lld train_time %.3f test accuracy %.4f batch %lld\n",
                static_cast<long long>(trained), static_cast<long long>(step), train_seconds(), acc,
                static_cast<long long>(gbatch));
    std::fflush(stdout);
  };
  std::size_t changes_seen = 0;
  std::uint64_t hash_at_step_start = 0;
  const auto print_changes = [&] {
    for (; changes_seen < session->changes().size(); ++changes_seen) {
      const bool diverging = kf::models_may_diverge(session->mode());
      std::printf("membership v%llu step %lld workers %d params %016llx\n",
                  static_cast<unsigned long long>(session->changes()[changes_seen].to_version),
                  static_cast<long long>(session->steps()), session->size(),
                  static_cast<unsigned long long>(diverging ? hash_at_step_start
                                                            : parameters_hash(*model)));
      std::fflush(stdout);
    }
  };
  // Boundaries on change: right after each boundary (where every worker is) the next plan of
  // pieces, and the evaluations due by then. Returns false when this worker left.
  const auto settle_pieces = [&]() -> bool {
    for (;;) {
      if (const auto out = pieces.settle(*session)) {
        if (*out == kf::Session::Outcome::left) return false;
        print_changes();
        continue;
      }
      if (pieces.last_settle() == kf::PieceSampler::Settled::kept) return true;
      epoch = pieces.epoch();
      const std::int64_t trained = epoch * static_cast<std::int64_t>(train_count) +
                                   static_cast<std::int64_t>(pieces.used_at_plan());
      try {
        if (pieces.epoch_ended()) {
          accuracy_ppm = std::llround(evaluate() * 1e6);
          evaluated_at = trained;
          print_epoch();
        }
        if (eval_every > 0 && trained / eval_every != evaluated_at / eval_every) {
          const double acc = evaluate();
          evaluated_at = trained;
          print_eval(trained, session->steps(), acc,
                     session->settings().value("batch_size", batch));
        }
      } catch (const kf::Error& e) {
        if (session->recover(e) == kf::Session::Outcome::left) return false;
        print_changes();
        continue;
      }
      return true;
    }
  };
  try {
    // The job's length may be changed while it runs (cluster settings "epochs").
    for (;;) {
      const bool on_change = session->boundaries_on_change();
      if (on_change && !settle_pieces()) return 0;
      if (epoch >= session->settings().value("epochs", static_cast<std::int64_t>(epochs)) ||
          session->stop_requested() || (stop_at > 0 && test_accuracy() >= stop_at)) {
        break;
      }
      const std::int64_t gbatch = session->settings().value("batch_size", batch);
      const double rate = session->settings().value("lr", lr);
      if (rate != opt->learning_rate()) opt->set_learning_rate(rate);
      if (batches.empty() || batches.back().second != gbatch) {
        batches.emplace_back(session->steps(), gbatch);
      }
      std::size_t total = static_cast<std::size_t>(gbatch);
      std::vector<std::size_t> mine;
      if (on_change) {
        // This worker's next part of its own piece: an equal share of the global batch.
        mine = pieces.take(
            *session, std::max<std::size_t>(1, total / static_cast<std::size_t>(session->size())));
      } else {
        sampler.start_epoch(epoch, static_cast<std::size_t>(position));
        total = sampler.step_samples(static_cast<std::size_t>(gbatch));
        // This worker's part of the step: equal, or by measured speed with settings "balance".
        const auto [first, count] = session->batch_part(total);
        mine = sampler.range(first, count);
      }
      const auto outcome = session->step([&] {
        if (kf::models_may_diverge(session->mode())) hash_at_step_start = parameters_hash(*model);
        opt->zero_grad();
        opt->begin_step(static_cast<std::int64_t>(mine.size()), static_cast<std::int64_t>(total));
        const auto compute_from = std::chrono::steady_clock::now();
        if (!mine.empty()) {
          const torch::data::Example<> b = kf::elastic_batch(train_set, mine);
          const torch::Tensor x = b.data.to(device);
          const torch::Tensor y = b.target.to(device);
          const torch::Tensor out = forward(x);
          const torch::Tensor loss = torch::nn::functional::cross_entropy(out, y);
          loss.backward();
          session->set_metric(loss_slot, loss.item<double>());
          session->set_metric(acc_slot, out.argmax(1).eq(y).sum().item<double>() /
                                            static_cast<double>(mine.size()));
        }
        // --slow-rank: this worker's compute takes 3x as long (a slower machine), by sleeping
        // twice what forward and backward took.
        if (session->rank() == slow_rank) {
          std::this_thread::sleep_for(2 * (std::chrono::steady_clock::now() - compute_from));
        }
        opt->step();
        exposed_seconds += opt->exposed_comm().count();
        if (on_change) return;  // the pieces and evaluations move at boundaries (settle_pieces)
        sampler.advance(static_cast<std::size_t>(gbatch));
        position = static_cast<std::int64_t>(sampler.position());
        const std::int64_t trained =
            epoch * static_cast<std::int64_t>(train_count) + position;  // samples so far
        if (eval_every > 0 &&
            trained / eval_every != (trained - static_cast<std::int64_t>(total)) / eval_every) {
          print_eval(trained, session->steps() + 1, evaluate(), gbatch);
        }
        if (sampler.epoch_done()) {
          accuracy_ppm = std::llround(evaluate() * 1e6);
          ++epoch;
          position = 0;
          print_epoch();
        }
      });
      if (outcome == kf::Session::Outcome::left) return 0;
      print_changes();
      if (outcome == kf::Session::Outcome::committed && session->rank() == 0 &&
          session->steps() % log_every == 0) {
        const auto& m = session->metrics();
        const auto get = [&](const char* k) { return m.count(k) ? m.at(k) : 0.0; };
        std::printf(
            "epoch %lld step %lld loss %.4f acc %.3f workers %d batch %lld lr %.4g "
            "samples/s %.0f\n",
            static_cast<long long>(epoch), static_cast<long long>(session->steps()), get("loss"),
            get("train_accuracy"), session->size(), static_cast<long long>(gbatch), rate,
            get("throughput"));
        std::fflush(stdout);
      }
    }
    // In a mode whose models differ between averages, the job's model is their average: its
    // accuracy is the job's (the evaluations before it mixed the workers' own models).
    if (kf::models_may_diverge(session->mode())) {
      opt->average_parameters();
      accuracy_ppm = std::llround(evaluate() * 1e6);
      const std::int64_t trained =
          epoch * static_cast<std::int64_t>(train_count) +
          (session->boundaries_on_change() ? static_cast<std::int64_t>(pieces.used_at_plan())
                                           : position);
      if (eval_every > 0) {
        print_eval(trained, session->steps(), test_accuracy(),
                   session->settings().value("batch_size", batch));
      }
    }
    // Every worker must hold the same parameters: a consensus collective says whether they do.
    std::vector<float> flat;
    for (const auto& dp : model->parameters()) {
      const torch::Tensor p = dp.detach().to(torch::kCPU).contiguous();
      const float* v = p.data_ptr<float>();
      flat.insert(flat.end(), v, v + p.numel());
    }
    bool same = false;
    session->peer().consensus("fmnist.final", kf::buffer(flat.data(), flat.size()), &same).wait();
    if (session->rank() == 0) {
      std::printf("parameters identical on all %d workers: %s\n", session->size(),
                  same ? "yes" : "NO");
    }
    if (!same) {
      std::cerr << "fashion_mnist: the workers hold different parameters\n";
      return 3;
    }
    session->finish();
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << "\n";
    return 1;
  }
  if (session->rank() == 0) {
    std::printf("membership changes:\n");
    for (const auto& c : session->changes()) std::printf("  %s\n", c.summary().c_str());
    std::printf("global batch sizes (from step):");
    for (const auto& [step, b] : batches) {
      std::printf(" %lld@%lld", static_cast<long long>(b), static_cast<long long>(step));
    }
    // Membership changes: resizes and recoveries (not the join, nor settings-only versions).
    std::size_t changes = 0;
    for (const auto& c : session->changes()) changes += c.kind == "resize" || c.kind == "recovery";
    const auto steps = static_cast<double>(std::max<std::int64_t>(1, session->steps()));
    std::printf("\nsteps %lld, %.1f s; per step %.3f ms training, %.3f ms exposed allreduce\n",
                static_cast<long long>(session->steps()),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(),
                train_seconds() / steps * 1e3, exposed_seconds / steps * 1e3);
    std::printf("mode %s, compression %s: %.0f bytes sent per step by rank 0\n",
                session->mode().str().c_str(), session->compression().str().c_str(),
                static_cast<double>(opt->bytes_sent()) / steps);
    std::printf("final test accuracy: %.3f (workers at end: %d, membership changes: %zu)\n",
                test_accuracy(), session->size(), changes);
  }
  return 0;
}
