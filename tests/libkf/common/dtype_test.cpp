// SPDX-License-Identifier: Apache-2.0
// Half-precision conversions against an independent reference (nearest representable value
// found by binary search over all halves, in double arithmetic), and the reduction kernels for
// every (dtype, op) against per-element references, including bitwise commutativity.
#include "kf/common/dtype.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace kf {
namespace {

// ---- an independent model of binary16 and bfloat16 ----------------------------------------

struct HalfFormat {
  int mantissa_bits;  // stored bits: 10 for f16, 7 for bf16
  int exponent_bias;  // 15, 127
  std::uint16_t inf;  // 0x7c00, 0x7f80
  std::uint16_t (*encode)(float) noexcept;
  float (*decode)(std::uint16_t) noexcept;
};

const HalfFormat kF16{10, 15, 0x7c00, float_to_f16, f16_to_float};
const HalfFormat kBf16{7, 127, 0x7f80, float_to_bf16, bf16_to_float};

// The magnitude of a non-negative pattern; the pattern `inf` gives 2^(emax+1), where rounding
// to infinity starts.
double magnitude(const HalfFormat& f, std::uint16_t h) {
  const int m = f.mantissa_bits;
  const int e = h >> m;
  const double man = h & ((1 << m) - 1);
  if (e == 0) return std::ldexp(man, 1 - f.exponent_bias - m);
  return std::ldexp(man + std::ldexp(1.0, m), e - f.exponent_bias - m);
}

bool is_nan(const HalfFormat& f, std::uint16_t h) { return (h & 0x7fff) > f.inf; }

double value(const HalfFormat& f, std::uint16_t h) {
  if (is_nan(f, h)) return std::numeric_limits<double>::quiet_NaN();
  const double m =
      (h & 0x7fff) == f.inf ? std::numeric_limits<double>::infinity() : magnitude(f, h & 0x7fff);
  return (h & 0x8000) ? -m : m;
}

// All non-negative finite magnitudes in pattern order, then 2^(emax+1) at index `inf`.
std::vector<double> grid(const HalfFormat& f) {
  std::vector<double> g(f.inf + 1);
  for (std::uint32_t h = 0; h <= f.inf; ++h) g[h] = magnitude(f, static_cast<std::uint16_t>(h));
  return g;
}

// Round x (not NaN) to the nearest half, ties to the even pattern. Both neighbours are in the
// same or adjacent binades, so the distances are exact in double.
std::uint16_t reference_round(const HalfFormat& f, const std::vector<double>& g, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::abs(x);
  if (a >= g.back()) return sign | f.inf;
  const auto it = std::lower_bound(g.begin(), g.end(), a);
  auto hi = static_cast<std::uint16_t>(it - g.begin());
  if (g[hi] == a) return sign | hi;
  const std::uint16_t lo = hi - 1;
  const double dlo = a - g[lo], dhi = g[hi] - a;
  std::uint16_t pick = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
  return sign | pick;
}

class HalfTest : public testing::TestWithParam<const HalfFormat*> {};

TEST_P(HalfTest, RoundTripIsIdentityOnEveryPattern) {
  const HalfFormat& f = *GetParam();
  for (std::uint32_t i = 0; i < 0x10000; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float x = f.decode(h);
    if (is_nan(f, h)) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << i;
      const std::uint16_t back = f.encode(x);
      ASSERT_TRUE(is_nan(f, back)) << std::hex << i << " -> " << back;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << i;
      continue;
    }
    // The decoded value is exact and has the right sign (also for ±0 and ±inf).
    ASSERT_EQ(static_cast<double>(x), value(f, h)) << std::hex << i;
    ASSERT_EQ(std::signbit(x), (h & 0x8000) != 0) << std::hex << i;
    ASSERT_EQ(f.encode(x), h) << std::hex << i;
  }
}

void expect_rounds_like_reference(const HalfFormat& f, const std::vector<double>& g, float x) {
  if (std::isnan(x)) {
    EXPECT_TRUE(is_nan(f, f.encode(x)));
    return;
  }
  ASSERT_EQ(f.encode(x), reference_round(f, g, x))
      << std::hexfloat << x << " bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x);
}

