// SPDX-License-Identifier: Apache-2.0
// Keys derived from a job's token, and the hashes built on them. The token itself is never sent:
// the peers' handshakes use one key derived from it and the config service's requests another
// (HKDF-SHA256, RFC 5869), so neither use can stand in for the other and neither reveals the
// token. Thread-safety: pure functions (OpenSSL's are thread-safe).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace kf {

/// A 256-bit key.
using Key = std::array<unsigned char, 32>;

enum class KeyUse {
  control,  ///< signing requests to the config service
  peers,    ///< the peers' connection handshakes and the keys of their connections
};

/// HKDF-SHA256 of `token` (salt "kf job token", info naming the use). Throws: std::runtime_error
/// when OpenSSL fails.
Key derive_key(std::string_view token, KeyUse use);

/// HMAC-SHA256 of `message` under `key`, as 64 lowercase hex digits.
std::string hmac_sha256_hex(const Key& key, std::string_view message);

/// SHA-256 of `data`, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view data);

/// `bytes` random bytes (OpenSSL's generator) as 2 * bytes lowercase hex digits. Throws:
/// std::runtime_error when the generator fails.
std::string random_hex(std::size_t bytes);

/// Whether a and b are equal, in time that depends only on their lengths.
bool equal_in_constant_time(std::string_view a, std::string_view b) noexcept;

}  // namespace kf
