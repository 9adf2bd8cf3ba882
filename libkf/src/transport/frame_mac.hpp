// SPDX-License-Identifier: Apache-2.0
// Frame authentication on a connection between hosts (docs/protocol.md, "Frame MACs"): after
// the handshake every frame (header, name, payload) is followed by a 16-byte tag, AES-256-GMAC
// under a key of this connection alone. The key is derived from the peers' key and both
// handshake nonces and identities, so it exists only on the two ends that ran the handshake: a
// relay that forwarded the handshake cannot make a frame either end accepts. The tag's nonce is
// the frame's number on the connection, so a frame replayed, dropped or reordered fails too.
// Thread-safety: one object per connection direction, used by its coroutine only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kf/common/keys.hpp"
#include "transport/auth.hpp"
#include "transport/ghash.hpp"

struct evp_cipher_ctx_st;

namespace kf::transport {

inline constexpr std::size_t kTagBytes = 16;
using Tag = std::array<std::byte, kTagBytes>;

/// The key of one connection: HMAC-SHA256 under the peers' key of the nonces and identities of
/// its handshake (challenge nonce, hello nonce, dialer, acceptor).
Key connection_key(const Key& peers, const Nonce& challenge, const Nonce& hello,
                   const std::string& dialer, const std::string& acceptor);

class FrameMac {
 public:
  /// How the tags are computed; every kind gives the same tags.
  enum class Kind {
    /// The vector GHASH (transport/ghash.hpp) where the processor has it and its start-up
    /// check passed (vector_checked()), else openssl.
    best,
    openssl,  ///< OpenSSL's AES-GCM
    vector,   ///< the vector GHASH where the processor has it, unchecked (for that check)
  };
  /// Whether the vector GHASH gives OpenSSL's tags on this processor: checked once, on frames
  /// of lengths around the vector's block sizes, before Kind::best first uses it. False where
  /// the processor lacks it; a disagreement is logged as an error (and OpenSSL's is used).
  static bool vector_checked();
  /// Throws: std::runtime_error when OpenSSL fails.
  explicit FrameMac(const Key& key, Kind kind = Kind::best);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  /// Starts the next frame's tag.
  void begin();
  /// Adds bytes of the frame (between begin and finish).
  void update(const void* data, std::size_t bytes);
  /// The frame's tag; the next frame needs begin() again.
  Tag finish();
  /// Gives back the number of the last frame begun, whose bytes were never written (a frame
  /// tagged ahead of a write that took nothing, then cancelled): the next frame takes that
  /// number, which is the one the receiver expects. Frames are numbered in the order their
  /// first bytes enter the connection.
  void rewind() noexcept {
    if (seq_ > 0) --seq_;
    active_ = false;
  }
  /// Between begin() and finish().
  bool active() const noexcept { return active_; }
  /// Frames tagged so far.
  std::uint64_t frames() const noexcept { return seq_; }

  /// Whether the vector GHASH computes the tags.
  bool vector() const noexcept { return ghash_ != nullptr; }

 private:
  Block encrypt_block(const Block& in);

  // AES-256-GCM (openssl kind) or AES-256 on single blocks (vector kind: the tag is the GHASH
  // of the frame XOR the cipher's output for the nonce block).
  evp_cipher_ctx_st* ctx_ = nullptr;
  std::unique_ptr<Ghash> ghash_;
  Block pad_{};
  std::uint64_t seq_ = 0;
  bool active_ = false;
};

/// Whether two tags are equal, in constant time.
bool tag_equal(const Tag& a, const Tag& b) noexcept;

}  // namespace kf::transport
