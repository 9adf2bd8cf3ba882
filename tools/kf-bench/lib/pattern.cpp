// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/pattern.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace kf::tools::bench {

namespace {

// The largest sum of one element over all workers; below u8's 255 (the poison).
constexpr int kMaxSum = 254;
// Tables are at least this many elements long, so that fill and compare copy long runs.
constexpr std::size_t kMinTableElements = 4096;

// The largest prime <= n (1 for n < 2). A prime period keeps a block at a power-of-two (or any
// non-multiple) offset from matching the block before it, so a misplaced block is caught.
std::size_t prime_at_most(std::size_t n) {
  for (; n >= 2; --n) {
    bool prime = true;
    for (std::size_t d = 2; d * d <= n && prime; ++d) prime = n % d != 0;
    if (prime) return n;
  }
  return 1;
}

// The values repeat with this period: 0..period-1 for sums (kept at or below kMaxSum over all
// workers), up to kMaxSum for min and max, which never grow; prod's 1s and 2s take 61.
std::size_t values_period(ReduceOp op, int workers) {
  if (op == ReduceOp::min || op == ReduceOp::max) return prime_at_most(kMaxSum + 1);
  if (op == ReduceOp::prod) return 61;
  return prime_at_most(static_cast<std::size_t>(kMaxSum / workers + 1));
}

// Value of table position k for worker `rank`: position j of a period of `period` values, with
// a stride and shift per worker so that the workers' contributions (and their minimum and
// maximum) differ from element to element.
double value_at(ReduceOp op, int rank, std::size_t k, std::size_t period) {
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t j = ((2 * r + 1) * k + 13 * r) % period;
  if (op == ReduceOp::prod) return (j % 3 == 0 && rank < 7) ? 2.0 : 1.0;
  return static_cast<double>(j);
}

double combine(ReduceOp op, double acc, double v) {
  switch (op) {
    case ReduceOp::min: return std::min(acc, v);
    case ReduceOp::max: return std::max(acc, v);
    case ReduceOp::prod: return acc * v;
    case ReduceOp::sum:
    case ReduceOp::avg: return acc + v;
  }
  return acc;
}

// Stores the (exactly representable) value v as element i of a dtype array.
void store(std::byte* base, std::size_t i, DType t, double v) {
  const auto put = [&](auto x) { std::memcpy(base + i * sizeof x, &x, sizeof x); };
  switch (t) {
    case DType::f32: return put(static_cast<float>(v));
    case DType::f64: return put(v);
    case DType::f16: return put(float_to_f16(static_cast<float>(v)));
    case DType::bf16: return put(float_to_bf16(static_cast<float>(v)));
    case DType::i32: return put(static_cast<std::int32_t>(v));
    case DType::i64: return put(static_cast<std::int64_t>(v));
    case DType::u8: return put(static_cast<std::uint8_t>(v));
  }
}

}  // namespace

Pattern::Pattern(DType dtype, ReduceOp op, int workers) : element_bytes_(dtype_bytes(dtype)) {
  if (workers < 1) throw std::invalid_argument("a pattern needs at least one worker");
  const std::size_t period = values_period(op, workers);
  length_ = period * ((kMinTableElements + period - 1) / period);
  const std::size_t table_bytes = 2 * length_ * element_bytes_;
  ranks_.assign(static_cast<std::size_t>(workers), std::vector<std::byte>(table_bytes));
  reduced_.assign(table_bytes, std::byte{0});
  for (std::size_t k = 0; k < 2 * length_; ++k) {
    double acc = value_at(op, 0, k, period);
    for (int r = 0; r < workers; ++r) {
      const double v = value_at(op, r, k, period);
      store(ranks_[static_cast<std::size_t>(r)].data(), k, dtype, v);
      if (r > 0) acc = combine(op, acc, v);
    }
    store(reduced_.data(), k, dtype, acc);
  }
  if (op == ReduceOp::avg) {
    // avg is defined as the sum divided by the worker count in the dtype's own arithmetic.
    finish_avg(reduced_.data(), 2 * length_, dtype, static_cast<std::size_t>(workers));
  }
}

std::size_t Pattern::offset(std::size_t first, std::uint64_t iter) const noexcept {
  return static_cast<std::size_t>((first % length_ + iter % length_) % length_);
}

void Pattern::fill(void* dst, std::size_t count, int rank, std::size_t first,
                   std::uint64_t iter) const {
  const std::byte* src =
      ranks_.at(static_cast<std::size_t>(rank)).data() + offset(first, iter) * element_bytes_;
  auto* out = static_cast<std::byte*>(dst);
  while (count > 0) {
    const std::size_t n = std::min(count, length_);
    std::memcpy(out, src, n * element_bytes_);
    out += n * element_bytes_;
    count -= n;
  }
}

bool Pattern::matches(const std::vector<std::byte>& table, const void* got, std::size_t count,
                      std::size_t first, std::uint64_t iter) const {
  const std::byte* want = table.data() + offset(first, iter) * element_bytes_;
  const auto* in = static_cast<const std::byte*>(got);
  while (count > 0) {
    const std::size_t n = std::min(count, length_);
    if (std::memcmp(in, want, n * element_bytes_) != 0) return false;
    in += n * element_bytes_;
    count -= n;
  }
  return true;
}

bool Pattern::matches_rank(const void* got, std::size_t count, int rank, std::size_t first,
                           std::uint64_t iter) const {
  return matches(ranks_.at(static_cast<std::size_t>(rank)), got, count, first, iter);
}

bool Pattern::matches_reduced(const void* got, std::size_t count, std::size_t first,
                              std::uint64_t iter) const {
  return matches(reduced_, got, count, first, iter);
}

void Pattern::poison(void* dst, std::size_t count) const {
  std::memset(dst, 0xff, count * element_bytes_);
}

}  // namespace kf::tools::bench
