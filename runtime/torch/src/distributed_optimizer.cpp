// SPDX-License-Identifier: Apache-2.0
// The only translation unit of the adapter with LibTorch's headers (they cost ~25 s each).
#include "kf/torch/distributed_optimizer.hpp"

#include "config.hpp"
#if KF_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kf/peer.hpp"
#include "kf/runtime/step_monitor.hpp"

namespace kf {

using SteadyClock = std::chrono::steady_clock;

struct DistributedOptimizer::Slot {
  torch::Tensor param;
  std::size_t bucket = 0;
  std::size_t offset = 0;  // in the bucket, in floats
  std::size_t numel = 0;
  bool ready = false;  // its gradient is in the bucket for this step
  unsigned hook = 0;
};

struct DistributedOptimizer::Bucket {
  std::size_t index = 0;
  std::vector<float> data;  // CPU parameters
  torch::Tensor dev;        // CUDA parameters: the bucket on their device
  std::size_t count = 0;
  std::vector<std::size_t> slots;
  std::size_t ready = 0;
  bool started = false;
  Handle handle;
  std::unique_ptr<GradientCompressor> compressor;  // while the job's compression is on
};

namespace {

// The key of a parameter in Optimizer::state(): the address of its TensorImpl, as text in the
// LibTorch of Debian 12 and as the pointer itself in newer releases (2.11 has void*).
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = StateKey>
Key key_of(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << p.unsafeGetTensorImpl();
    return text.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

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

Buffer tensor_buffer(const torch::Tensor& t, const std::string& what) {
  if (!t.is_contiguous() || (t.device().type() != torch::kCPU && !t.is_cuda())) {
    throw std::invalid_argument(what + ": must be a contiguous CPU or CUDA tensor");
  }
  const Device where = t.is_cuda() ? Device::cuda : Device::cpu;
  const auto n = static_cast<std::size_t>(t.numel());
  switch (t.scalar_type()) {
    case torch::kFloat: return Buffer{t.data_ptr<float>(), n, DType::f32, where};
    case torch::kDouble: return Buffer{t.data_ptr<double>(), n, DType::f64, where};
    case torch::kLong: return Buffer{t.data_ptr<std::int64_t>(), n, DType::i64, where};
    default:
      throw std::invalid_argument(what + ": tensors of type " +
                                  std::string(c10::toString(t.scalar_type())) +
                                  " cannot be registered (float32, float64 and int64 can)");
  }
}

// The stream LibTorch's work on `device` runs on: the collectives start after it and the
// averaged gradients are used on it. Without LibTorch's CUDA headers in the build, the legacy
// default stream (nullptr), which is LibTorch's unless a program picks another.
void* torch_stream([[maybe_unused]] const torch::Device& device) {
#if KF_HAVE_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  return nullptr;
#endif
}

torch::Tensor sum_of_squares(const torch::Tensor& t) { return t.square().sum(torch::kDouble); }

}  // namespace

DistributedOptimizer::DistributedOptimizer(Session& session, torch::optim::Optimizer& optimizer,
                                           DistributedOptimizerOptions options)
    : session_(session), optimizer_(optimizer), options_(options) {
  try {
    divergence_slot_ = session_.add_metric("sma.divergence");
    averaged_slot_ = session_.add_metric("sma.averaged");
    staleness_slot_ = session_.add_metric("pair_avg.staleness");
    ps_staleness_slot_ = session_.add_metric("async_ps.staleness");
  } catch (const std::logic_error&) {
    // Made after join(): metrics are fixed by then, and these are left out.
    divergence_slot_ = averaged_slot_ = staleness_slot_ = ps_staleness_slot_ = -1;
  }
  for (auto& group : optimizer_.param_groups()) {
    for (auto& p : group.params()) {
      if (p.scalar_type() != torch::kFloat || p.is_sparse() ||
          (p.device().type() != torch::kCPU && !p.is_cuda()) || !p.is_contiguous()) {
        throw std::invalid_argument("DistributedOptimizer: parameter " +
                                    std::to_string(slots_.size()) +
                                    " is not a dense, contiguous float32 CPU or CUDA tensor");
      }
      if (slots_.empty()) {
        device_ = p.device();
      } else if (p.device() != device_) {
        throw std::invalid_argument("DistributedOptimizer: parameter " +
                                    std::to_string(slots_.size()) + " is on " + p.device().str() +
                                    ", parameter 0 on " + device_.str() +
                                    " (all must be on one device)");
      }
      Slot s;
      s.param = p;
      s.numel = static_cast<std::size_t>(p.numel());
      slots_.push_back(std::move(s));
    }
  }
  // Buckets in reverse parameter order: backward produces the last layers' gradients first.
  const std::size_t limit = options_.overlap ? std::max<std::size_t>(options_.bucket_bytes, 4)
                                             : static_cast<std::size_t>(-1);
  std::size_t bytes = 0;
  for (std::size_t i = slots_.size(); i-- > 0;) {
    Slot& s = slots_[i];
    const std::size_t size = s.numel * sizeof(float);
    if (buckets_.empty() || (bytes > 0 && bytes + size > limit)) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->index = buckets_.size() - 1;
      bytes = 0;
    }
    Bucket& b = *buckets_.back();
    s.bucket = b.index;
    s.offset = b.count;
    b.slots.push_back(i);
    b.count += s.numel;
    bytes += size;
  }
  on_device_ = device_.is_cuda();
  for (auto& b : buckets_) {
    if (on_device_) {
      b->dev = torch::zeros({static_cast<std::int64_t>(b->count)},
                            torch::TensorOptions().dtype(torch::kFloat).device(device_));
    } else {
      b->data.resize(b->count);
    }
  }
  reset_step();
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].hook = slots_[i].param.register_hook(
        [this, i](const torch::Tensor& grad) { on_gradient(i, grad); });
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  for (auto& s : slots_) s.param.remove_hook(s.hook);
}