TEST_P(HalfTest, RoundsRandomFloatsToNearestEven) {
  const HalfFormat& f = *GetParam();
  const auto g = grid(f);
  std::mt19937 rng(20240611);
  // Any bit pattern: every exponent, NaNs and infinities included.
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 300000; ++i)
    expect_rounds_like_reference(f, g, std::bit_cast<float>(bits(rng)));
  // Magnitudes around the format's range: subnormals, normals, overflow.
  const int emin = 1 - f.exponent_bias - f.mantissa_bits - 3;
  const int emax = f.exponent_bias + 3 > 127 ? 127 : f.exponent_bias + 3;
  std::uniform_int_distribution<int> exp(emin, emax);
  std::uniform_int_distribution<std::uint32_t> man(0, (1u << 23) - 1);
  for (int i = 0; i < 300000; ++i) {
    const float m = 1.0f + std::ldexp(static_cast<float>(man(rng)), -23);
    const float x = std::ldexp(m, exp(rng)) * ((i & 1) ? -1.0f : 1.0f);
    expect_rounds_like_reference(f, g, x);
  }
}

// Every midpoint between neighbouring halves (a tie), and the floats just beside it.
TEST_P(HalfTest, RoundsEveryTieToEvenAndNeighboursToNearest) {
  const HalfFormat& f = *GetParam();
  const auto g = grid(f);
  for (std::uint32_t h = 0; h < f.inf; ++h) {
    const auto mid = static_cast<float>((g[h] + g[h + 1]) / 2);  // exact: one more bit
    ASSERT_EQ(static_cast<double>(mid), (g[h] + g[h + 1]) / 2);
    const std::uint16_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(f.encode(mid), even) << std::hex << h;
    ASSERT_EQ(f.encode(-mid), 0x8000 | even) << std::hex << h;
    ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(f.encode(std::nextafter(mid, INFINITY)), h + 1) << std::hex << h;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfTest, testing::Values(&kF16, &kBf16),
                         [](const auto& p) { return p.param == &kF16 ? "f16" : "bf16"; });

TEST(F16, KnownValues) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // the tie with 2^16 goes to the even pattern: inf
  EXPECT_EQ(float_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(float_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0: even
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: even
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: even
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7c01)));  // signalling NaN stays NaN
}

TEST(Bf16, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past bf16 max
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7f8000u)), 0x7f80);  // tie: even (inf)
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: even
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
}

// ---- reductions --------------------------------------------------------------------------

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::min, ReduceOp::max, ReduceOp::prod,
                             ReduceOp::avg};
constexpr DType kTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                            DType::i32, DType::i64, DType::u8};
constexpr std::size_t kRanks = 3;  // the n of finish_avg

// Every ordered pair (x[i], x[j]) as two element-wise operand arrays.
template <typename T>
void all_pairs(const std::vector<T>& x, std::vector<T>& a, std::vector<T>& b) {
  for (const T& u : x) {
    for (const T& v : x) {
      a.push_back(u);
      b.push_back(v);
    }
  }
}

template <typename T>
std::vector<T> reduce(std::vector<T> acc, const std::vector<T>& in, DType t, ReduceOp op) {
  reduce_into(acc.data(), in.data(), acc.size(), t, op);
  if (op == ReduceOp::avg) finish_avg(acc.data(), acc.size(), t, kRanks);
  return acc;
}

template <typename T>
bool same_bits(const T& x, const T& y) {
  return std::memcmp(&x, &y, sizeof(T)) == 0;
}

// The expected float result: IEEE ops in T; min/max propagate NaN and order -0 below +0.
template <typename T>
T float_reference(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::avg: return (a + b) / static_cast<T>(kRanks);
    case ReduceOp::prod: return a * b;
    case ReduceOp::min:
    case ReduceOp::max: {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
      const bool take_a = op == ReduceOp::min ? (a < b || (a == b && std::signbit(a)))
                                              : (a > b || (a == b && !std::signbit(a)));
      return take_a ? a : b;
    }
  }
  return a;
}

template <typename T>
std::vector<T> float_values() {
  using L = std::numeric_limits<T>;
  return {T(0),
          -T(0),
          T(1),
          T(-1),
          T(0.5),
          T(3),
          T(-2.75),
          T(1e-3),
          T(123.456),
          L::min(),
          -L::min(),
          L::denorm_min(),
          L::max(),
          L::lowest(),
          L::infinity(),
          -L::infinity(),
          L::quiet_NaN(),
          L::epsilon(),
          T(1) + L::epsilon()};
}

template <typename T>
void check_float_type(DType t) {
  std::vector<T> a, b;
  all_pairs(float_values<T>(), a, b);
  for (auto op : kOps) {
    SCOPED_TRACE(testing::Message() << to_string(t) << " " << to_string(op));
    const auto got = reduce(a, b, t, op);
    const auto swapped = reduce(b, a, t, op);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const T want = float_reference(a[i], b[i], op);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << a[i] << " " << b[i];
      } else {
        EXPECT_TRUE(same_bits(got[i], want)) << a[i] << " " << b[i] << " -> " << got[i];
      }
      // Bitwise commutative; for sum/prod only when at most one operand is NaN (two NaNs
      // propagate the first operand's payload on x86).
      if (!(std::isnan(a[i]) && std::isnan(b[i])) || op == ReduceOp::min || op == ReduceOp::max) {
        EXPECT_TRUE(same_bits(got[i], swapped[i])) << a[i] << " " << b[i];
      }
    }
  }
}

