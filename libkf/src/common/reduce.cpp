// SPDX-License-Identifier: Apache-2.0
// The reduction kernels (reduce_to, reduce_into, finish_avg) and the half conversions
// (float_to_f16 & co., whose branch-free forms the kernels use), written so that the compiler
// vectorises every (dtype, op) loop: the element functions have no branches, only selects, and
// the caller's "out is a or disjoint from it" is split into two loops over restrict pointers.
// This file is built apart (libkf/meson.build) with the vectoriser's dynamic cost model (GCC
// 12's -O2 default takes only loops that need no scalar tail, and every loop here needs one) and
// -fno-trapping-math (else GCC will not compute unconditionally the float that only one case of
// a half conversion uses). On x86-64 with AVX2 and F16C, f16 and bf16 go 8 elements at a time
// through intrinsics, f16 converted by F16C, and the other types, where it measured faster
// (avx2_gains), through the portable loops compiled a second time for AVX2 (reduce_to_avx2);
// the portable loops give the same bits (tests/libkf/common/reduce_test.cpp).
#include "common/reduce.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define KF_REDUCE_X86 1
#endif

namespace kf {
namespace {

template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;

// ---- element operations: branch-free -------------------------------------------------------

// A NaN result is always the default quiet NaN (positive, no payload). The hardware passes on
// one operand's NaN, but which one depends on the order the compiler chose for a commutative
// operation (it may differ between a vector loop and its scalar tail), so without this two
// workers, or two CPU paths, could differ in a NaN's sign or payload.
template <typename T>
inline T quiet_if_nan(T r) noexcept {
  return r != r ? std::numeric_limits<T>::quiet_NaN() : r;
}

// Integers wrap around (in the unsigned type: signed overflow would be undefined behaviour).
template <typename T>
inline T add(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return quiet_if_nan(a + b);
  }
}

template <typename T>
inline T mul(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return quiet_if_nan(a * b);
  }
}

// min and max order -0 below +0 and return a quiet NaN when either operand is NaN (IEEE
// 754-2019 minimum/maximum), so that the result never depends on the order of the operands.
// Floats compare as integers: the bits of a negative number with its magnitude bits flipped
// order every non-NaN value, -0 just below +0, as signed integers (no branch, no FP compare for
// the vectoriser to keep in order).
template <typename T>
inline auto order_key(T x) noexcept {
  using U = BitsOf<T>;
  using S = std::make_signed_t<U>;
  const U u = std::bit_cast<U>(x);
  const U flip = static_cast<U>(static_cast<U>(static_cast<S>(u) >> (8 * sizeof(U) - 1)) >> 1);
  return static_cast<S>(u ^ flip);
}

template <typename T>
inline bool is_nan_bits(T x) noexcept {
  using U = BitsOf<T>;
  const U mag = std::bit_cast<U>(x) & (~U{0} >> 1);
  return mag > std::bit_cast<U>(std::numeric_limits<T>::infinity());
}

// min (kMin) or max of two values.
template <bool kMin, typename T>
inline T min_max(T a, T b) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    const bool take_b = kMin ? order_key(b) < order_key(a) : order_key(a) < order_key(b);
    const T r = take_b ? b : a;
    // Bitwise on purpose: both tests, then one select, no branch for the vectoriser to stumble on
    // (Clang's warning about it is off for this file, libkf/meson.build).
    return (is_nan_bits(a) | is_nan_bits(b)) ? std::numeric_limits<T>::quiet_NaN() : r;
  } else {
    return (kMin ? b < a : a < b) ? b : a;
  }
}

// The half formats, converted without branches (so that the loops using them vectorise). They
// are also the public float_to_f16 & co. (at the end of this file), which
// tests/libkf/common/dtype_test.cpp checks against an independent model of both formats.
struct F16 {
  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t man = h & 0x3ffu;
    const std::uint32_t normal = ((exp + 112u) << 23) | (man << 13);
    // Subnormal: man * 2^-24, a normal float (so flush-to-zero modes leave it alone).
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(
        static_cast<float>(static_cast<std::int32_t>(man)) * 5.9604644775390625e-08f);
    const std::uint32_t special = 0x7f800000u | (man << 13) | (man != 0 ? 0x00400000u : 0u);
    const std::uint32_t mag = exp == 0 ? sub : (exp == 31 ? special : normal);
    return std::bit_cast<float>(sign | mag);
  }
  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    // Subnormal result: adding 0.5 makes the FPU round at the 2^-24 position.
    const std::uint32_t sub =
        std::bit_cast<std::uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3f000000u;
    // Normal: rebias the exponent and round the 13 dropped bits to nearest-even.
    const std::uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
    const std::uint32_t mag = abs > 0x7f800000u    ? 0x7e00u
                              : abs >= 0x477ff000u ? 0x7c00u
                              : abs < 0x38800000u  ? sub
                                                   : normal;
    return static_cast<std::uint16_t>(sign | mag);
  }
};

