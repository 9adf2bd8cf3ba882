// SPDX-License-Identifier: Apache-2.0
// One step of kf::DistributedOptimizer: zero_grad and begin_step; the gradient hooks, which
// weigh each gradient into its bucket and start the bucket's allreduce once it is full; and
// step(), which waits for the buckets (or exchanges them through the job's compression), writes
// the averaged gradients back, reports to the monitors and steps the wrapped optimizer (or hands
// the step to a mode that exchanges models).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "distributed_optimizer/support.hpp"
#include "kf/runtime/step_monitor.hpp"
#include "kf/torch/distributed_optimizer.hpp"

namespace kf {

using detail::key_of;
using detail::sum_of_squares;
using detail::torch_stream;
using SteadyClock = std::chrono::steady_clock;

namespace {

// The momentum that sparse compression carries itself (momentum correction): SGD whose groups
// share one momentum in (0, 1), with dampening 0 and without Nesterov; else 0.
double correctable_momentum(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::SGD*>(&optimizer) == nullptr) return 0;
  double m = -1;
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    if (!(o.momentum() > 0 && o.momentum() < 1) || o.dampening() != 0 || o.nesterov()) return 0;
    if (m >= 0 && o.momentum() != m) return 0;
    m = o.momentum();
  }
  return m > 0 ? m : 0;
}

// SGD's momentum buffer of p, or nullptr when it has none yet.
torch::Tensor* momentum_buffer(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  auto it = optimizer.state().find(key_of(p));
  if (it == optimizer.state().end()) return nullptr;
  auto& ps = static_cast<torch::optim::SGDParamState&>(*it->second);
  return ps.momentum_buffer().defined() ? &ps.momentum_buffer() : nullptr;
}

}  // namespace

void DistributedOptimizer::zero_grad() {
  optimizer_.zero_grad();
  reset_step();
}

void DistributedOptimizer::begin_step(std::int64_t local_samples, std::int64_t global_samples) {
  if (global_samples <= 0 || local_samples < 0 || local_samples > global_samples) {
    throw std::invalid_argument("DistributedOptimizer::begin_step: need 0 <= local (" +
                                std::to_string(local_samples) + ") <= global (" +
                                std::to_string(global_samples) + ") and global > 0");
  }
  weight_ = static_cast<double>(local_samples) / static_cast<double>(global_samples);
  local_samples_ = local_samples;
  began_ = SteadyClock::now();
  begun_ = true;
}

void DistributedOptimizer::reset_step() {
  for (auto& s : slots_) s.ready = false;
  for (auto& b : buckets_) {
    b->ready = 0;
    b->started = false;
    b->handle = Handle();
  }
  local_sq_ = 0;
  if (on_device_) {
    local_sq_dev_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  }
  finite_ = true;
  started_any_ = false;
  planned_ = false;
}

// A gradient into its bucket, weighted; this worker's |g|² taken on the way (on the device, a
// scalar there until step()).
void DistributedOptimizer::fill(Slot& s, Bucket& b, const torch::Tensor& grad, float w) {
  if (on_device_) {
    torch::Tensor dst =
        b.dev.narrow(0, static_cast<std::int64_t>(s.offset), static_cast<std::int64_t>(s.numel));
    if (!grad.defined()) {
      dst.zero_();
      return;
    }
    dst.copy_(grad.reshape({-1}));
    dst.mul_(w);
    local_sq_dev_.add_(sum_of_squares(grad));
    return;
  }
  float* dst = b.data.data() + s.offset;
  if (!grad.defined()) {
    std::fill(dst, dst + s.numel, 0.0f);
    return;
  }
  const torch::Tensor c = grad.contiguous();
  const double sq = copy_scaled(std::span<const float>(c.data_ptr<float>(), s.numel),
                                std::span<float>(dst, s.numel), w);
  local_sq_ += sq;
  if (!std::isfinite(sq)) finite_ = false;
}

const ModePlan& DistributedOptimizer::plan() {
  if (!planned_) {
    plan_ = plan_step(session_.mode(), session_.steps());
    compression_ = session_.compression();
    planned_ = true;
  }
  return plan_;
}

