// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/pair_averaging.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace kf {
namespace {

constexpr std::size_t kStepBytes = sizeof(std::int64_t);

std::uint64_t mix(std::uint64_t x) noexcept {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::int64_t step_of(const std::vector<std::byte>& m) {
  std::int64_t s = 0;
  std::memcpy(&s, m.data(), kStepBytes);
  return s;
}

float* floats_of(std::vector<std::byte>& m) {
  return reinterpret_cast<float*>(m.data() + kStepBytes);
}

std::int64_t distance(std::int64_t a, std::int64_t b) { return a > b ? a - b : b - a; }

}  // namespace

PairAverager::PairAverager(Peer& peer, std::string name, std::uint64_t seed)
    : peer_(peer), model_name_(name + "/model"), answer_name_(name + "/answer"), seed_(seed) {}

PairAverager::~PairAverager() {
  try {
    reap_sends(/*wait=*/true);
  } catch (...) {  // a failed send: nothing to report from a destructor
  }
}

int PairAverager::partner(std::uint64_t seed, std::int64_t step, int rank, int size) noexcept {
  if (size < 2) return -1;
  const std::uint64_t x =
      mix(mix(seed ^ mix(static_cast<std::uint64_t>(step))) ^ static_cast<std::uint64_t>(rank));
  const int other = static_cast<int>(x % static_cast<std::uint64_t>(size - 1));
  return other < rank ? other : other + 1;
}

// Sends whose frames are written give their buffers back; with `wait`, every one is waited for.
void PairAverager::reap_sends(bool wait) {
  if (push_in_flight_ && (wait || push_handle_.ready())) {
    push_in_flight_ = false;
    push_handle_.wait_status();  // a failed push: its answer never comes (see start_version)
  }
  std::erase_if(answers_, [wait](Sending& s) {
    if (!wait && !s.handle.ready()) return false;
    s.handle.wait_status();
    return true;
  });
}

// A new cluster version: whatever was in flight belonged to the old one and is dropped.
void PairAverager::start_version() {
  reap_sends(/*wait=*/true);
  waiting_on_ = -1;
  version_ = peer_.version();
}

PairAverager::Report PairAverager::exchange(std::span<float> w, std::int64_t step, bool push) {
  Report rep;
  if (count_ == 0) {
    count_ = w.size();
    push_.resize(kStepBytes + count_ * sizeof(float));
    incoming_.resize(push_.size());
  } else if (w.size() != count_) {
    throw std::invalid_argument("PairAverager::exchange: the model has " +
                                std::to_string(w.size()) + " values, it had " +
                                std::to_string(count_));
  }
  if (peer_.version() != version_) start_version();
  reap_sends(/*wait=*/false);
  const int size = peer_.size();
  const int rank = peer_.rank();
  const Buffer in = buffer(reinterpret_cast<std::uint8_t*>(incoming_.data()), incoming_.size());

  // Pushes from others: average, and answer with what the pusher must add.
  for (int from = 0; from < size; ++from) {
    if (from == rank) continue;
    while (peer_.try_receive(from, model_name_, in)) {
      float* m = floats_of(incoming_);
      for (std::size_t i = 0; i < count_; ++i) {
        const float d = (m[i] - w[i]) * 0.5f;
        w[i] += d;
        m[i] = -d;  // the answer, in place
      }
      rep.max_staleness = std::max(rep.max_staleness, distance(step, step_of(incoming_)));
      ++rep.models_averaged;
      Sending s{Handle(), incoming_};
      s.handle =
          peer_.send(from, answer_name_,
                     buffer(reinterpret_cast<std::uint8_t*>(s.bytes.data()), s.bytes.size()));
      rep.bytes_sent += s.bytes.size();
      answers_.push_back(std::move(s));
    }
  }
  // The answer to this worker's own push.
  if (waiting_on_ >= 0 && peer_.try_receive(waiting_on_, answer_name_, in)) {
    const float* c = floats_of(incoming_);
    for (std::size_t i = 0; i < count_; ++i) w[i] += c[i];
    rep.max_staleness = std::max(rep.max_staleness, distance(step, step_of(incoming_)));
    ++rep.corrections;
    waiting_on_ = -1;
  }
  // This step's push, unless the last one is unanswered.
  const int to = partner(seed_, step, rank, size);
  if (push && to >= 0 && waiting_on_ < 0) {
    if (push_in_flight_) {
      // The last push was answered, so it was written long ago; its buffer is reused below.
      // Only it is waited for, not the answers still being written to others.
      push_in_flight_ = false;
      push_handle_.wait_status();
    }
    std::memcpy(push_.data(), &step, kStepBytes);
    std::memcpy(floats_of(push_), w.data(), count_ * sizeof(float));
    push_handle_ = peer_.send(to, model_name_,
                              buffer(reinterpret_cast<std::uint8_t*>(push_.data()), push_.size()));
    push_in_flight_ = true;
    waiting_on_ = to;
    rep.pushed_to = to;
    rep.bytes_sent += push_.size();
  }
  return rep;
}

}  // namespace kf
