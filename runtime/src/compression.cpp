// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/compression.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "kf/common/error.hpp"
#include "kf/common/log.hpp"

namespace kf {
namespace {

constexpr std::size_t kMaxIndexed = std::numeric_limits<std::uint32_t>::max();

// splitmix64: a fixed, portable generator, so that every worker (whatever its standard library)
// draws the same indices and the same initial Q.
class Stream {
 public:
  explicit Stream(std::uint64_t state) : state_(state) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound >= 1: rejection keeps it unbiased.
  std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t x = next();
      if (x >= threshold) return x % bound;
    }
  }
  // Uniform in [-1, 1) on a grid of 2^-23: exact in float.
  float symmetric_unit() noexcept {
    return static_cast<float>(static_cast<double>(next() >> 40) * 0x1p-23 - 1.0);
  }

 private:
  std::uint64_t state_;
};

// Distinct streams for randomk's indices and PowerSGD's Q draws of the same (seed, step).
constexpr std::uint64_t kIndexSalt = 0x72616e646f6d6bull;  // "randomk"
constexpr std::uint64_t kQSalt = 0x706f77657273ull;        // "powers"

Stream stream_for(std::uint64_t seed, std::int64_t step, std::uint64_t salt) {
  Stream s(seed ^ salt);
  return Stream(s.next() ^ static_cast<std::uint64_t>(step));
}

// NaN ranks above every number (see top_k).
bool larger_magnitude(float a, float b) noexcept {
  const float ma = std::fabs(a), mb = std::fabs(b);
  if (std::isnan(ma)) return !std::isnan(mb);
  if (std::isnan(mb)) return false;
  return ma > mb;
}

std::string bad_ratio(double ratio) {
  return "a ratio in (0, 1] (the fraction of values sent), got " + std::to_string(ratio);
}

// acc[i] = a[i] + b[i]
void add(const float* a, const float* b, float* acc, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = a[i] + b[i];
}

void divide(float* v, std::size_t n, int size) noexcept {
  const float s = static_cast<float>(size);
  for (std::size_t i = 0; i < n; ++i) v[i] = v[i] / s;
}

void allreduce_mean(Peer& peer, const std::string& name, std::vector<float>& v) {
  peer.allreduce(name, buffer(v.data(), v.size()), buffer(v.data(), v.size())).wait();
  divide(v.data(), v.size(), peer.size());
}

std::uint16_t to_half(float v, DType t) noexcept {
  const bool f16 = t == DType::f16;
  const std::uint16_t h = f16 ? float_to_f16(v) : float_to_bf16(v);
  const float back = f16 ? f16_to_float(h) : bf16_to_float(h);
  if (std::isfinite(v) && !std::isfinite(back)) {
    // Saturate, so that the residual carries the excess instead of becoming infinite.
    const std::uint16_t largest = f16 ? 0x7bff : 0x7f7f;
    return static_cast<std::uint16_t>(largest | (std::signbit(v) ? 0x8000 : 0));
  }
  return h;
}

float from_half(std::uint16_t h, DType t) noexcept {
  return t == DType::f16 ? f16_to_float(h) : bf16_to_float(h);
}

// p (rows x r) = m (rows x cols) * q (cols x r), row-major, accumulated in double.
void multiply(const float* m, const float* q, float* p, std::size_t rows, std::size_t cols,
              std::size_t r) {
  std::vector<double> row(r);
  for (std::size_t i = 0; i < rows; ++i) {
    std::fill(row.begin(), row.end(), 0.0);
    for (std::size_t c = 0; c < cols; ++c) {
      const double x = m[i * cols + c];
      for (std::size_t j = 0; j < r; ++j) row[j] += x * q[c * r + j];
    }
    for (std::size_t j = 0; j < r; ++j) p[i * r + j] = static_cast<float>(row[j]);
  }
}

// q (cols x r) = m^T * p (rows x r), accumulated in double.
void multiply_transposed(const float* m, const float* p, float* q, std::size_t rows,
                         std::size_t cols, std::size_t r) {
  std::vector<double> acc(cols * r, 0.0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t c = 0; c < cols; ++c) {
      const double x = m[i * cols + c];
      for (std::size_t j = 0; j < r; ++j) acc[c * r + j] += x * p[i * r + j];
    }
  }
  for (std::size_t e = 0; e < acc.size(); ++e) q[e] = static_cast<float>(acc[e]);
}

// out (rows x cols) = sub - p (rows x r) * q^T (q: cols x r), or p * q^T when sub is null.
void outer(const float* p, const float* q, const float* sub, float* out, std::size_t rows,
           std::size_t cols, std::size_t r) {
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t c = 0; c < cols; ++c) {
      double x = 0;
      for (std::size_t j = 0; j < r; ++j) x += double{p[i * r + j]} * q[c * r + j];
      const std::size_t e = i * cols + c;
      out[e] = sub ? sub[e] - static_cast<float>(x) : static_cast<float>(x);
    }
  }
}

