// SPDX-License-Identifier: Apache-2.0
// The reduction kernels behind kf::reduce_to and kf::finish_avg (kf/common/dtype.hpp), and the
// portable loops they fall back to where the CPU lacks a faster path (on x86-64 with AVX2 and
// F16C: f16 and bf16 through intrinsics, the other types, where that measured faster, through
// the same loops built for AVX2).
// Tests compare the two bit for bit. Thread-safety: pure functions.
#pragma once

#include <cstddef>

#include "kf/common/dtype.hpp"

namespace kf::detail {

/// reduce_to without the CPU-specific paths.
void reduce_to_portable(void* out, const void* a, const void* b, std::size_t count, DType t,
                        ReduceOp op) noexcept;
/// finish_avg without the CPU-specific paths.
void finish_avg_portable(void* buf, std::size_t count, DType t, std::size_t n) noexcept;
/// Whether reduce_to takes the AVX2 and F16C paths on this CPU.
bool reduce_uses_simd() noexcept;

}  // namespace kf::detail
