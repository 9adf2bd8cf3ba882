// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/parameter_server.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kf/common/error.hpp"

namespace kf {
namespace {

constexpr std::size_t kWord = sizeof(std::int64_t);
constexpr std::size_t kPushHeader = 3 * kWord;  // step, view version, weight

template <typename T>
T word(const std::vector<std::byte>& m, std::size_t i) {
  T v{};
  std::memcpy(&v, m.data() + i * kWord, sizeof(T));
  return v;
}

template <typename T>
void set_word(std::vector<std::byte>& m, std::size_t i, T v) {
  std::memcpy(m.data() + i * kWord, &v, sizeof(T));
}

Buffer bytes_of(std::vector<std::byte>& m) {
  return buffer(reinterpret_cast<std::uint8_t*>(m.data()), m.size());
}

}  // namespace

ParameterServer::ParameterServer(Peer& peer, std::string name, Options options)
    : peer_(peer), push_name_(name + "/push"), params_name_(name + "/params"), options_(options) {
  if (options_.max_staleness < 0) {
    throw std::invalid_argument("ParameterServer: max_staleness must be >= 0, not " +
                                std::to_string(options_.max_staleness));
  }
  if (options_.soft_sync < 1) {
    throw std::invalid_argument("ParameterServer: soft_sync must be >= 1, not " +
                                std::to_string(options_.soft_sync));
  }
}

ParameterServer::~ParameterServer() { wait_sends(); }

// Sends give their buffers back once written; a failed one shows as a failed receive later.
void ParameterServer::wait_sends() {
  for (Push& p : pushes_) {
    if (p.in_flight) p.sent.wait_status();
    p.in_flight = false;
  }
  for (Handle& h : params_sent_) h.wait_status();
  params_sent_.clear();
}

// A new version, or steps that do not follow: every worker holds `w_start` alike (the session
// made the models one), which is the server's parameters and every worker's view of them.
void ParameterServer::restart(std::span<const float> w_start, std::int64_t step) {
  wait_sends();
  pushes_.clear();
  cluster_version_ = peer_.version();
  size_ = peer_.size();
  rank_ = peer_.rank();
  view_step_ = step - 1;
  view_version_ = 0;
  first_step_ = step;
  const std::size_t header = (2 + static_cast<std::size_t>(size_)) * kWord;
  incoming_.assign(header + count_ * sizeof(float), std::byte{0});
  if (rank_ != 0) {
    params_.clear();
    return;
  }
  version_ = 0;
  params_.assign(header + count_ * sizeof(float), std::byte{0});
  std::memcpy(params_.data() + header, w_start.data(), count_ * sizeof(float));
  applied_.assign(static_cast<std::size_t>(size_), step - 1);
  group_.clear();
  group_weight_ = 0;
  group_sum_.assign(count_, 0.0f);
  push_in_.assign(kPushHeader + count_ * sizeof(float), std::byte{0});
}

ParameterServer::Report ParameterServer::step(std::span<float> w, std::span<const float> w_start,
                                              std::int64_t step, double weight) {
  if (!(weight > 0) || !std::isfinite(weight)) {
    throw std::invalid_argument(
        "ParameterServer::step: the weight must be positive and finite, not " +
        std::to_string(weight));
  }
  if (w.size() != w_start.size()) {
    throw std::invalid_argument("ParameterServer::step: the model has " + std::to_string(w.size()) +
                                " values and its start " + std::to_string(w_start.size()));
  }
  if (count_ == 0) {
    count_ = w.size();
  } else if (w.size() != count_) {
    throw std::invalid_argument("ParameterServer::step: the model has " + std::to_string(w.size()) +
                                " values, it had " + std::to_string(count_));
  }
  if (peer_.version() != cluster_version_ || peer_.size() != size_ || step != last_step_ + 1) {
    restart(w_start, step);
  }
  last_step_ = step;
  Report rep;

  // This step's push: what this worker's own update changed.
  Push p;
  p.step = step;
  p.bytes.resize(kPushHeader + count_ * sizeof(float));
  set_word(p.bytes, 0, step);
  set_word(p.bytes, 1, view_version_);
  set_word(p.bytes, 2, weight);
  auto* delta = reinterpret_cast<float*>(p.bytes.data() + kPushHeader);
  for (std::size_t i = 0; i < count_; ++i) delta[i] = w[i] - w_start[i];
  pushes_.push_back(std::move(p));
  Push& mine = pushes_.back();
  if (rank_ != 0) {
    mine.sent = peer_.send(0, push_name_, bytes_of(mine.bytes));
    mine.in_flight = true;
    rep.bytes_sent += mine.bytes.size();
  }

  if (rank_ == 0) {
    serve(step, rep);
    take_parameters(params_, w);
  } else {
    const Buffer in = bytes_of(incoming_);
    while (peer_.try_receive(0, params_name_, in)) take_parameters(incoming_, w);
    while (step - view_step_ > options_.max_staleness) {
      peer_.receive(0, params_name_, in).wait();
      take_parameters(incoming_, w);
      rep.waited = true;
    }
  }
  rep.staleness = step - view_step_;
  for (Push& q : pushes_) {  // written ones give their handles back
    if (q.in_flight && q.sent.ready()) {
      q.sent.wait_status();
      q.in_flight = false;
    }
  }
  return rep;
}

// Rank 0: the pushes of `step`, in rank order, into groups of soft_sync; then the parameters
// to every worker.
void ParameterServer::serve(std::int64_t step, Report& rep) {
  for (Handle& h : params_sent_) h.wait_status();  // w_s is their buffer
  params_sent_.clear();
  const Push& own = pushes_.back();
  for (int r = 0; r < size_; ++r) {
    if (r == 0) {
      accumulate(0, step, word<std::uint64_t>(own.bytes, 1), word<double>(own.bytes, 2),
                 reinterpret_cast<const float*>(own.bytes.data() + kPushHeader), rep);
      continue;
    }
    peer_.receive(r, push_name_, bytes_of(push_in_)).wait();
    const auto pushed_at = word<std::int64_t>(push_in_, 0);
    if (pushed_at != step) {
      throw Error(make_error_code(errc::protocol_error),
                  "parameter server '" + push_name_ + "': rank " + std::to_string(r) +
                      " pushed step " + std::to_string(pushed_at) + " at step " +
                      std::to_string(step) + " (the workers do not run one step count)");
    }
    const auto weight = word<double>(push_in_, 2);
    if (!(weight > 0) || !std::isfinite(weight)) {
      throw Error(make_error_code(errc::protocol_error),
                  "parameter server '" + push_name_ + "': rank " + std::to_string(r) +
                      " pushed a weight of " + std::to_string(weight));
    }
    accumulate(r, step, word<std::uint64_t>(push_in_, 1), weight,
               reinterpret_cast<const float*>(push_in_.data() + kPushHeader), rep);
  }
  set_word(params_, 0, step);
  set_word(params_, 1, version_);
  for (int r = 0; r < size_; ++r) {
    set_word(params_, 2 + static_cast<std::size_t>(r), applied_[static_cast<std::size_t>(r)]);
  }
  for (int r = 1; r < size_; ++r) {
    params_sent_.push_back(peer_.send(r, params_name_, bytes_of(params_)));
    rep.bytes_sent += params_.size();
  }
}

void ParameterServer::accumulate(int rank, std::int64_t step, std::uint64_t view, double weight,
                                 const float* delta, Report& rep) {
  // The version this group's update makes, minus the one the push was computed from.
  const std::uint64_t makes = version_ + 1;
  const auto tau = static_cast<std::int64_t>(view < makes ? makes - view : 1);
  rep.max_tau = std::max(rep.max_tau, tau);
  const auto scale =
      static_cast<float>(weight / (options_.scale_lr ? static_cast<double>(tau) : 1.0));
  for (std::size_t i = 0; i < count_; ++i) group_sum_[i] += scale * delta[i];
  group_weight_ += weight;
  group_.emplace_back(rank, step);
  if (static_cast<int>(group_.size()) < options_.soft_sync) return;
  const std::size_t header = (2 + static_cast<std::size_t>(size_)) * kWord;
  auto* ws = reinterpret_cast<float*>(params_.data() + header);
  const auto mean = static_cast<float>(1.0 / group_weight_);
  group_weight_ = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    ws[i] += group_sum_[i] * mean;
    group_sum_[i] = 0.0f;
  }
  for (const auto& [r, s] : group_) applied_[static_cast<std::size_t>(r)] = s;
  group_.clear();
  ++version_;
  ++rep.updates;
}

// The server's parameters plus this worker's pushes it has not applied yet.
void ParameterServer::take_parameters(const std::vector<std::byte>& message, std::span<float> w) {
  const auto sent_at = word<std::int64_t>(message, 0);
  if (sent_at < first_step_) return;  // from before a restart
  const auto applied = word<std::int64_t>(message, 2 + static_cast<std::size_t>(rank_));
  while (!pushes_.empty() && pushes_.front().step <= applied) {
    if (pushes_.front().in_flight) pushes_.front().sent.wait_status();
    pushes_.pop_front();
  }
  const std::size_t header = (2 + static_cast<std::size_t>(size_)) * kWord;
  const auto* ws = reinterpret_cast<const float*>(message.data() + header);
  std::copy(ws, ws + count_, w.begin());
  for (const Push& q : pushes_) {
    const auto* d = reinterpret_cast<const float*>(q.bytes.data() + kPushHeader);
    for (std::size_t i = 0; i < count_; ++i) w[i] += d[i];
  }
  view_step_ = sent_at;
  view_version_ = word<std::uint64_t>(message, 1);
}

}  // namespace kf