struct Bf16 {
  static float to_float(std::uint16_t h) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
  }
  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const std::uint32_t quiet = (x >> 16) | 0x40u;
    return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
};

// ---- loops ---------------------------------------------------------------------------------

// out[i] = op(a[i], b[i]), with out == a or out disjoint from both (as reduce_to allows).
template <typename T, typename Op>
inline void loop(T* out, const T* a, const T* b, std::size_t n, Op op) noexcept {
  if (out == a) {
    T* __restrict o = out;
    const T* __restrict y = b;
    for (std::size_t i = 0; i < n; ++i) o[i] = op(o[i], y[i]);
  } else {
    T* __restrict o = out;
    const T* __restrict x = a;
    const T* __restrict y = b;
    for (std::size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
  }
}

template <typename H, typename Op>
inline void half_loop(std::uint16_t* out, const std::uint16_t* a, const std::uint16_t* b,
                      std::size_t n, Op op) noexcept {
  loop(out, a, b, n, [op](std::uint16_t x, std::uint16_t y) {
    return H::from_float(op(H::to_float(x), H::to_float(y)));
  });
}

template <typename Each>
inline void by_op(ReduceOp op, Each&& each) noexcept {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return each([](auto x, auto y) { return add(x, y); });
    case ReduceOp::prod: return each([](auto x, auto y) { return mul(x, y); });
    case ReduceOp::min: return each([](auto x, auto y) { return min_max<true>(x, y); });
    case ReduceOp::max: return each([](auto x, auto y) { return min_max<false>(x, y); });
  }
}

template <typename T>
void reduce_typed(void* out, const void* a, const void* b, std::size_t n, ReduceOp op) noexcept {
  by_op(op, [&](auto f) {
    loop(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, f);
  });
}

template <typename H>
void reduce_half(void* out, const void* a, const void* b, std::size_t n, ReduceOp op) noexcept {
  by_op(op, [&](auto f) {
    half_loop<H>(static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(a),
                 static_cast<const std::uint16_t*>(b), n, f);
  });
}

// Every type's loop: reduce_to_portable, and reduce_to_avx2, where flatten compiles it for AVX2.
inline void reduce_any(void* out, const void* a, const void* b, std::size_t count, DType t,
                       ReduceOp op) noexcept {
  switch (t) {
    case DType::f32: return reduce_typed<float>(out, a, b, count, op);
    case DType::f64: return reduce_typed<double>(out, a, b, count, op);
    case DType::i32: return reduce_typed<std::int32_t>(out, a, b, count, op);
    case DType::i64: return reduce_typed<std::int64_t>(out, a, b, count, op);
    case DType::u8: return reduce_typed<std::uint8_t>(out, a, b, count, op);
    case DType::f16: return reduce_half<F16>(out, a, b, count, op);
    case DType::bf16: return reduce_half<Bf16>(out, a, b, count, op);
  }
}

template <typename T>
void reduce_scalar(void* out, const void* a, const void* b, ReduceOp op) noexcept {
  by_op(op, [&](auto f) {
    *static_cast<T*>(out) = f(*static_cast<const T*>(a), *static_cast<const T*>(b));
  });
}

// One element of a type but the half ones, by the loops' element operations.
void reduce_one(void* out, const void* a, const void* b, DType t, ReduceOp op) noexcept {
  switch (t) {
    case DType::f32: return reduce_scalar<float>(out, a, b, op);
    case DType::f64: return reduce_scalar<double>(out, a, b, op);
    case DType::i32: return reduce_scalar<std::int32_t>(out, a, b, op);
    case DType::i64: return reduce_scalar<std::int64_t>(out, a, b, op);
    case DType::u8: return reduce_scalar<std::uint8_t>(out, a, b, op);
    case DType::f16:
    case DType::bf16: break;
  }
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
    for (std::size_t i = 0; i < n; ++i) buf[i] = quiet_if_nan(buf[i] / dv);
  }
}