// Modified Gram-Schmidt on p's r columns, in double and twice over (one pass loses
// orthogonality when columns are nearly dependent). A column left with less than kDependent of
// its norm lies in the span of the earlier ones up to float rounding: it becomes zero rather
// than a normalised rounding error. Deterministic, so every worker gets the same result.
void orthonormalise(float* p, std::size_t rows, std::size_t r) {
  constexpr double kDependent = 1e-6;
  std::vector<double> a(p, p + rows * r);
  auto dot = [&](std::size_t x, std::size_t y) {
    double s = 0;
    for (std::size_t i = 0; i < rows; ++i) s += a[i * r + x] * a[i * r + y];
    return s;
  };
  for (std::size_t j = 0; j < r; ++j) {
    const double before = std::sqrt(dot(j, j));
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < j; ++k) {
        const double d = dot(k, j);
        for (std::size_t i = 0; i < rows; ++i) a[i * r + j] -= d * a[i * r + k];
      }
    }
    const double after = std::sqrt(dot(j, j));
    const double scale = after > 0 && after > kDependent * before ? 1 / after : 0;
    for (std::size_t i = 0; i < rows; ++i) a[i * r + j] *= scale;
  }
  for (std::size_t e = 0; e < a.size(); ++e) p[e] = static_cast<float>(a[e]);
}

// Draws q's column j (cols x r) afresh: the initial Q, and columns a zero gradient emptied.
void draw_column(float* q, std::size_t cols, std::size_t r, std::size_t j, std::uint64_t seed,
                 std::int64_t step) {
  Stream s = stream_for(seed ^ (0xc0ffeeull * (j + 1)), step, kQSalt);
  for (std::size_t c = 0; c < cols; ++c) q[c * r + j] = s.symmetric_unit();
}

}  // namespace

namespace compression {

std::vector<std::uint32_t> top_k(std::span<const float> values, std::size_t k) {
  const std::size_t n = values.size();
  if (n > kMaxIndexed) {
    throw std::invalid_argument("top_k: " + std::to_string(n) +
                                " values do not fit uint32 indices");
  }
  if (k > n) {
    throw std::invalid_argument("top_k: k = " + std::to_string(k) + " is more than the " +
                                std::to_string(n) + " values");
  }
  std::vector<std::uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::uint32_t{0});
  // A strict total order (magnitude, then index), so that the chosen set is unique.
  auto before = [&](std::uint32_t a, std::uint32_t b) {
    if (larger_magnitude(values[a], values[b])) return true;
    if (larger_magnitude(values[b], values[a])) return false;
    return a < b;
  };
  if (k < n)
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), before);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<std::uint32_t> random_k(std::size_t n, std::size_t k, std::uint64_t seed,
                                    std::int64_t step) {
  if (n > kMaxIndexed) {
    throw std::invalid_argument("random_k: n = " + std::to_string(n) +
                                " does not fit uint32 indices");
  }
  if (k > n) {
    throw std::invalid_argument("random_k: k = " + std::to_string(k) +
                                " is more than n = " + std::to_string(n));
  }
  // Floyd's sampling: k draws give k distinct indices, each k-subset equally likely. A bitmap
  // (n / 32 of the gradient's bytes) keeps membership and yields the indices in order.
  Stream s = stream_for(seed, step, kIndexSalt);
  std::vector<bool> chosen(n, false);
  for (std::size_t j = n - k; j < n; ++j) {
    const std::size_t t = s.below(j + 1);
    chosen[chosen[t] ? j : t] = true;
  }
  std::vector<std::uint32_t> out;
  out.reserve(k);
  for (std::size_t i = 0; i < n; ++i) {
    if (chosen[i]) out.push_back(static_cast<std::uint32_t>(i));
  }
  return out;
}

std::size_t count_for(double ratio, std::size_t n) {
  if (!(ratio > 0 && ratio <= 1)) {
    throw std::invalid_argument("count_for: needs " + bad_ratio(ratio));
  }
  const auto k = static_cast<std::size_t>(std::llround(ratio * static_cast<double>(n)));
  return std::min(n, std::max<std::size_t>(1, k));
}

}  // namespace compression

