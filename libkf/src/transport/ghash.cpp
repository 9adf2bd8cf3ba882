// SPDX-License-Identifier: Apache-2.0
#include "transport/ghash.hpp"

#if defined(__x86_64__)

// GCC 12's AVX-512 headers make their "undefined" vectors from uninitialised variables, which
// its own flow analysis then reports at every cast and extract inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace kf::transport {
namespace {

#define KF_GHASH_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,ssse3")))

// Reverses the bytes of each 16-byte block.
KF_GHASH_TARGET inline __m128i reverse(__m128i x) {
  return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}
KF_GHASH_TARGET inline __m512i reverse(__m512i x) {
  return _mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                                    10, 11, 12, 13, 14, 15)));
}

// The 256-bit product lo + hi * x^128, times x^-128, modulo POLYVAL's polynomial
// x^128 + x^127 + x^126 + x^121 + 1: two folds of 64 bits by the constant 0xc2 << 56.
KF_GHASH_TARGET inline __m128i reduce(__m128i lo, __m128i hi) {
  const __m128i poly = _mm_set_epi64x(static_cast<long long>(0xc200000000000000ULL), 1);
  __m128i t = _mm_clmulepi64_si128(lo, poly, 0x10);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t);
  t = _mm_clmulepi64_si128(lo, poly, 0x10);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t);
  return _mm_xor_si128(hi, lo);
}

// Folds the middle product into the low and high halves, then reduces.
KF_GHASH_TARGET inline __m128i combine(__m128i lo, __m128i mid, __m128i hi) {
  return reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)),
                _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

// POLYVAL's product a * b * x^-128.
KF_GHASH_TARGET inline __m128i dot(__m128i a, __m128i b) {
  const __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  const __m128i mid =
      _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  return combine(lo, mid, hi);
}

// XOR of the four 128-bit lanes.
KF_GHASH_TARGET inline __m128i fold(__m512i z) {
  const __m256i y = _mm256_xor_si256(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
  return _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

// Unreduced products of vectors of 4 blocks with key vectors, added into lo/cross/hi, three
// carry-less multiplications per block (Karatsuba): for a block d and key k, lo = d0 k0,
// hi = d1 k1 and cross = (d0 ^ d1)(k0 ^ k1), from which the middle term d0 k1 ^ d1 k0 is
// cross ^ lo ^ hi (see absorb). `kx` holds k0 ^ k1 in each lane's low half. Carry-less
// multiplication bounds the speed here: one fewer per block made the hash 1.16-1.30 times as
// fast (docs/protocol.md, "Frame MACs").
struct Sums {
  __m512i lo, cross, hi;
};
KF_GHASH_TARGET inline void multiply(Sums& s, __m512i d, __m512i k, __m512i kx) {
  s.lo = _mm512_xor_si512(s.lo, _mm512_clmulepi64_epi128(d, k, 0x00));
  s.hi = _mm512_xor_si512(s.hi, _mm512_clmulepi64_epi128(d, k, 0x11));
  const __m512i dx = _mm512_xor_si512(d, _mm512_shuffle_epi32(d, _MM_PERM_BADC));
  s.cross = _mm512_xor_si512(s.cross, _mm512_clmulepi64_epi128(dx, kx, 0x00));
}

// acc' = (acc ^ X1) H^n ^ X2 H^(n-1) ^ ... ^ Xn H, for n = 4 * vectors blocks at `p`, the keys
// H^n .. H^1 at `keys` and their halves' XORs kPowers blocks after them. Only the first
// vector's product waits for the previous step; the other blocks' products run ahead of it.
template <int vectors>
KF_GHASH_TARGET inline __m128i absorb(__m128i acc, const std::uint8_t* p,
                                      const std::uint8_t* keys) {
  Sums s{_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  // Unrolled: a loop kept the sums in other registers each time round and copied them back.
#pragma GCC unroll 8
  for (int v = 0; v < vectors; ++v) {
    __m512i d = reverse(_mm512_loadu_si512(p + 64 * v));
    // acc rides with the first block (lane 0), which meets H^n: no product of its own.
    if (v == 0) d = _mm512_xor_si512(d, _mm512_zextsi128_si512(acc));
    multiply(s, d, _mm512_load_si512(keys + 64 * v),
             _mm512_load_si512(keys + 16 * Ghash::kPowers + 64 * v));
  }
  const __m128i lo = fold(s.lo);
  const __m128i hi = fold(s.hi);
  return combine(lo, _mm_xor_si128(fold(s.cross), _mm_xor_si128(lo, hi)), hi);
}

KF_GHASH_TARGET void setup(const std::uint8_t* h, std::uint8_t* powers) {
  // mulX(rev(H)): the 128-bit value shifted left by one, reduced by the polynomial.
  std::uint8_t r[16];
  for (int i = 0; i < 16; ++i) r[i] = h[15 - i];
  std::uint64_t lo, hi;
  std::memcpy(&lo, r, 8);
  std::memcpy(&hi, r + 8, 8);
  const bool carry = (hi >> 63) != 0;
  hi = (hi << 1) | (lo >> 63);
  lo <<= 1;
  if (carry) {
    hi ^= 0xc200000000000000ULL;
    lo ^= 1;
  }
  const __m128i key = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  // powers[last - k] = H^(k+1), and kPowers blocks later the XOR of its two halves.
  constexpr int n = Ghash::kPowers;
  __m128i x = key;
  for (int k = 0; k < n; ++k) {
    _mm_store_si128(reinterpret_cast<__m128i*>(powers + 16 * (n - 1 - k)), x);
    _mm_store_si128(reinterpret_cast<__m128i*>(powers + 16 * (2 * n - 1 - k)),
                    _mm_xor_si128(x, _mm_shuffle_epi32(x, 0x4e)));
    x = dot(x, key);
  }
}

KF_GHASH_TARGET void absorb_blocks(std::uint8_t* acc_bytes, const std::uint8_t* p,
                                   std::size_t blocks, const std::uint8_t* powers) {
  __m128i acc = _mm_load_si128(reinterpret_cast<const __m128i*>(acc_bytes));
  constexpr int n = Ghash::kPowers;
  for (; blocks >= n; blocks -= n, p += 16 * n) {
    // The hardware prefetcher alone leaves a frame that is not in the caches at a third of the
    // speed of one that is; asking for the lines 2 KiB ahead keeps the loads off the path.
    for (int line = 0; line < n / 4; ++line) {
      _mm_prefetch(reinterpret_cast<const char*>(p + 2048 + 64 * line), _MM_HINT_T0);
    }
    acc = absorb<n / 4>(acc, p, powers);
  }
  for (; blocks >= 4; blocks -= 4, p += 64) acc = absorb<1>(acc, p, powers + 16 * (n - 4));
  const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(powers + 16 * (n - 1)));
  for (; blocks > 0; --blocks, p += 16) {
    acc = dot(_mm_xor_si128(acc, reverse(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))), h);
  }
  _mm_store_si128(reinterpret_cast<__m128i*>(acc_bytes), acc);
}

}  // namespace

