// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/piece_sampler.hpp"

#include <algorithm>
#include <stdexcept>

#include "kf/common/error.hpp"
#include "session/support.hpp"

namespace kf {

PieceSampler::PieceSampler(std::size_t dataset_size, std::uint64_t seed, State& state,
                           const std::string& name)
    : order_(dataset_size, seed),
      used_(dataset_size, 0),
      epoch_(&state.counter(name + ".epoch")),
      plan_version_(&state.counter(name + ".plan_version")),
      plan_index_(&state.counter(name + ".plan_index")),
      cursor_(&state.counter(name + ".cursor")) {
  state.add(name + ".used", buffer(used_.data(), used_.size()));
}

std::vector<std::size_t> PieceSampler::cut(std::span<const std::size_t> order,
                                           std::span<const std::uint8_t> used, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument("PieceSampler::cut: rank " + std::to_string(rank) + " of " +
                                std::to_string(size));
  }
  std::vector<std::size_t> rest;
  for (std::size_t id : order) {
    if (id < used.size() && used[id] == 0) rest.push_back(id);
  }
  const std::size_t n = rest.size(), k = static_cast<std::size_t>(size);
  const std::size_t r = static_cast<std::size_t>(rank);
  return {rest.begin() + static_cast<std::ptrdiff_t>(n * r / k),
          rest.begin() + static_cast<std::ptrdiff_t>(n * (r + 1) / k)};
}

void PieceSampler::cut_piece(const Session& session) {
  order_.start_epoch(*epoch_, 0);
  const auto order = order_.range(0, order_.size());
  piece_ = cut(order, used_, session.rank(), session.size());
  piece_version_ = *plan_version_;
  piece_index_ = *plan_index_;
  piece_epoch_ = *epoch_;
}

std::optional<Session::Outcome> PieceSampler::settle(Session& session) {
  epoch_ended_ = false;
  settled_ = Settled::kept;
  const auto v = static_cast<std::int64_t>(session.version());
  const auto b = static_cast<std::int64_t>(session.boundaries_in_version());
  if (*plan_version_ == v && *plan_index_ == b) return std::nullopt;
  if (*plan_version_ == v && session.size() > 1) {
    // A boundary without a change: every worker is here; join what each used since the plan.
    CollOptions o;
    o.op = ReduceOp::max;
    try {
      session.peer()
          .allreduce("kf.pieces", buffer(used_.data(), used_.size()),
                     buffer(used_.data(), used_.size()), o)
          .wait();
    } catch (const Error& e) {
      if (!detail::is_peer_failure(e.code())) throw;
      return session.recover(e);
    }
  }
  // After a change the state is the one every worker took: nothing to join.
  settled_ = *plan_version_ == v ? Settled::after_boundary : Settled::after_change;
  epoch_ended_ = std::all_of(used_.begin(), used_.end(), [](std::uint8_t u) { return u != 0; });
  if (epoch_ended_) {
    ++*epoch_;
    std::fill(used_.begin(), used_.end(), std::uint8_t{0});
  }
  used_at_plan_ = static_cast<std::size_t>(
      std::count_if(used_.begin(), used_.end(), [](std::uint8_t u) { return u != 0; }));
  *plan_version_ = v;
  *plan_index_ = b;
  *cursor_ = 0;
  cut_piece(session);
  return std::nullopt;
}

std::vector<std::size_t> PieceSampler::take(Session& session, std::size_t count) {
  if (piece_version_ != *plan_version_ || piece_index_ != *plan_index_ || piece_epoch_ != *epoch_ ||
      *plan_version_ != static_cast<std::int64_t>(session.version())) {
    // The piece was cut from the used set at the plan, which take() has changed since.
    throw std::logic_error(
        "PieceSampler::take: call settle() before each step (the plan is of "
        "version " +
        std::to_string(*plan_version_) + ", the session is at " +
        std::to_string(session.version()) + ")");
  }
  const std::size_t at = std::min(static_cast<std::size_t>(*cursor_), piece_.size());
  const std::size_t n = std::min(count, piece_.size() - at);
  std::vector<std::size_t> out(piece_.begin() + static_cast<std::ptrdiff_t>(at),
                               piece_.begin() + static_cast<std::ptrdiff_t>(at + n));
  for (std::size_t id : out) used_[id] = 1;
  *cursor_ += static_cast<std::int64_t>(n);
  if (static_cast<std::size_t>(*cursor_) >= piece_.size()) session.request_boundary();
  return out;
}

std::size_t PieceSampler::left() const noexcept {
  return piece_.size() - std::min(static_cast<std::size_t>(*cursor_), piece_.size());
}

}  // namespace kf