void DistributedOptimizer::on_gradient(std::size_t index, const torch::Tensor& grad) {
  if (!plan().average_gradients) return;  // a local step: nothing to send
  Slot& s = slots_[index];
  if (s.ready || !grad.defined()) return;  // a second backward in one step adds nothing here
  Bucket& b = *buckets_[s.bucket];
  const float w = static_cast<float>(weight_ > 0 ? weight_ : 1.0 / session_.size());
  fill(s, b, grad, w);
  s.ready = true;
  // Compressed exchanges run in step(), bucket after bucket.
  if (++b.ready == b.slots.size() && options_.overlap && compression_.kind == Compression::none) {
    start(b);
  }
}

void DistributedOptimizer::start(Bucket& b) {
  if (!started_any_) {
    first_start_ = SteadyClock::now();
    started_any_ = true;
  }
  Buffer buf = buffer(b.data.data(), b.data.size());
  CollOptions o;
  if (on_device_) {
    buf = Buffer{b.dev.data_ptr<float>(), b.count, DType::f32, Device::cuda};
    o.stream = torch_stream(device_);
  }
  b.handle = session_.peer().allreduce("kf.torch/" + std::to_string(b.index), buf, buf, o);
  b.started = true;
}

void DistributedOptimizer::step() {
  struct Reset {
    DistributedOptimizer* self;
    ~Reset() { self->reset_step(); }
  } reset{this};
  // This worker's compute: from begin_step to here (forward and backward; the buckets'
  // allreduces run beside them, and what step() waits for is not counted).
  const bool begun = std::exchange(begun_, false);
  if (begun)
    session_.report_compute(std::chrono::duration<double>(SteadyClock::now() - began_).count());
  if (!plan().average_gradients) {
    if (begun) session_.report_samples(static_cast<double>(local_samples_));
    // Model averaging: this worker's own update, then, every period-th step, the mean of the
    // models. The gradient-noise-scale monitor needs an averaged gradient and gets none.
    if (plan().exchange_with_server) {
      exchange_with_server();
      return;
    }
    run_optimizer();
    if (plan().average_parameters) average_model();
    if (plan().average_with_pair) average_with_pair();
    return;
  }
  // Gradients backward did not produce (an unused parameter, or gradients set by hand).
  const float w = static_cast<float>(weight_ > 0 ? weight_ : 1.0 / session_.size());
  const bool compress = compression_.kind != Compression::none;
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    if (b.started) continue;
    for (std::size_t i : b.slots) {
      Slot& s = slots_[i];
      if (s.ready) continue;
      fill(s, b, s.param.grad(), w);
      s.ready = true;
    }
    if (!compress) start(b);
  }
  const auto wait_from = SteadyClock::now();
  if (!started_any_) first_start_ = wait_from;
  std::size_t bytes = 0;
  void* const stream = on_device_ ? torch_stream(device_) : nullptr;
  const bool sparse =
      compression_.kind == Compression::topk || compression_.kind == Compression::randomk;
  const double momentum =
      sparse && options_.momentum_correction ? correctable_momentum(optimizer_) : 0;
  for (auto& b : buckets_) {
    if (compress) {
      bytes += exchange_compressed(*b, momentum);
      continue;
    }
    // On the device, what reads the average below waits for it on LibTorch's stream; the host
    // wait is what reports a failed allreduce.
    if (on_device_) b->handle.order_on(stream);
    b->handle.wait();
    bytes += b->count * sizeof(float);
  }
  const auto done = SteadyClock::now();
  exposed_ = done - wait_from;
  span_ = done - first_start_;
  // The average back into .grad; |ḡ|² in the same pass.
  double global_sq = 0;
  torch::Tensor global_sq_dev;
  if (on_device_) global_sq_dev = torch::zeros_like(local_sq_dev_);
  for (auto& s : slots_) {
    torch::Tensor& grad = s.param.mutable_grad();
    if (!grad.defined() || !grad.is_contiguous()) grad = torch::zeros_like(s.param);
    const Bucket& b = *buckets_[s.bucket];
    if (on_device_) {
      grad.view({-1}).copy_(
          b.dev.narrow(0, static_cast<std::int64_t>(s.offset), static_cast<std::int64_t>(s.numel)));
      global_sq_dev.add_(sum_of_squares(grad));
    } else {
      global_sq += copy_scaled(std::span<const float>(b.data.data() + s.offset, s.numel),
                               std::span<float>(grad.data_ptr<float>(), s.numel), 1.0f);
    }
  }
  if (on_device_) {
    // The norms: two scalars to the host, one copy.
    const torch::Tensor both = torch::stack({local_sq_dev_, global_sq_dev}).to(torch::kCPU);
    local_sq_ = both[0].item<double>();
    global_sq = both[1].item<double>();
    finite_ = std::isfinite(local_sq_);
  }
  session_.report_comm(span_.count(), static_cast<double>(bytes));
  bytes_sent_ += bytes;
  if (local_samples_ > 0) {
    session_.report_gradients(local_sq_, global_sq, static_cast<double>(local_samples_), 1,
                              finite_);
  }
  if (momentum == 0) {
    run_optimizer();
    return;
  }
  // Momentum correction: the compressors' velocities hold the momentum (their sum over the
  // workers is the buffer), so SGD steps without its own. Its buffers stay zero meanwhile, on
  // every worker alike, so that State holds the same on each and a joiner's velocity starts at
  // zero; the momentum starts afresh when the compression is turned off.
  for (auto& s : slots_) {
    if (torch::Tensor* buf = momentum_buffer(optimizer_, s.param)) buf->zero_();
  }
  // SGD steps with momentum 0; its momentum comes back however the step ends.
  struct WithoutMomentum {
    torch::optim::Optimizer& sgd;
    double momentum;
    void set(double m) {
      for (auto& group : sgd.param_groups())
        static_cast<torch::optim::SGDOptions&>(group.options()).momentum(m);
    }
    ~WithoutMomentum() { set(momentum); }
  } without{optimizer_, momentum};
  without.set(0);
  run_optimizer();
}