GradientCompressor::GradientCompressor(CompressionSpec spec, std::size_t n, std::uint64_t seed,
                                       std::size_t rows)
    : spec_(spec), n_(n), seed_(seed) {
  const std::string what = "GradientCompressor(" + spec.str() + ", n = " + std::to_string(n) + ")";
  if (n == 0) throw std::invalid_argument(what + ": the gradient length n must be at least 1");
  switch (spec.kind) {
    case Compression::none:
    case Compression::fp16:
    case Compression::bf16: break;
    case Compression::topk:
    case Compression::randomk:
      if (!(spec.ratio > 0 && spec.ratio <= 1)) {
        throw std::invalid_argument(what + ": needs " + bad_ratio(spec.ratio));
      }
      if (n > kMaxIndexed) {
        throw std::invalid_argument(what + ": n does not fit the uint32 indices " + spec.str() +
                                    " works with");
      }
      k_ = compression::count_for(spec.ratio, n);
      break;
    case Compression::powersgd:
      if (spec.rank < 1) {
        throw std::invalid_argument(what + ": powersgd needs a rank of at least 1, got " +
                                    std::to_string(spec.rank));
      }
      if (rows == 0) {
        rows = static_cast<std::size_t>(std::sqrt(static_cast<double>(n)));
        // Correct the square root's rounding (possible beyond 2^52).
        while (rows * rows > n) --rows;
        while ((rows + 1) * (rows + 1) <= n) ++rows;
        while (n % rows != 0) --rows;
      } else if (n % rows != 0) {
        throw std::invalid_argument(what + ": rows = " + std::to_string(rows) +
                                    " does not divide n (rows x cols must be n)");
      }
      rows_ = rows;
      cols_ = n / rows;
      rank_ = std::min({static_cast<std::size_t>(spec.rank), rows_, cols_});
      q_.resize(cols_ * rank_);
      for (std::size_t j = 0; j < rank_; ++j) draw_column(q_.data(), cols_, rank_, j, seed_, 0);
      break;
  }
  residual_.assign(n, 0.f);
  if (spec.kind != Compression::none) acc_.resize(n);
}

void GradientCompressor::set_momentum(double m, std::span<const float> start, bool masking) {
  const std::string what = "GradientCompressor(" + spec_.str() + ")::set_momentum";
  if (!(m >= 0 && m < 1)) {
    throw std::invalid_argument(what + ": the momentum must be in [0, 1), got " +
                                std::to_string(m));
  }
  if (m > 0 && spec_.kind != Compression::topk && spec_.kind != Compression::randomk) {
    throw std::invalid_argument(what + ": momentum correction applies to topk and randomk only");
  }
  if (!start.empty() && start.size() != n_) {
    throw std::invalid_argument(what + ": the starting velocity has " +
                                std::to_string(start.size()) +
                                " values, not n = " + std::to_string(n_));
  }
  momentum_ = static_cast<float>(m);
  masking_ = m > 0 && masking;
  if (m == 0) {
    velocity_ = {};
    next_velocity_ = {};
    return;
  }
  velocity_.assign(n_, 0.f);
  if (!start.empty()) std::copy(start.begin(), start.end(), velocity_.begin());
  next_velocity_.resize(n_);
}

void GradientCompressor::accumulate(const float* grad) {
  if (momentum_ == 0) {
    add(grad, residual_.data(), acc_.data(), n_);
    return;
  }
  for (std::size_t i = 0; i < n_; ++i) {
    next_velocity_[i] = momentum_ * velocity_[i] + grad[i];
    acc_[i] = next_velocity_[i] + residual_[i];
  }
}

void GradientCompressor::commit(std::span<const std::uint32_t> sent) {
  std::copy(acc_.begin(), acc_.end(), residual_.begin());
  if (momentum_ == 0) return;
  velocity_.swap(next_velocity_);
  if (masking_) {
    for (std::uint32_t i : sent) velocity_[i] = 0.f;
  }
}

std::size_t GradientCompressor::average(Peer& peer, const std::string& name, float* grad,
                                        std::int64_t step) {
  if (!grad)
    throw std::invalid_argument("GradientCompressor::average '" + name + "': grad is null");
  switch (spec_.kind) {
    case Compression::none:
      peer.allreduce(name, buffer(grad, n_), buffer(grad, n_)).wait();
      divide(grad, n_, peer.size());
      return n_ * sizeof(float);
    case Compression::fp16: return average_cast(peer, name, grad, DType::f16);
    case Compression::bf16: return average_cast(peer, name, grad, DType::bf16);
    case Compression::topk: return average_topk(peer, name, grad);
    case Compression::randomk: return average_randomk(peer, name, grad, step);
    case Compression::powersgd: return average_powersgd(peer, name, grad, step);
  }
  KF_CHECK(false, "GradientCompressor::average: unknown compression kind");
}