bool Ghash::available() noexcept {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
  return yes;
}

Ghash::Ghash(const Block& h) noexcept {
  setup(reinterpret_cast<const std::uint8_t*>(h.data()), powers_.data());
}

void Ghash::reset() noexcept {
  acc_.fill(0);
  pending_bytes_ = 0;
  total_ = 0;
}

void Ghash::update(const void* data, std::size_t bytes) noexcept {
  if (bytes == 0) return;  // data may then be null (an empty name, an empty payload)
  const auto* p = static_cast<const std::uint8_t*>(data);
  total_ += bytes;
  if (pending_bytes_ > 0) {
    const std::size_t take = std::min(bytes, pending_.size() - pending_bytes_);
    std::memcpy(pending_.data() + pending_bytes_, p, take);
    pending_bytes_ += take;
    p += take;
    bytes -= take;
    if (pending_bytes_ < pending_.size()) return;
    absorb_blocks(acc_.data(), pending_.data(), 1, powers_.data());
    pending_bytes_ = 0;
  }
  const std::size_t blocks = bytes / 16;
  if (blocks > 0) absorb_blocks(acc_.data(), p, blocks, powers_.data());
  pending_bytes_ = bytes % 16;
  if (pending_bytes_ > 0) std::memcpy(pending_.data(), p + 16 * blocks, pending_bytes_);
}

Block Ghash::finish() noexcept {
  if (pending_bytes_ > 0) {
    std::memset(pending_.data() + pending_bytes_, 0, pending_.size() - pending_bytes_);
    absorb_blocks(acc_.data(), pending_.data(), 1, powers_.data());
    pending_bytes_ = 0;
  }
  // The length block: the additional data's length in bits, then the ciphertext's (none), each
  // big-endian.
  std::array<std::uint8_t, 16> lengths{};
  const std::uint64_t bits = total_ * 8;
  for (int i = 0; i < 8; ++i)
    lengths[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
  absorb_blocks(acc_.data(), lengths.data(), 1, powers_.data());
  Block out{};
  for (std::size_t i = 0; i < 16; ++i) out[i] = static_cast<std::byte>(acc_[15 - i]);
  return out;
}

}  // namespace kf::transport

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // __x86_64__
