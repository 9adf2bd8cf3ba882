// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/parameter_server.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kf/common/error.hpp"
#include "kf/runtime/session.hpp"

namespace kf {
namespace {

constexpr std::size_t kWord = sizeof(std::int64_t);
constexpr std::size_t kPushHeader = 4 * kWord;  // step, view version, weight, epoch
constexpr std::size_t kParamsWords = 4;         // step, version, epoch, mark; then per rank

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

ParameterServer::ParameterServer(Session& session, std::string name, Options options)
    : ParameterServer(session.peer(), std::move(name), options) {
  session_ = &session;
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
  async_ = session_ != nullptr && session_->boundaries_on_change();
  epoch_ = async_ ? session_->boundaries_in_version() : 0;
  applied_mine_ = step - 1;
  marked_ = 0;
  const std::size_t header = (kParamsWords + static_cast<std::size_t>(size_)) * kWord;
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
  if (peer_.version() != cluster_version_ || peer_.size() != size_ || step != last_step_ + 1 ||
      (session_ != nullptr && session_->boundaries_on_change() != async_)) {
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
  set_word(p.bytes, 3, epoch_);
  auto* delta = reinterpret_cast<float*>(p.bytes.data() + kPushHeader);
  for (std::size_t i = 0; i < count_; ++i) delta[i] = w[i] - w_start[i];
  pushes_.push_back(std::move(p));
  Push& mine = pushes_.back();
  if (rank_ != 0) {
    mine.sent = peer_.send(0, push_name_, bytes_of(mine.bytes));
    mine.in_flight = true;
    rep.bytes_sent += mine.bytes.size();
  }

  if (async_) {
    // Asynchronously: a boundary ahead means rank 0 may wait there already, so nobody waits
    // for it; rank 0 announces it to every worker.
    const bool boundary_follows = session_->boundary_ahead();
    if (rank_ == 0) {
      serve_async(step, boundary_follows, rep);
      take_async(params_, w);
    } else {
      const Buffer in = bytes_of(incoming_);
      while (peer_.try_receive(0, params_name_, in)) take_async(incoming_, w);
      while (step - applied_mine_ > options_.max_staleness && !boundary_follows &&
             marked_ <= session_->boundaries_in_version()) {
        peer_.receive(0, params_name_, in).wait();
        take_async(incoming_, w);
        rep.waited = true;
      }
    }
    rep.staleness = step - applied_mine_;
  } else if (rank_ == 0) {
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
  if (!async_) rep.staleness = step - view_step_;
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
  send_parameters(std::vector<bool>(static_cast<std::size_t>(size_), true), 0, rep);
}

// Rank 0, asynchronously: the pushes that came since its last step, in the order it finds them,
// then the parameters to each worker whose push it took (to every worker, with the mark, when
// a boundary follows).
void ParameterServer::serve_async(std::int64_t step, bool boundary_follows, Report& rep) {
  for (Handle& h : params_sent_) h.wait_status();  // w_s is their buffer
  params_sent_.clear();
  const Push& own = pushes_.back();
  accumulate(0, step, word<std::uint64_t>(own.bytes, 1), word<double>(own.bytes, 2),
             reinterpret_cast<const float*>(own.bytes.data() + kPushHeader), rep);
  std::vector<bool> owed(static_cast<std::size_t>(size_), boundary_follows);
  const Buffer in = bytes_of(push_in_);
  for (int r = 1; r < size_; ++r) {
    while (peer_.try_receive(r, push_name_, in)) {
      if (word<std::uint64_t>(push_in_, 3) != epoch_) continue;  // from before a restart
      const auto pushed_at = word<std::int64_t>(push_in_, 0);
      const auto weight = word<double>(push_in_, 2);
      if (!(weight > 0) || !std::isfinite(weight) ||
          pushed_at <= applied_[static_cast<std::size_t>(r)]) {
        throw Error(make_error_code(errc::protocol_error),
                    "parameter server '" + push_name_ + "': rank " + std::to_string(r) +
                        " pushed step " + std::to_string(pushed_at) + " with a weight of " +
                        std::to_string(weight) + " after its step " +
                        std::to_string(applied_[static_cast<std::size_t>(r)]) + " was applied");
      }
      accumulate(r, pushed_at, word<std::uint64_t>(push_in_, 1), weight,
                 reinterpret_cast<const float*>(push_in_.data() + kPushHeader), rep);
      owed[static_cast<std::size_t>(r)] = true;
    }
  }
  set_word(params_, 0, step);
  send_parameters(owed, boundary_follows ? session_->boundaries_in_version() + 1 : 0, rep);
}

// Rank 0: its parameters (params_ after the header's step) to the workers `to` names.
void ParameterServer::send_parameters(const std::vector<bool>& to, std::uint64_t mark,
                                      Report& rep) {
  set_word(params_, 1, version_);
  set_word(params_, 2, epoch_);
  set_word(params_, 3, mark);
  for (int r = 0; r < size_; ++r) {
    set_word(params_, kParamsWords + static_cast<std::size_t>(r),
             applied_[static_cast<std::size_t>(r)]);
  }
  for (int r = 1; r < size_; ++r) {
    if (!to[static_cast<std::size_t>(r)]) continue;
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
  const std::size_t header = (kParamsWords + static_cast<std::size_t>(size_)) * kWord;
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
  adopt(message, w);
  view_step_ = sent_at;
}

// Asynchronously: the same, when they belong to this run of the exchange and are newer than the
// view this worker holds; a boundary mark asks for that boundary.
void ParameterServer::take_async(const std::vector<std::byte>& message, std::span<float> w) {
  if (word<std::uint64_t>(message, 2) != epoch_) return;  // from before a restart
  const auto mark = word<std::uint64_t>(message, 3);
  if (rank_ != 0 && mark > session_->boundaries_in_version()) {
    marked_ = std::max(marked_, mark);
    session_->request_boundary();
  }
  const auto applied = word<std::int64_t>(message, kParamsWords + static_cast<std::size_t>(rank_));
  if (applied < applied_mine_) return;  // an older view than the one this worker holds
  applied_mine_ = applied;
  adopt(message, w);
}

// w = the parameters in `message` + this worker's pushes after the last one they applied.
void ParameterServer::adopt(const std::vector<std::byte>& message, std::span<float> w) {
  const auto applied = word<std::int64_t>(message, kParamsWords + static_cast<std::size_t>(rank_));
  while (!pushes_.empty() && pushes_.front().step <= applied) {
    if (pushes_.front().in_flight) pushes_.front().sent.wait_status();
    pushes_.pop_front();
  }
  const std::size_t header = (kParamsWords + static_cast<std::size_t>(size_)) * kWord;
  const auto* ws = reinterpret_cast<const float*>(message.data() + header);
  std::copy(ws, ws + count_, w.begin());
  for (const Push& q : pushes_) {
    const auto* d = reinterpret_cast<const float*>(q.bytes.data() + kPushHeader);
    for (std::size_t i = 0; i < count_; ++i) w[i] += d[i];
  }
  view_version_ = word<std::uint64_t>(message, 1);
}

}  // namespace kf
