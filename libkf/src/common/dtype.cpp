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

}  // namespace kf