TEST(Reduce, FloatTypesMatchIeeeAndCommute) {
  check_float_type<float>(DType::f32);
  check_float_type<double>(DType::f64);
}

// Half results are correctly rounded: the exact result of the op in double, rounded once.
// (Computing in float and rounding again gives the same answer, as float has at least
// 2·11 + 2 bits.)
std::uint16_t half_reference(const HalfFormat& f, const std::vector<double>& g, std::uint16_t a,
                             std::uint16_t b, ReduceOp op) {
  const double x = value(f, a), y = value(f, b);
  const auto nan = static_cast<std::uint16_t>(f.inf | 1);
  switch (op) {
    case ReduceOp::sum: return std::isnan(x + y) ? nan : reference_round(f, g, x + y);
    case ReduceOp::prod: return std::isnan(x * y) ? nan : reference_round(f, g, x * y);
    case ReduceOp::avg: {
      const std::uint16_t s = half_reference(f, g, a, b, ReduceOp::sum);
      if (is_nan(f, s)) return s;
      return reference_round(f, g, value(f, s) / static_cast<double>(kRanks));
    }
    case ReduceOp::min:
    case ReduceOp::max: {
      if (std::isnan(x) || std::isnan(y)) return nan;
      // Equal non-zero values have equal patterns; of two zeros, -0 is the smaller.
      const bool take_a = op == ReduceOp::min ? (x < y || (x == y && std::signbit(x)))
                                              : (x > y || (x == y && !std::signbit(x)));
      return take_a ? a : b;
    }
  }
  return a;
}

TEST_P(HalfTest, ReductionsAreCorrectlyRoundedAndCommute) {
  const HalfFormat& f = *GetParam();
  const DType t = &f == &kF16 ? DType::f16 : DType::bf16;
  const auto g = grid(f);
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any(0, 0xffff);
  std::vector<std::uint16_t> special{0x0000,
                                     0x8000,
                                     0x0001,
                                     0x8001,
                                     f.inf,
                                     static_cast<std::uint16_t>(0x8000 | f.inf),
                                     static_cast<std::uint16_t>(f.inf - 1),
                                     static_cast<std::uint16_t>(0x8000 | (f.inf - 1)),
                                     static_cast<std::uint16_t>(f.inf | 1),
                                     f.encode(1.0f),
                                     f.encode(-1.0f),
                                     f.encode(3.0f)};
  std::vector<std::uint16_t> a, b;
  all_pairs(special, a, b);
  for (int i = 0; i < 100000; ++i) {
    a.push_back(static_cast<std::uint16_t>(any(rng)));
    b.push_back(static_cast<std::uint16_t>(any(rng)));
  }
  for (auto op : kOps) {
    SCOPED_TRACE(testing::Message() << to_string(t) << " " << to_string(op));
    const auto got = reduce(a, b, t, op);
    const auto swapped = reduce(b, a, t, op);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::uint16_t want = half_reference(f, g, a[i], b[i], op);
      if (is_nan(f, want)) {
        ASSERT_TRUE(is_nan(f, got[i])) << std::hex << a[i] << " " << b[i];
      } else {
        ASSERT_EQ(got[i], want) << std::hex << a[i] << " " << b[i];
      }
      if (!(is_nan(f, a[i]) && is_nan(f, b[i])) || op == ReduceOp::min || op == ReduceOp::max) {
        ASSERT_EQ(got[i], swapped[i]) << std::hex << a[i] << " " << b[i];
      }
    }
  }
}

// Integers wrap around on sum and prod (two's complement), and avg divides toward zero.
template <typename T>
T int_reference(T a, T b, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::sum:
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    case ReduceOp::prod:
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::avg:  // truncating division of the wrapped sum
      return static_cast<T>(int_reference(a, b, ReduceOp::sum) / static_cast<T>(kRanks));
  }
  return a;
}

template <typename T>
void check_int_type(DType t) {
  using L = std::numeric_limits<T>;
  std::vector<T> x{T(0),
                   T(1),
                   T(2),
                   T(7),
                   T(100),
                   T(127),
                   L::max(),
                   L::min(),
                   static_cast<T>(L::max() - 1),
                   static_cast<T>(L::max() / 2 + 3)};
  if constexpr (std::is_signed_v<T>) {
    for (T v : {T(-1), T(-2), T(-7), T(-100), static_cast<T>(L::min() + 1)}) x.push_back(v);
  }
  std::vector<T> a, b;
  all_pairs(x, a, b);
  for (auto op : kOps) {
    SCOPED_TRACE(testing::Message() << to_string(t) << " " << to_string(op));
    const auto got = reduce(a, b, t, op);
    const auto swapped = reduce(b, a, t, op);
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(got[i], int_reference(a[i], b[i], op)) << +a[i] << " " << +b[i];
      EXPECT_EQ(got[i], swapped[i]) << +a[i] << " " << +b[i];
    }
  }
}

