// SPDX-License-Identifier: Apache-2.0
// Names of the element types and operators. The reduction kernels and the half conversions are
// in reduce.cpp.
#include "kf/common/dtype.hpp"

#include <array>

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
  struct Name {
    std::string_view name;
    DType t;
  };
  static constexpr std::array<Name, 14> kNames{{{"f32", DType::f32},
                                                {"float32", DType::f32},
                                                {"f64", DType::f64},
                                                {"float64", DType::f64},
                                                {"f16", DType::f16},
                                                {"float16", DType::f16},
                                                {"bf16", DType::bf16},
                                                {"bfloat16", DType::bf16},
                                                {"i32", DType::i32},
                                                {"int32", DType::i32},
                                                {"i64", DType::i64},
                                                {"int64", DType::i64},
                                                {"u8", DType::u8},
                                                {"uint8", DType::u8}}};
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

}  // namespace kf
