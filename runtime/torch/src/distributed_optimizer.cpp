// SPDX-License-Identifier: Apache-2.0
// kf::DistributedOptimizer: its construction (slots, buckets, hooks), the registration of its
// state, the wrapped optimizer's step, the modes that exchange models (sma, pair-avg, async-ps)
// and the learning rate. One training step and its gradient exchange are in
// distributed_optimizer/step.cpp.
#include "kf/torch/distributed_optimizer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "distributed_optimizer/support.hpp"

namespace kf {

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

using detail::key_of;
using detail::sum_of_squares;
using detail::torch_stream;
using SteadyClock = std::chrono::steady_clock;

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
      b->memory = SharedMemory(b->count * sizeof(float));
      b->data = b->memory.as<float>().first(b->count);
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
    register_moments<torch::optim::AdamOptions, torch::optim::AdamParamState>(state, "adam");
    return;
  }
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer_) != nullptr) {
    register_moments<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(state, "adamw");
    return;
  }
  if (dynamic_cast<torch::optim::RMSprop*>(&optimizer_) != nullptr) {
    step_count_ = &state.counter("optimizer/rmsprop_step");
    set_steps_ = &set_steps<torch::optim::RMSpropParamState>;
    for (auto& group : optimizer_.param_groups()) {
      const auto& o = static_cast<const torch::optim::RMSpropOptions&>(group.options());
      for (auto& p : group.params()) {
        const std::string tag = "optimizer/" + std::to_string(i++);
        auto& entry = st[key_of(p)];
        if (!entry) {
          // As RMSprop's first step makes them.
          auto ps = std::make_unique<torch::optim::RMSpropParamState>();
          ps->step(0);
          ps->square_avg(torch::zeros_like(p));
          if (o.momentum() > 0) ps->momentum_buffer(torch::zeros_like(p));
          if (o.centered()) ps->grad_avg(torch::zeros_like(p));
          entry = std::move(ps);
        }
        const auto& ps = static_cast<torch::optim::RMSpropParamState&>(*entry);
        state.add(tag + "/square_avg", tensor_buffer(ps.square_avg(), tag + " square_avg"));
        if (o.momentum() > 0) {
          state.add(tag + "/momentum",
                    tensor_buffer(ps.momentum_buffer(), tag + " momentum_buffer"));
        }
        if (o.centered()) {
          state.add(tag + "/grad_avg", tensor_buffer(ps.grad_avg(), tag + " grad_avg"));
        }
      }
    }
    return;
  }
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer_) != nullptr) {
    // Adagrad makes its state (the sums, at initial_accumulator_value) when it is constructed.
    step_count_ = &state.counter("optimizer/adagrad_step");
    set_steps_ = &set_steps<torch::optim::AdagradParamState>;
    for (auto& group : optimizer_.param_groups()) {
      for (auto& p : group.params()) {
        const std::string tag = "optimizer/" + std::to_string(i++);
        auto it = st.find(key_of(p));
        if (it == st.end() || !it->second) {
          throw std::invalid_argument(
              "DistributedOptimizer::register_state: Adagrad has no "
              "state for parameter " +
              std::to_string(i - 1));
        }
        const auto& ps = static_cast<torch::optim::AdagradParamState&>(*it->second);
        state.add(tag + "/sum", tensor_buffer(ps.sum(), tag + " sum"));
      }
    }
    return;
  }
  throw std::invalid_argument(
      "DistributedOptimizer::register_state: the state of this optimizer cannot be registered "
      "(SGD, Adam, AdamW, RMSprop and Adagrad can; LBFGS cannot); wrap one of those");
}

// Adam and AdamW: the two moments (and the maximum with amsgrad) of every parameter, made as
// their first step makes them, and their step count as the counter optimizer/<name>_step.
template <class Options, class ParamState>
void DistributedOptimizer::register_moments(State& state, const std::string& name) {
  step_count_ = &state.counter("optimizer/" + name + "_step");
  set_steps_ = &set_steps<ParamState>;
  auto& st = optimizer_.state();
  std::size_t i = 0;
  for (auto& group : optimizer_.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      const std::string tag = "optimizer/" + std::to_string(i++);
      auto& entry = st[key_of(p)];
      if (!entry) {
        auto ps = std::make_unique<ParamState>();
        ps->step(0);
        ps->exp_avg(torch::zeros_like(p));
        ps->exp_avg_sq(torch::zeros_like(p));
        if (o.amsgrad()) ps->max_exp_avg_sq(torch::zeros_like(p));
        entry = std::move(ps);
      }
      const auto& ps = static_cast<ParamState&>(*entry);
      state.add(tag + "/exp_avg", tensor_buffer(ps.exp_avg(), tag + " exp_avg"));
      state.add(tag + "/exp_avg_sq", tensor_buffer(ps.exp_avg_sq(), tag + " exp_avg_sq"));
      if (o.amsgrad()) {
        state.add(tag + "/max_exp_avg_sq",
                  tensor_buffer(ps.max_exp_avg_sq(), tag + " max_exp_avg_sq"));
      }
    }
  }
}

// The step count of every parameter's state (a per-parameter field in LibTorch, one counter
// in the State, so that it is committed, restored and synced with the rest).
template <class ParamState>
void DistributedOptimizer::set_steps(torch::optim::Optimizer& optimizer, std::int64_t step) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto it = optimizer.state().find(key_of(p));
      if (it != optimizer.state().end()) static_cast<ParamState&>(*it->second).step(step);
    }
  }
}

void DistributedOptimizer::run_optimizer() {
  if (step_count_ != nullptr) {
    set_steps_(optimizer_, *step_count_);
    ++*step_count_;
  }
  optimizer_.step();
}

// Every parameter, one after another in the optimizer's order, as one vector (on the parameters'
// device).
torch::Tensor DistributedOptimizer::flat_parameters() const { return torch::cat(flat_views()); }

std::vector<torch::Tensor> DistributedOptimizer::flat_views() const {
  std::vector<torch::Tensor> flat;
  flat.reserve(slots_.size());
  for (const auto& s : slots_) flat.push_back(s.param.reshape({-1}));
  return flat;
}

// The same vector, on the CPU, in memory kept from one call to the next that same-host peers
// reduce from in place (kf::SharedMemory): model averaging exchanges it whole.
torch::Tensor DistributedOptimizer::flat_parameters_shared() {
  std::size_t total = 0;
  for (const auto& s : slots_) total += s.numel;
  if (!model_flat_ || model_flat_->size() != total * sizeof(float)) {
    model_flat_ = std::make_unique<SharedMemory>(total * sizeof(float));
  }
  torch::Tensor all = torch::from_blob(model_flat_->data(), {static_cast<std::int64_t>(total)},
                                       torch::TensorOptions().dtype(torch::kFloat));
  torch::cat_out(all, flat_views());
  return all;
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
  torch::Tensor all = on_device_ ? flat_parameters() : flat_parameters_shared();
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
    server_ = std::make_unique<ParameterServer>(session_, "kf.torch/ps", o);
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