TEST(Reduce, IntegerTypesWrapAndCommute) {
  check_int_type<std::int32_t>(DType::i32);
  check_int_type<std::int64_t>(DType::i64);
  check_int_type<std::uint8_t>(DType::u8);
}

TEST(Reduce, AverageTruncatesTowardZero) {
  std::int32_t v[] = {-7, 7, -1, 5};
  finish_avg(v, 4, DType::i32, 2);
  EXPECT_EQ(v[0], -3);
  EXPECT_EQ(v[1], 3);
  EXPECT_EQ(v[2], 0);
  EXPECT_EQ(v[3], 2);
  float f[] = {1.0f, -3.0f};
  finish_avg(f, 2, DType::f32, 1);  // n = 1 leaves the buffer alone
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -3.0f);
}

TEST(Reduce, AverageOverMoreRanksThanTheTypeHolds) {
  std::uint8_t u[] = {255, 200, 0};
  finish_avg(u, 3, DType::u8, 256);  // static_cast<uint8_t>(256) would be a division by zero
  EXPECT_EQ(u[0], 0);
  EXPECT_EQ(u[1], 0);
  std::uint8_t w[] = {255};
  finish_avg(w, 1, DType::u8, 100);
  EXPECT_EQ(w[0], 2);
  std::int32_t i[] = {std::numeric_limits<std::int32_t>::max(), -5};
  finish_avg(i, 2, DType::i32, std::size_t{1} << 32);  // would truncate to 0 in 32 bits
  EXPECT_EQ(i[0], 0);
  EXPECT_EQ(i[1], 0);
}

TEST(Reduce, MinMaxOrderSignedZeros) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    SCOPED_TRACE(to_string(t));
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      // Two buffers {+0, -0} and {-0, +0}: both orders must give -0 (min) or +0 (max).
      alignas(8) unsigned char pz[16] = {}, nz[16] = {}, acc1[16], acc2[16];
      const std::size_t w = dtype_bytes(t);
      nz[w - 1] = 0x80;  // little-endian: the sign bit is in the last byte
      std::memcpy(acc1, pz, w);
      reduce_into(acc1, nz, 1, t, op);
      std::memcpy(acc2, nz, w);
      reduce_into(acc2, pz, 1, t, op);
      EXPECT_EQ(std::memcmp(acc1, acc2, w), 0);
      EXPECT_EQ(std::memcmp(acc1, op == ReduceOp::min ? nz : pz, w), 0);
    }
  }
}

TEST(Reduce, EmptyBufferIsANoOp) {
  for (DType t : kTypes) {
    for (ReduceOp op : kOps) reduce_into(nullptr, nullptr, 0, t, op);
    finish_avg(nullptr, 0, t, 4);
  }
}

// ---- names -------------------------------------------------------------------------------

TEST(DTypeNames, RoundTrip) {
  for (DType t : kTypes) {
    EXPECT_EQ(parse_dtype(to_string(t)), t);
  }
  for (ReduceOp op : kOps) {
    EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  }
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("float64"), DType::f64);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("int32"), DType::i32);
  EXPECT_EQ(parse_dtype("int64"), DType::i64);
  EXPECT_EQ(parse_dtype("uint8"), DType::u8);
  EXPECT_EQ(parse_dtype("F32"), std::nullopt);
  EXPECT_EQ(parse_dtype(""), std::nullopt);
  EXPECT_EQ(parse_dtype("f8"), std::nullopt);
  EXPECT_EQ(parse_reduce_op("mean"), std::nullopt);
  EXPECT_EQ(parse_reduce_op(""), std::nullopt);
}

TEST(DTypeNames, Sizes) {
  EXPECT_EQ(dtype_bytes(DType::f32), 4u);
  EXPECT_EQ(dtype_bytes(DType::f64), 8u);
  EXPECT_EQ(dtype_bytes(DType::f16), 2u);
  EXPECT_EQ(dtype_bytes(DType::bf16), 2u);
  EXPECT_EQ(dtype_bytes(DType::i32), 4u);
  EXPECT_EQ(dtype_bytes(DType::i64), 8u);
  EXPECT_EQ(dtype_bytes(DType::u8), 1u);
}

}  // namespace
}  // namespace kf