void DistributedOptimizer::register_state(State& state, torch::nn::Module& module) {
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    state.add("model/" + p.key(), tensor_buffer(p.value(), "parameter '" + p.key() + "'"));
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    state.add("model/" + b.key(), tensor_buffer(b.value(), "buffer '" + b.key() + "'"));
  }
  auto& st = optimizer_.state();
  std::size_t i = 0;
  if (dynamic_cast<torch::optim::SGD*>(&optimizer_) != nullptr) {
    for (auto& group : optimizer_.param_groups()) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      for (auto& p : group.params()) {
        const std::string tag = "optimizer/" + std::to_string(i++);
        if (o.momentum() == 0) continue;
        auto& entry = st[key_of(p)];
        if (!entry) {
          auto ps = std::make_unique<torch::optim::SGDParamState>();
          ps->momentum_buffer(torch::zeros_like(p));
          entry = std::move(ps);
        }
        const auto& ps = static_cast<torch::optim::SGDParamState&>(*entry);
        state.add(tag + "/momentum", tensor_buffer(ps.momentum_buffer(), tag + " momentum"));
      }
    }
    return;
  }
  if (dynamic_cast<torch::optim::Adam*>(&optimizer_) != nullptr) {
    adam_step_ = &state.counter("optimizer/adam_step");
    for (auto& group : optimizer_.param_groups()) {
      const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
      for (auto& p : group.params()) {
        const std::string tag = "optimizer/" + std::to_string(i++);
        auto& entry = st[key_of(p)];
        if (!entry) {
          auto ps = std::make_unique<torch::optim::AdamParamState>();
          ps->step(0);
          ps->exp_avg(torch::zeros_like(p));
          ps->exp_avg_sq(torch::zeros_like(p));
          if (o.amsgrad()) ps->max_exp_avg_sq(torch::zeros_like(p));
          entry = std::move(ps);
        }
        const auto& ps = static_cast<torch::optim::AdamParamState&>(*entry);
        state.add(tag + "/exp_avg", tensor_buffer(ps.exp_avg(), tag + " exp_avg"));
        state.add(tag + "/exp_avg_sq", tensor_buffer(ps.exp_avg_sq(), tag + " exp_avg_sq"));
        if (o.amsgrad()) {
          state.add(tag + "/max_exp_avg_sq",
                    tensor_buffer(ps.max_exp_avg_sq(), tag + " max_exp_avg_sq"));
        }
      }
    }
    return;
  }
  throw std::invalid_argument(
      "DistributedOptimizer::register_state: the state of this optimizer cannot be registered "
      "(SGD and Adam can); wrap one of those");
}

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

void DistributedOptimizer::run_optimizer() {
  if (adam_step_ != nullptr) {
    for (auto& group : optimizer_.param_groups()) {
      for (auto& p : group.params()) {
        auto it = optimizer_.state().find(key_of(p));
        if (it != optimizer_.state().end()) {
          static_cast<torch::optim::AdamParamState&>(*it->second).step(*adam_step_);
        }
      }
    }
    ++*adam_step_;
  }
  optimizer_.step();
}

// Every parameter, one after another in the optimizer's order, as one vector (on the parameters'
// device).
torch::Tensor DistributedOptimizer::flat_parameters() const {
  std::vector<torch::Tensor> flat;
  flat.reserve(slots_.size());
  for (const auto& s : slots_) flat.push_back(s.param.reshape({-1}));
  return torch::cat(flat);
}

// The parameters from such a vector.
void DistributedOptimizer::set_parameters(const torch::Tensor& all) {
  std::int64_t offset = 0;
  for (auto& s : slots_) {
    const auto n = static_cast<std::int64_t>(s.numel);
    s.param.view({-1}).copy_(all.narrow(0, offset, n));
    offset += n;
  }
}