template <typename H>
void divide_half(std::uint16_t* buf, std::size_t n, std::size_t d) noexcept {
  const float dv = static_cast<float>(d);
  for (std::size_t i = 0; i < n; ++i)
    buf[i] = H::from_float(quiet_if_nan(H::to_float(buf[i]) / dv));
}

// ---- f16 and bf16 with AVX2 and F16C (x86-64)
// ----------------------------------------------------------------

#ifdef KF_REDUCE_X86

// A NaN becomes the default quiet NaN, as quiet_if_nan does.
__attribute__((target("avx2,f16c"))) inline __m256 canonical_nan(__m256 r) {
  const __m256 nan = _mm256_cmp_ps(r, r, _CMP_UNORD_Q);
  return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

__attribute__((target("avx2,f16c"))) inline __m256 min8(__m256 a, __m256 b) {
  const __m256 lo = _mm256_blendv_ps(a, b, _mm256_cmp_ps(b, a, _CMP_LT_OQ));
  const __m256 r = _mm256_blendv_ps(lo, _mm256_or_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
  const __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

__attribute__((target("avx2,f16c"))) inline __m256 max8(__m256 a, __m256 b) {
  const __m256 hi = _mm256_blendv_ps(a, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  const __m256 r = _mm256_blendv_ps(hi, _mm256_and_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
  const __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
  return _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
}

enum class Op8 { add, mul, min, max };

// One operation on 8 floats, as add, mul and min_max do it. (Lambdas would not inherit
// the target attribute, so the operation is a template argument.)
template <Op8 K>
__attribute__((target("avx2,f16c"))) inline __m256 combine8(__m256 x, __m256 y) {
  if constexpr (K == Op8::min) return min8(x, y);
  if constexpr (K == Op8::max) return max8(x, y);
  return canonical_nan(K == Op8::add ? _mm256_add_ps(x, y) : _mm256_mul_ps(x, y));
}

// f16 <-> float by F16C's conversions.
struct F16x8 {
  __attribute__((target("avx2,f16c"))) static __m256 load(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx2,f16c"))) static void store(std::uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// bf16 <-> float with AVX2's integer operations: Bf16's conversions, 8 at a time.
struct Bf16x8 {
  __attribute__((target("avx2,f16c"))) static __m256 load(const std::uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  __attribute__((target("avx2,f16c"))) static void store(std::uint16_t* p, __m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
    // Every lane holds a value below 2^16: packing with unsigned saturation keeps it. The pack
    // works per 128-bit half; the permute puts the two halves' results side by side.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

// Whole groups of 8; returns how many elements it did.
template <typename V, Op8 K>
__attribute__((target("avx2,f16c"))) std::size_t simd_loop(std::uint16_t* out,
                                                           const std::uint16_t* a,
                                                           const std::uint16_t* b,
                                                           std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V::store(out + i, combine8<K>(V::load(a + i), V::load(b + i)));
  }
  return i;
}

template <typename V, typename H>
void reduce_half_simd(std::uint16_t* out, const std::uint16_t* a, const std::uint16_t* b,
                      std::size_t n, ReduceOp op) noexcept {
  std::size_t i = 0;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: i = simd_loop<V, Op8::add>(out, a, b, n); break;
    case ReduceOp::prod: i = simd_loop<V, Op8::mul>(out, a, b, n); break;
    case ReduceOp::min: i = simd_loop<V, Op8::min>(out, a, b, n); break;
    case ReduceOp::max: i = simd_loop<V, Op8::max>(out, a, b, n); break;
  }
  // The last few elements (fewer than 8), element by element.
  if (i < n) reduce_half<H>(out + i, a + i, b + i, n - i, op);
}

template <typename V, typename H>
__attribute__((target("avx2,f16c"))) void divide_half_simd(std::uint16_t* buf, std::size_t n,
                                                           std::size_t d) noexcept {
  const __m256 dv = _mm256_set1_ps(static_cast<float>(d));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) V::store(buf + i, canonical_nan(_mm256_div_ps(V::load(buf + i), dv)));
  divide_half<H>(buf + i, n - i, d);
}

// AVX2 and F16C: every x86-64 CPU since about 2013-2015.
bool have_simd() noexcept {
  static const bool yes = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows
    // it. It uses the same register state as AVX, whose OS support the avx2 test includes.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return yes;
}

// The same loops as reduce_to_portable's, compiled for AVX2: flatten inlines them here, where
// the vectoriser may use 256-bit registers. The element operations are the same, so the bits are.
__attribute__((target("avx2"), flatten)) void reduce_to_avx2(void* out, const void* a,
                                                             const void* b, std::size_t count,
                                                             DType t, ReduceOp op) noexcept {
  reduce_any(out, a, b, count, t, op);
}

// Where the AVX2 copy of a loop is faster than the baseline one (kf-bench-reduce, 64 KiB): the
// float types (19 to 29 GB/s for f32 sum, 4.4 to 12 for f64 min) and the integer operations
// that SSE2 lacks an instruction for (i32 product 14 to 30, i64 min 15 to 19). Integer sums and
// u8 min and max, which SSE2 has, measured slower in 256 bits (30 to 25 GB/s).
constexpr bool avx2_gains(DType t, ReduceOp op) noexcept {
  switch (t) {
    case DType::f32:
    case DType::f64: return true;
    case DType::i32:
    case DType::i64: return op != ReduceOp::sum && op != ReduceOp::avg;
    case DType::u8: return op == ReduceOp::prod;
    case DType::f16:
    case DType::bf16: return false;  // reduce_half_simd
  }
  return false;
}

#endif  // KF_REDUCE_X86

}  // namespace

namespace detail {

void reduce_to_portable(void* out, const void* a, const void* b, std::size_t count, DType t,
                        ReduceOp op) noexcept {
  reduce_any(out, a, b, count, t, op);
}

void finish_avg_portable(void* buf, std::size_t count, DType t, std::size_t n) noexcept {
  if (n <= 1) return;
  switch (t) {
    case DType::f32: return divide_typed(static_cast<float*>(buf), count, n);
    case DType::f64: return divide_typed(static_cast<double*>(buf), count, n);
    case DType::i32: return divide_typed(static_cast<std::int32_t*>(buf), count, n);
    case DType::i64: return divide_typed(static_cast<std::int64_t*>(buf), count, n);
    case DType::u8: return divide_typed(static_cast<std::uint8_t*>(buf), count, n);
    case DType::f16: return divide_half<F16>(static_cast<std::uint16_t*>(buf), count, n);
    case DType::bf16: return divide_half<Bf16>(static_cast<std::uint16_t*>(buf), count, n);
  }
}

bool reduce_uses_simd() noexcept {
#ifdef KF_REDUCE_X86
  return have_simd();
#else
  return false;
#endif
}

}  // namespace detail

void reduce_to(void* out, const void* a, const void* b, std::size_t count, DType t,
               ReduceOp op) noexcept {
  // One element (a scalar allreduce, a barrier's byte): the loops' setup costs more than the
  // element itself. reduce_one runs the loops' own operation, so the bits are the same. (Half
  // types are left to their loops, whose SIMD conversions are their own.)
  if (count == 1 && t != DType::f16 && t != DType::bf16) return reduce_one(out, a, b, t, op);
#ifdef KF_REDUCE_X86
  if ((t == DType::f16 || t == DType::bf16) && have_simd()) {
    auto* o = static_cast<std::uint16_t*>(out);
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    if (t == DType::f16) return reduce_half_simd<F16x8, F16>(o, x, y, count, op);
    return reduce_half_simd<Bf16x8, Bf16>(o, x, y, count, op);
  }
  if (avx2_gains(t, op) && have_simd()) return reduce_to_avx2(out, a, b, count, t, op);
#endif
  detail::reduce_to_portable(out, a, b, count, t, op);
}

void reduce_into(void* acc, const void* in, std::size_t count, DType t, ReduceOp op) noexcept {
  reduce_to(acc, acc, in, count, t, op);
}

void finish_avg(void* buf, std::size_t count, DType t, std::size_t n) noexcept {
#ifdef KF_REDUCE_X86
  if ((t == DType::f16 || t == DType::bf16) && n > 1 && have_simd()) {
    auto* p = static_cast<std::uint16_t*>(buf);
    if (t == DType::f16) return divide_half_simd<F16x8, F16>(p, count, n);
    return divide_half_simd<Bf16x8, Bf16>(p, count, n);
  }
#endif
  detail::finish_avg_portable(buf, count, t, n);
}

std::uint16_t float_to_f16(float f) noexcept { return F16::from_float(f); }
float f16_to_float(std::uint16_t h) noexcept { return F16::to_float(h); }
std::uint16_t float_to_bf16(float f) noexcept { return Bf16::from_float(f); }
float bf16_to_float(std::uint16_t h) noexcept { return Bf16::to_float(h); }

}  // namespace kf
