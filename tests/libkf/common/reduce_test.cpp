// SPDX-License-Identifier: Apache-2.0
// The vectorised reduction kernels (src/common/reduce.cpp) against the element-wise definition
// (the public scalar conversions and IEEE operations in float), and the CPU-specific paths (f16
// and bf16 with AVX2 and F16C) against the portable loops, bit for bit: every half pattern as
// one operand, at lengths that leave every possible tail, in place and out of place.
// tests/libkf/common/dtype_test.cpp checks the results against independent references.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "common/reduce.hpp"
#include "kf/common/dtype.hpp"

namespace kf {
namespace {

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                             ReduceOp::avg};

// The definition, one element at a time: the operation in float on the converted operands,
// rounded back by the public conversion. min/max: -0 below +0. A NaN result is the default quiet
// NaN, whatever the operands' NaNs.
float combine(float x, float y, ReduceOp op) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return std::isnan(x + y) ? nan : x + y;
    case ReduceOp::prod: return std::isnan(x * y) ? nan : x * y;
    case ReduceOp::min:
    case ReduceOp::max: {
      if (std::isnan(x) || std::isnan(y)) return nan;
      if (x == y) return (std::signbit(x) == (op == ReduceOp::min)) ? x : y;
      return (op == ReduceOp::min) == (x < y) ? x : y;
    }
  }
  return x;
}

struct Half {
  DType t;
  std::uint16_t (*encode)(float) noexcept;
  float (*decode)(std::uint16_t) noexcept;
};
const Half kHalves[] = {{DType::f16, float_to_f16, f16_to_float},
                        {DType::bf16, float_to_bf16, bf16_to_float}};

std::uint16_t half_definition(const Half& h, std::uint16_t a, std::uint16_t b, ReduceOp op) {
  return h.encode(combine(h.decode(a), h.decode(b), op));
}

// Every pattern as the first operand, against partners from a fixed random sequence and a few
// special values (zeros, the smallest subnormal, infinities, NaNs, 1).
void patterns(const Half& h, std::vector<std::uint16_t>& a, std::vector<std::uint16_t>& b) {
  const std::uint16_t inf = h.t == DType::f16 ? 0x7c00 : 0x7f80;
  const std::uint16_t special[] = {0x0000,
                                   0x8000,
                                   0x0001,
                                   0x8001,
                                   inf,
                                   static_cast<std::uint16_t>(inf | 0x8000),
                                   static_cast<std::uint16_t>(inf | 1),
                                   static_cast<std::uint16_t>(inf | 0x8001),
                                   h.encode(1.0f)};
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> any(0, 0xffff);
  for (std::uint32_t x = 0; x <= 0xffff; ++x) {
    for (std::uint16_t s : special) {
      a.push_back(static_cast<std::uint16_t>(x));
      b.push_back(s);
    }
    for (int k = 0; k < 8; ++k) {
      a.push_back(static_cast<std::uint16_t>(x));
      b.push_back(static_cast<std::uint16_t>(any(rng)));
    }
  }
}

TEST(ReduceKernels, HalvesMatchTheElementWiseDefinitionBitForBit) {
  // Without AVX2 and F16C, reduce_to is the portable loop: then this checks that alone.
  std::cout << "reductions use AVX2 (and F16C for f16/bf16) here: "
            << (detail::reduce_uses_simd() ? "yes" : "no") << "\n";
  for (const Half& h : kHalves) {
    std::vector<std::uint16_t> a, b;
    patterns(h, a, b);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
      SCOPED_TRACE(testing::Message() << to_string(h.t) << " " << to_string(op));
      std::vector<std::uint16_t> fast(a.size()), portable(a.size());
      reduce_to(fast.data(), a.data(), b.data(), a.size(), h.t, op);
      detail::reduce_to_portable(portable.data(), a.data(), b.data(), a.size(), h.t, op);
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::uint16_t want = half_definition(h, a[i], b[i], op);
        ASSERT_EQ(portable[i], want) << std::hex << a[i] << " " << b[i];
        ASSERT_EQ(fast[i], want) << std::hex << a[i] << " " << b[i];
      }
    }
  }
}

