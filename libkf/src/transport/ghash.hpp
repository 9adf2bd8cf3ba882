// SPDX-License-Identifier: Apache-2.0
// GHASH, the universal hash of AES-GCM, with carry-less multiplication on 512-bit vectors
// (AVX-512 with VPCLMULQDQ): three multiplications per 16-byte block (Karatsuba), 32 blocks per
// reduction, several times the speed of OpenSSL 3.0's GMAC on the same core. FrameMac uses it where
// the processor has those instructions and OpenSSL's AES-GCM elsewhere; both give the same tags, so
// hosts of either kind talk to each other.
//
// The arithmetic runs in POLYVAL's field (byte-reversed GHASH, Montgomery multiplication):
// GHASH(H, X1..Xn) = rev(POLYVAL(mulX(rev(H)), rev(X1)..rev(Xn))).
// Thread-safety: one object per user; available() is safe anywhere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kf::transport {

using Block = std::array<std::byte, 16>;

class Ghash {
 public:
  /// Whether this processor runs it (x86-64 with AVX-512F/BW/VL and VPCLMULQDQ).
  static bool available() noexcept;

  /// `h`: the hash key, the block cipher's output for the zero block. Needs available().
  explicit Ghash(const Block& h) noexcept;

  /// Starts a new message.
  void reset() noexcept;
  /// Adds bytes of the additional data (any lengths; partial blocks are carried over).
  void update(const void* data, std::size_t bytes) noexcept;
  /// The hash of what was added as GCM's additional data with no ciphertext: zero-padded, then
  /// the length block. XOR with the cipher's output for the nonce block gives the GMAC tag.
  Block finish() noexcept;

  /// Blocks per reduction: POLYVAL's key powers H^kPowers .. H^1, the order in which that many
  /// consecutive blocks meet them.
  static constexpr int kPowers = 32;

 private:
  // The key powers, then the XOR of each one's two 64-bit halves (in its low half), in the same
  // order.
  alignas(64) std::array<std::uint8_t, 2 * kPowers * 16> powers_{};
  alignas(16) std::array<std::uint8_t, 16> acc_{};
  std::array<std::uint8_t, 16> pending_{};
  std::size_t pending_bytes_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace kf::transport
