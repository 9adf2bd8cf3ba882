// SPDX-License-Identifier: Apache-2.0
// Element types and reduction operators of the collectives, and the reduction kernels that
// combine two buffers element-wise. Half types (f16, bf16) are reduced in float and rounded back
// to nearest-even after every operation. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kf {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };
enum class ReduceOp : std::uint8_t { sum, min, max, prod, avg };

/// Bytes per element. Inline: every collective asks several times.
constexpr std::size_t dtype_bytes(DType t) noexcept {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 1;
}
std::string_view to_string(DType t) noexcept;
std::string_view to_string(ReduceOp op) noexcept;
/// Parses "f32", "float32", ...; nullopt when the name is unknown.
std::optional<DType> parse_dtype(std::string_view s) noexcept;
std::optional<ReduceOp> parse_reduce_op(std::string_view s) noexcept;

/// acc[i] = acc[i] OP in[i] for i < count. For avg this is a sum; call finish_avg at the end.
/// The operation is commutative bit for bit, so that the order of the operands never makes two
/// workers disagree: min and max order -0 below +0, and a NaN result is always the positive
/// default quiet NaN (whichever operand was NaN). The loops are written for the compiler to
/// vectorise (src/common/reduce.cpp). Throws: nothing.
void reduce_into(void* acc, const void* in, std::size_t count, DType t, ReduceOp op) noexcept;

/// out[i] = a[i] OP b[i]. out may be the same array as a; no other overlap is allowed.
void reduce_to(void* out, const void* a, const void* b, std::size_t count, DType t,
               ReduceOp op) noexcept;

/// Divides every element by n (integer division for integer types; a NaN becomes the default
/// quiet NaN).
void finish_avg(void* buf, std::size_t count, DType t, std::size_t n) noexcept;

/// IEEE binary16 and bfloat16 conversions, round to nearest, ties to even; NaN stays NaN.
std::uint16_t float_to_f16(float f) noexcept;
float f16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_bf16(float f) noexcept;
float bf16_to_float(std::uint16_t h) noexcept;

}  // namespace kf
