// SPDX-License-Identifier: Apache-2.0
// The LibTorch adapter (docs/torch.md): a distributed optimizer
// that wraps any torch::optim optimizer. Gradients are averaged over the workers in buckets whose
// allreduce starts, from a gradient hook, as soon as backward has produced every gradient of the
// bucket, so communication overlaps the rest of backward. The two passes the exchange needs
// anyway feed the gradient-noise-scale monitor: copying a gradient into its bucket takes this
// worker's |g|² (and weights it by its share of the step's samples), copying the average back
// into .grad takes |ḡ|². Model parameters, buffers and the optimizer's state are registered with
// kf::State, so they are committed, restored and synced to joiners with the rest of the state.
//
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//   kf::DistributedOptimizer opt(*session, sgd);
//   opt.register_state(state, *model);           // before session->join()
//   session->step([&] {
//     opt.zero_grad();
//     opt.begin_step(local_samples, global_samples);
//     torch::nll_loss(model->forward(x), y).backward();   // the mean over the local batch
//     opt.step();                                          // averaged gradients, then sgd.step()
//   });
//
// Training modes (docs/training-modes.md) follow the session's settings "mode", read at each
// step: sync-sgd averages the gradients as above; sma averages them during the job's first
// post_local steps, then lets each worker step on its own gradients and averages the models
// (one allreduce of every parameter) after every period-th step. Each worker keeps its own
// optimizer state (momentum, Adam's moments) in sma; only the parameters are averaged. At each
// average the session's metrics get "sma.averaged" = 1 and "sma.divergence", the models'
// mean squared distance from their mean relative to the mean's squared norm (when the
// optimizer was made before Session::join, which fixes the metrics). pair-avg exchanges the
// model with one peer after each step (kf::PairAverager, metric "pair_avg.staleness"); async-ps
// pushes what each step's own update changed to the parameter server on rank 0 and takes the
// server's parameters as they come (kf::ParameterServer, metric "async_ps.staleness").
// The settings "compression" compresses the gradients of sync-sgd (kf/runtime/compression.hpp):
// the buckets are then exchanged in step(), one after another, through a GradientCompressor
// each, with this worker's error-feedback residual; overlap with backward is lost. With topk or
// randomk and SGD with momentum (dampening 0, no Nesterov), the compressors carry the momentum
// (momentum correction, kf/runtime/compression.hpp) and SGD steps without its own meanwhile
// (DistributedOptimizerOptions::momentum_correction).
//
// Requirements: parameters are dense float32 tensors, all on the CPU or all on one CUDA device;
// one backward per step (no gradient accumulation); every worker builds the same model and
// optimizer (the same parameters in the same order). Thread-safety: use from the training
// thread (LibTorch runs CPU backward, and so the hooks, on the thread that calls backward(); CUDA
// backward runs them on its device thread, and kf's collectives may be called from any thread).
//
// CUDA parameters: the buckets are on the device; each bucket's allreduce starts after the work
// enqueued so far on LibTorch's current stream and runs beside the rest of backward (NCCL on kf's
// own stream, or staging); the averaged gradients are written into .grad by work on LibTorch's
// stream that waits for the allreduce; the gradient norms are computed on the device and reach
// the host as two scalars per step. Without LibTorch's CUDA headers in the build
// (KF_HAVE_TORCH_CUDA), the stream is the legacy default stream, LibTorch's default. docs/gpu.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kf/runtime/compression.hpp"
#include "kf/runtime/pair_averaging.hpp"
#include "kf/runtime/parameter_server.hpp"
#include "kf/runtime/session.hpp"
#include "kf/runtime/state.hpp"
#include "kf/runtime/training_mode.hpp"