std::size_t GradientCompressor::average_cast(Peer& peer, const std::string& name, float* grad,
                                             DType half) {
  add(grad, residual_.data(), acc_.data(), n_);
  std::vector<std::uint16_t> sent(n_);
  for (std::size_t i = 0; i < n_; ++i) {
    sent[i] = to_half(acc_[i], half);
    // A value that is not finite is sent as it is and leaves no residual (inf - inf is NaN,
    // which would poison every later step).
    acc_[i] = std::isfinite(acc_[i]) ? acc_[i] - from_half(sent[i], half) : 0.f;
  }
  const Buffer b{sent.data(), n_, half, Device::cpu};
  peer.allreduce(name, b, b).wait();
  for (std::size_t i = 0; i < n_; ++i) grad[i] = from_half(sent[i], half);
  divide(grad, n_, peer.size());
  std::copy(acc_.begin(), acc_.end(), residual_.begin());
  return n_ * sizeof(std::uint16_t);
}

std::size_t GradientCompressor::average_topk(Peer& peer, const std::string& name, float* grad) {
  accumulate(grad);
  const std::vector<std::uint32_t> idx = compression::top_k(acc_, k_);
  // One record per worker, in the worker's byte order (a job's workers share one): k uint32
  // indices, then the k float values.
  const std::size_t record_bytes = k_ * (sizeof(std::uint32_t) + sizeof(float));
  std::vector<std::uint8_t> record(record_bytes);
  std::memcpy(record.data(), idx.data(), k_ * sizeof(std::uint32_t));
  for (std::size_t j = 0; j < k_; ++j) {
    std::memcpy(record.data() + (k_ + j) * sizeof(float), &acc_[idx[j]], sizeof(float));
    acc_[idx[j]] = 0.f;
  }
  const auto size = static_cast<std::size_t>(peer.size());
  std::vector<std::uint8_t> all(size * record_bytes);
  peer.allgather(name, buffer(record.data(), record_bytes), buffer(all.data(), all.size())).wait();
  // Summed in rank order on every worker, so that every worker gets the same bits.
  std::fill(grad, grad + n_, 0.f);
  for (std::size_t w = 0; w < size; ++w) {
    const std::uint8_t* r = all.data() + w * record_bytes;
    for (std::size_t j = 0; j < k_; ++j) {
      std::uint32_t i;
      float v;
      std::memcpy(&i, r + j * sizeof(std::uint32_t), sizeof i);
      std::memcpy(&v, r + (k_ + j) * sizeof(float), sizeof v);
      if (i >= n_) {
        throw Error(errc::protocol_error, "topk '" + name + "': the record of rank " +
                                              std::to_string(w) + " holds index " +
                                              std::to_string(i) + " >= n = " + std::to_string(n_));
      }
      grad[i] += v;
    }
  }
  divide(grad, n_, peer.size());
  commit(idx);
  return record_bytes;
}

std::size_t GradientCompressor::average_randomk(Peer& peer, const std::string& name, float* grad,
                                                std::int64_t step) {
  accumulate(grad);
  const std::vector<std::uint32_t> idx = compression::random_k(n_, k_, seed_, step);
  std::vector<float> values(k_);
  for (std::size_t j = 0; j < k_; ++j) {
    values[j] = acc_[idx[j]];
    acc_[idx[j]] = 0.f;
  }
  peer.allreduce(name, buffer(values.data(), k_), buffer(values.data(), k_)).wait();
  divide(values.data(), k_, peer.size());
  std::fill(grad, grad + n_, 0.f);
  for (std::size_t j = 0; j < k_; ++j) grad[idx[j]] = values[j];
  commit(idx);
  return k_ * sizeof(float);
}

std::size_t GradientCompressor::average_powersgd(Peer& peer, const std::string& name, float* grad,
                                                 std::int64_t step) {
  const std::size_t rows = rows_, cols = cols_, r = rank_;
  add(grad, residual_.data(), acc_.data(), n_);
  const float* m = acc_.data();
  std::vector<float> p(rows * r);
  multiply(m, q_.data(), p.data(), rows, cols, r);
  allreduce_mean(peer, name + "/p", p);
  orthonormalise(p.data(), rows, r);
  std::vector<float> q_own(cols * r);
  multiply_transposed(m, p.data(), q_own.data(), rows, cols, r);
  std::vector<float> q = q_own;
  allreduce_mean(peer, name + "/q", q);
  outer(p.data(), q.data(), nullptr, grad, rows, cols, r);
  // The residual: what this worker's own projection P Q_own^T left out (header, step 4).
  outer(p.data(), q_own.data(), m, acc_.data(), rows, cols, r);
  for (std::size_t j = 0; j < r; ++j) {
    bool zero = true;
    for (std::size_t c = 0; c < cols && zero; ++c) zero = q[c * r + j] == 0.f;
    if (zero) draw_column(q.data(), cols, r, j, seed_, step + 1);
  }
  std::copy(acc_.begin(), acc_.end(), residual_.begin());
  std::copy(q.begin(), q.end(), q_.begin());
  return (rows + cols) * r * sizeof(float);
}

}  // namespace kf