TEST(ReduceKernels, HalfAverageMatchesTheDefinitionBitForBit) {
  for (const Half& h : kHalves) {
    SCOPED_TRACE(to_string(h.t));
    std::vector<std::uint16_t> all(0x10000);
    for (std::uint32_t x = 0; x <= 0xffff; ++x) all[x] = static_cast<std::uint16_t>(x);
    for (std::size_t n : {2u, 3u, 7u, 1000u}) {
      std::vector<std::uint16_t> fast = all, portable = all;
      finish_avg(fast.data(), fast.size(), h.t, n);
      detail::finish_avg_portable(portable.data(), portable.size(), h.t, n);
      for (std::size_t i = 0; i < all.size(); ++i) {
        const float q = h.decode(all[i]) / static_cast<float>(n);
        const std::uint16_t want =
            h.encode(std::isnan(q) ? std::numeric_limits<float>::quiet_NaN() : q);
        ASSERT_EQ(portable[i], want) << std::hex << all[i] << " / " << std::dec << n;
        ASSERT_EQ(fast[i], want) << std::hex << all[i] << " / " << std::dec << n;
      }
    }
  }
}

// Raw bytes of n elements of t, filled from rng; for the float types, values of every kind
// (the vector loops must handle NaN, infinities and signed zeros in any lane).
std::vector<unsigned char> random_elements(DType t, std::size_t n, std::mt19937& rng) {
  std::vector<unsigned char> v(n * dtype_bytes(t));
  for (auto& byte : v) byte = static_cast<unsigned char>(rng());
  const auto put = [&](std::size_t i, double x) {
    if (t == DType::f32) {
      const float f = static_cast<float>(x);
      std::memcpy(&v[i * 4], &f, 4);
    } else if (t == DType::f64) {
      std::memcpy(&v[i * 8], &x, 8);
    }
  };
  if (t == DType::f32 || t == DType::f64) {
    const double specials[] = {0.0,
                               -0.0,
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN(),
                               1.0,
                               -2.5};
    for (std::size_t i = 0; i < n; i += 3) put(i, specials[rng() % 7]);
  }
  return v;
}

// Every length up to 70 (every tail of a 8-, 16- or 32-element step; one element takes a path
// of its own) and a long one, with the result written over the first operand (reduce_into) and
// into a third buffer: the same bytes as the same reduction done one element at a time through
// the portable loop.
TEST(ReduceKernels, EveryLengthInPlaceAndOutOfPlaceMatchesElementByElement) {
  std::mt19937 rng(5);
  for (DType t :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    const std::size_t w = dtype_bytes(t);
    for (ReduceOp op : kOps) {
      SCOPED_TRACE(testing::Message() << to_string(t) << " " << to_string(op));
      for (std::size_t n = 0; n <= 70 + 1000; n += (n < 70 ? 1 : 1000)) {
        const auto a = random_elements(t, n, rng);
        const auto b = random_elements(t, n, rng);
        std::vector<unsigned char> want(n * w);
        for (std::size_t i = 0; i < n; ++i) {
          detail::reduce_to_portable(&want[i * w], &a[i * w], &b[i * w], 1, t, op);
        }
        std::vector<unsigned char> out(n * w, 0xa5);
        reduce_to(out.data(), a.data(), b.data(), n, t, op);
        std::vector<unsigned char> acc = a;
        reduce_into(acc.data(), b.data(), n, t, op);
        // Bytes, NaN payloads included: a vector operation propagates a NaN operand as the
        // scalar one does.
        ASSERT_TRUE(out == want) << "out of place, n = " << n;
        ASSERT_TRUE(acc == want) << "in place, n = " << n;
      }
    }
  }
}

}  // namespace
}  // namespace kf