namespace kf {

class SharedMemory;

/// `t` as a kf::Buffer for State::add and the collectives: a contiguous CPU or CUDA tensor of
/// float32, float64 or int64 (the tensor must outlive the buffer).
/// Throws: std::invalid_argument starting with `what` for any other tensor.
Buffer tensor_buffer(const torch::Tensor& t, const std::string& what);

struct DistributedOptimizerOptions {
  /// Gradients are grouped, in reverse parameter order (the order backward produces them), into
  /// buckets of about this many bytes; each bucket is one allreduce.
  std::size_t bucket_bytes = std::size_t{4} << 20;
  /// false: one allreduce of all gradients after backward, for measuring what overlap gains.
  bool overlap = true;
  /// With topk or randomk compression and SGD with momentum (dampening 0, no Nesterov, one
  /// momentum for every group): the compressors carry the momentum instead of SGD (momentum
  /// correction). false leaves the momentum to SGD, applied to the sparse averages.
  bool momentum_correction = true;
  /// With momentum correction: the velocity of each value sent restarts at zero (momentum
  /// factor masking, GradientCompressor::set_momentum).
  bool momentum_masking = true;
};

class DistributedOptimizer {
 public:
  /// Registers a gradient hook on every parameter of `optimizer`. Both must outlive this object.
  /// Throws: std::invalid_argument when a parameter is not a dense float32 tensor on the CPU or
  /// on the same CUDA device as the others.
  DistributedOptimizer(Session& session, torch::optim::Optimizer& optimizer,
                       DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  /// Registers with `state` (before Session::join): every parameter and buffer of `module` (as
  /// "model/<name>"), and the optimizer's per-parameter state, created now so that every worker
  /// has the same layout before the first step: SGD's momentum buffers; the moments of Adam and
  /// AdamW (and their maxima with amsgrad); RMSprop's square averages (with its momentum
  /// buffers and gradient averages when it has momentum or is centered); Adagrad's sums. The
  /// step count of Adam, AdamW, RMSprop and Adagrad is a State counter
  /// ("optimizer/adam_step", "optimizer/adamw_step", ...). Pre-created state gives the same
  /// updates as LibTorch's lazy creation for SGD with dampening 0 and for the others.
  /// Throws: std::invalid_argument for another optimizer that holds state (LBFGS), or a buffer
  /// of an unsupported type.
  void register_state(State& state, torch::nn::Module& module);

  /// Zeroes the gradients (the wrapped optimizer's zero_grad).
  void zero_grad();
  /// Before backward: this worker's samples in the step and the step's samples over all
  /// workers. Each worker's gradient (the mean over its samples) is weighted by
  /// local/global, so the allreduced sum is the mean over every sample of the step even when
  /// workers hold different numbers of samples. Without a call, each worker weighs 1/size.
  /// The span from here to step() is this worker's compute time (Session::report_compute),
  /// which balanced batches weigh workers by.
  /// Throws: std::invalid_argument unless 0 <= local <= global and global > 0.
  void begin_step(std::int64_t local_samples, std::int64_t global_samples);
  /// Waits for every bucket (starting those whose gradients were not produced: unused
  /// parameters count as zero), writes the averaged gradients into .grad, reports gradient
  /// norms, samples and communication to the session's monitors, and runs the wrapped
  /// optimizer's step. Throws: kf::Error from the allreduce (Session::step recovers from peer
  /// failures).
  void step();

  /// Replaces the parameters with their mean over the workers now (one allreduce): the model of
  /// a model-averaging run at its end, or whenever the program wants one model.
  /// Throws: kf::Error from the allreduce.
  void average_parameters() { average_model(); }
  /// Bytes this worker has sent for gradients and models so far (payload: what the
  /// compression left, or every value).
  std::uint64_t bytes_sent() const noexcept { return bytes_sent_; }

  /// Sets the learning rate of every parameter group.
  void set_learning_rate(double lr);
  double learning_rate() const;

  /// Time the last step() waited for communication (not hidden by backward), and the span from
  /// the first bucket's allreduce to the last one's completion.
  std::chrono::duration<double> exposed_comm() const noexcept { return exposed_; }
  std::chrono::duration<double> comm_span() const noexcept { return span_; }
  std::size_t buckets() const noexcept { return buckets_.size(); }

 private:
  struct Bucket;
  struct Slot;

  void on_gradient(std::size_t slot, const torch::Tensor& grad);
  void fill(Slot& s, Bucket& b, const torch::Tensor& grad, float weight);
  void start(Bucket& bucket);
  void reset_step();
  const ModePlan& plan();  // this step's, from the session's mode and step count
  void run_optimizer();
  std::vector<torch::Tensor> flat_views() const;  // each parameter as a vector
  torch::Tensor flat_parameters() const;
  torch::Tensor flat_parameters_shared();
  void set_parameters(const torch::Tensor& all);
  void average_model();
  void average_with_pair();
  void exchange_with_server();
  std::size_t exchange_compressed(Bucket& b, double momentum);

  Session& session_;
  torch::optim::Optimizer& optimizer_;
  DistributedOptimizerOptions options_;
  std::vector<Slot> slots_;  // one per parameter, in the optimizer's order
  std::vector<std::unique_ptr<Bucket>> buckets_;
  template <class Options, class ParamState>
  void register_moments(State& state, const std::string& name);
  template <class ParamState>
  static void set_steps(torch::optim::Optimizer& optimizer, std::int64_t step);
  std::int64_t* step_count_ = nullptr;  // State counter of the optimizer's step count
  void (*set_steps_)(torch::optim::Optimizer&, std::int64_t) = nullptr;
  double weight_ = 0;  // local/global of this step; 0: 1/size
  std::int64_t local_samples_ = -1;
  std::chrono::steady_clock::time_point began_{};  // begin_step's time, while begun_
  bool begun_ = false;
  double local_sq_ = 0;
  torch::Device device_{torch::kCPU};
  bool on_device_ = false;
  torch::Tensor local_sq_dev_;  // CUDA parameters: Σ|g|² of this step, on the device
  bool finite_ = true;
  std::chrono::steady_clock::time_point first_start_{};
  bool started_any_ = false;
  ModePlan plan_;
  CompressionSpec compression_;  // this step's, read with the plan
  std::uint64_t bytes_sent_ = 0;
  int divergence_slot_ = -1, averaged_slot_ = -1;  // session metrics of model averaging
  int staleness_slot_ = -1;                        // and of pair averaging
  // Model averaging of CPU parameters: their vector, in memory same-host peers read in place.
  std::unique_ptr<SharedMemory> model_flat_;
  std::unique_ptr<PairAverager> pair_;  // while the mode is pair-avg
  std::uint64_t pair_seed_ = 0;
  std::unique_ptr<ParameterServer> server_;  // while the mode is async-ps
  ParameterServer::Options server_options_;
  int ps_staleness_slot_ = -1;
  bool planned_ = false;
  std::chrono::duration<double> exposed_{0}, span_{0};
};

}  // namespace kf
