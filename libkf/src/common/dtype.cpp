// SPDX-License-Identifier: Apache-2.0
#include "kf/common/dtype.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kf {

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) noexcept {
  struct Name { std::string_view name; DType t; };
  static constexpr std::array<Name, 14> kNames{{
      {"f32", DType::f32}, {"float32", DType::f32}, {"f64", DType::f64},
      {"float64", DType::f64}, {"f16", DType::f16}, {"float16", DType::f16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16}, {"i32", DType::i32},
      {"int32", DType::i32}, {"i64", DType::i64}, {"int64", DType::i64},
      {"u8", DType::u8}, {"uint8", DType::u8}}};
  for (const auto& n : kNames) {
    if (n.name == s) return n.t;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view s) noexcept {
  for (auto op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max, ReduceOp::prod, ReduceOp::avg}) {
    if (to_string(op) == s) return op;
  }
  return std::nullopt;
}

std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in half: value = abs_float * 2^24 units of 2^-24.
    // Add the float to 0.5 (2^-1) so the FPU rounds to nearest-even at the 2^-24 position.
    const float magic = std::bit_cast<float>(0x3f000000u);  // 0.5
    const float r = std::bit_cast<float>(abs) + magic;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(r) - 0x3f000000u));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest-even.
  const std::uint32_t odd = (abs >> 13) & 1u;
  std::uint32_t v = abs + 0xc8000fffu + odd;  // -(112 << 23) + rounding bias
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: value = man * 2^-24
      const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
      out = sign | std::bit_cast<std::uint32_t>(v);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u);
  } else {
    out = sign | ((exp + 112) << 23) | (man << 13);
  }
  return std::bit_cast<float>(out);
}

std::uint16_t float_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

namespace {

// Integers wrap around (in the unsigned type: signed overflow would be undefined behaviour).
template <typename T>
inline T add(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
inline T mul(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// min and max order -0 below +0 (IEEE 754-2019 minimum/maximum), so that the result never
// depends on the order of the operands; a plain comparison would return the first of two zeros.
template <typename T>
inline T combine(T a, T b, ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return add(a, b);
    case ReduceOp::prod: return mul(a, b);
    case ReduceOp::min:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
        if (a == b) return std::signbit(a) ? a : b;
      }
      return b < a ? b : a;
    case ReduceOp::max:
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
        if (a == b) return std::signbit(a) ? b : a;
      }
      return a < b ? b : a;
  }
  return a;
}

// One loop per operator so the compiler vectorises each; the switch stays outside the loop.
// out may be the same array as a (never partially overlapping), so no __restrict here.
template <typename T>
void reduce_typed(T* out, const T* a, const T* b, std::size_t n, ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (std::size_t i = 0; i < n; ++i) out[i] = add(a[i], b[i]);
      return;
    case ReduceOp::prod:
      for (std::size_t i = 0; i < n; ++i) out[i] = mul(a[i], b[i]);
      return;
    case ReduceOp::min:
    case ReduceOp::max:
      for (std::size_t i = 0; i < n; ++i) out[i] = combine(a[i], b[i], op);
      return;
  }
}

template <float (*ToF)(std::uint16_t), std::uint16_t (*FromF)(float)>
void reduce_half(std::uint16_t* out, const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                 ReduceOp op) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = FromF(combine(ToF(a[i]), ToF(b[i]), op));
}

template <typename T>
void divide_typed(T* buf, std::size_t n, std::size_t d) noexcept {
  if constexpr (std::is_integral_v<T>) {
    // Divide in 64 bits: d need not fit T (a u8 average over 256 ranks would divide by zero).
    using W = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
    const auto max_d = static_cast<std::uint64_t>(std::numeric_limits<W>::max());
    const W dv = static_cast<W>(d < max_d ? d : max_d);
    for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<W>(buf[i]) / dv);
  } else {
    const T dv = static_cast<T>(d);
    for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] / dv;
  }
}

}  // namespace

void reduce_to(void* out, const void* a, const void* b, std::size_t count, DType t,
               ReduceOp op) noexcept {
  switch (t) {
    case DType::f32:
      return reduce_typed(static_cast<float*>(out), static_cast<const float*>(a),
                          static_cast<const float*>(b), count, op);
    case DType::f64:
      return reduce_typed(static_cast<double*>(out), static_cast<const double*>(a),
                          static_cast<const double*>(b), count, op);
    case DType::i32:
      return reduce_typed(static_cast<std::int32_t*>(out), static_cast<const std::int32_t*>(a),
                          static_cast<const std::int32_t*>(b), count, op);
    case DType::i64:
      return reduce_typed(static_cast<std::int64_t*>(out), static_cast<const std::int64_t*>(a),
                          static_cast<const std::int64_t*>(b), count, op);
    case DType::u8:
      return reduce_typed(static_cast<std::uint8_t*>(out), static_cast<const std::uint8_t*>(a),
                          static_cast<const std::uint8_t*>(b), count, op);
    case DType::f16:
      return reduce_half<f16_to_float, float_to_f16>(
          static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(a),
          static_cast<const std::uint16_t*>(b), count, op);
    case DType::bf16:
      return reduce_half<bf16_to_float, float_to_bf16>(
          static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(a),
          static_cast<const std::uint16_t*>(b), count, op);
  }
}

void reduce_into(void* acc, const void* in, std::size_t count, DType t, ReduceOp op) noexcept {
  reduce_to(acc, acc, in, count, t, op);
}

void finish_avg(void* buf, std::size_t count, DType t, std::size_t n) noexcept {
  if (n <= 1) return;
  switch (t) {
    case DType::f32: return divide_typed(static_cast<float*>(buf), count, n);
    case DType::f64: return divide_typed(static_cast<double*>(buf), count, n);
    case DType::i32: return divide_typed(static_cast<std::int32_t*>(buf), count, n);
    case DType::i64: return divide_typed(static_cast<std::int64_t*>(buf), count, n);
    case DType::u8: return divide_typed(static_cast<std::uint8_t*>(buf), count, n);
    case DType::f16: {
      auto* p = static_cast<std::uint16_t*>(buf);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = float_to_f16(f16_to_float(p[i]) / static_cast<float>(n));
      return;
    }
    case DType::bf16: {
      auto* p = static_cast<std::uint16_t*>(buf);
      for (std::size_t i = 0; i < count; ++i)
        p[i] = float_to_bf16(bf16_to_float(p[i]) / static_cast<float>(n));
      return;
    }
  }
}

}  // namespace kf