void DistributedOptimizer::average_model() {
  torch::NoGradGuard no_grad;
  torch::Tensor all = flat_parameters();
  const double own_sq = sum_of_squares(all).item<double>();
  const auto t0 = SteadyClock::now();
  CollOptions o;
  o.op = ReduceOp::avg;
  Buffer buf = buffer(all.data_ptr<float>(), static_cast<std::size_t>(all.numel()));
  if (on_device_) {
    buf.device = Device::cuda;
    o.stream = torch_stream(device_);
  }
  Handle h = session_.peer().allreduce("kf.torch/model", buf, buf, o);
  if (on_device_) h.order_on(o.stream);
  h.wait();
  set_parameters(all);
  span_ = exposed_ = SteadyClock::now() - t0;
  // The models' divergence, mean_r |w_r - w|^2 / |w|^2 with w their mean, is
  // (mean_r |w_r|^2 - |w|^2) / |w|^2: each worker reports its |w_r|^2 / |w|^2 - 1, and the
  // boundary's average of those is the divergence (policies read it: adaptive-sync).
  if (divergence_slot_ >= 0) {
    const double mean_sq = sum_of_squares(all).item<double>();
    session_.set_metric(divergence_slot_, mean_sq > 0 ? own_sq / mean_sq - 1.0 : 0.0);
    session_.set_metric(averaged_slot_, 1.0);
  }
  const auto bytes = static_cast<std::uint64_t>(all.numel()) * sizeof(float);
  session_.report_comm(span_.count(), static_cast<double>(bytes));
  bytes_sent_ += bytes;
}

// Pair averaging (kf::PairAverager): the parameters as one host vector, exchanged with this
// step's partner without waiting for it, and put back where something came.
void DistributedOptimizer::average_with_pair() {
  torch::NoGradGuard no_grad;
  const std::uint64_t seed = session_.mode().seed;
  if (!pair_ || pair_seed_ != seed) {
    pair_.reset();
    pair_ = std::make_unique<PairAverager>(session_.peer(), "kf.torch/pair", seed);
    pair_seed_ = seed;
  }
  torch::Tensor all = flat_parameters();
  if (on_device_) all = all.cpu();
  const auto t0 = SteadyClock::now();
  const PairAverager::Report rep = pair_->exchange(
      std::span<float>(all.data_ptr<float>(), static_cast<std::size_t>(all.numel())),
      session_.steps());
  if (rep.models_averaged + rep.corrections > 0) set_parameters(all);
  span_ = exposed_ = SteadyClock::now() - t0;
  if (staleness_slot_ >= 0) {
    session_.set_metric(staleness_slot_, static_cast<double>(rep.max_staleness));
  }
  session_.report_comm(span_.count(), static_cast<double>(rep.bytes_sent));
  bytes_sent_ += rep.bytes_sent;
}

// async-ps (kf::ParameterServer): this worker's own update, pushed as the change it made to
// the parameters, and the server's parameters put back where they came.
void DistributedOptimizer::exchange_with_server() {
  const ModeSpec& mode = session_.mode();
  const ParameterServer::Options o{mode.max_staleness, mode.soft_sync, mode.scale_lr};
  if (!server_ || server_options_ != o) {
    server_.reset();
    server_ = std::make_unique<ParameterServer>(session_.peer(), "kf.torch/ps", o);
    server_options_ = o;
  }
  // The push weighs this worker's samples (begin_step's share), so that a group of every
  // worker's pushes is the step's mean however the batch was split.
  const double weight = weight_ > 0 ? weight_ : 1.0 / session_.size();
  torch::Tensor before;
  {
    torch::NoGradGuard no_grad;
    before = flat_parameters();
    if (on_device_) before = before.cpu();
  }
  run_optimizer();
  torch::NoGradGuard no_grad;
  torch::Tensor after = flat_parameters();
  if (on_device_) after = after.cpu();
  const auto t0 = SteadyClock::now();
  const auto n = static_cast<std::size_t>(after.numel());
  const ParameterServer::Report rep =
      server_->step(std::span<float>(after.data_ptr<float>(), n),
                    std::span<const float>(before.data_ptr<float>(), n), session_.steps(), weight);
  set_parameters(after);
  span_ = exposed_ = SteadyClock::now() - t0;
  if (ps_staleness_slot_ >= 0) {
    session_.set_metric(ps_staleness_slot_, static_cast<double>(rep.staleness));
  }
  session_.report_comm(span_.count(), static_cast<double>(rep.bytes_sent));
  bytes_sent_ += rep.bytes_sent;
}

void DistributedOptimizer::set_learning_rate(double lr) {
  for (auto& group : optimizer_.param_groups()) group.options().set_lr(lr);
}

double DistributedOptimizer::learning_rate() const {
  return optimizer_.param_groups().empty() ? 0.0
                                           : optimizer_.param_groups().front().options().get_lr();
}

}  // namespace kf