// One bucket through the job's compression, with this worker's residual (docs/training-modes.md).
// The bucket holds each worker's gradient weighted by its share of the step's samples, whose sum
// over the workers is the step's mean gradient; the compressor returns the mean over the
// workers, so the result is scaled by their number. CUDA buckets travel through host memory.
// With momentum > 0 (topk, randomk) the compressor carries the momentum: a new one takes the
// previous compressor's velocity, or else each worker's share (1/size) of SGD's buffers.
std::size_t DistributedOptimizer::exchange_compressed(Bucket& b, double momentum) {
  if (!b.compressor || b.compressor->spec() != compression_ ||
      b.compressor->momentum() != static_cast<float>(momentum) ||
      (momentum > 0 && b.compressor->masking() != options_.momentum_masking)) {
    auto next = std::make_unique<GradientCompressor>(compression_, b.count,
                                                     /*seed=*/0x6b66 + b.index);
    if (momentum > 0) {
      std::vector<float> start;
      if (b.compressor && !b.compressor->velocity().empty()) {
        start.assign(b.compressor->velocity().begin(), b.compressor->velocity().end());
      } else {
        start.assign(b.count, 0.f);
        const float share = 1.f / static_cast<float>(session_.size());
        for (std::size_t i : b.slots) {
          const Slot& s = slots_[i];
          const torch::Tensor* buf = momentum_buffer(optimizer_, s.param);
          if (buf == nullptr) continue;
          const torch::Tensor host_buf = buf->to(torch::kCPU).contiguous().view({-1});
          const float* v = host_buf.data_ptr<float>();
          for (std::size_t j = 0; j < s.numel; ++j) start[s.offset + j] = v[j] * share;
        }
      }
      next->set_momentum(momentum, start, options_.momentum_masking);
    }
    b.compressor = std::move(next);
  }
  torch::Tensor host;
  float* data = b.data.data();
  if (on_device_) {
    host = b.dev.to(torch::kCPU).contiguous();
    data = host.data_ptr<float>();
  }
  const std::size_t sent = b.compressor->average(
      session_.peer(), "kf.torch/" + std::to_string(b.index), data, session_.steps());
  const float size = static_cast<float>(session_.size());
  for (std::size_t i = 0; i < b.count; ++i) data[i] *= size;
  if (on_device_) b.dev.copy_(host);
  return sent;
}

}  // namespace kf
