// SPDX-License-Identifier: Apache-2.0
// The connection handshake (docs/protocol.md): mutual proof of the job token with HMAC-SHA256
// over fresh nonces, keyed by the peers' key derived from the token (kf/common/keys.hpp), so the
// token is never sent and a recorded handshake cannot be replayed.
//   acceptor -> dialer   challenge { nonce_a }
//   dialer   -> acceptor hello     { job_id, identity, nonce_d, HMAC(token, "hello", job_id,
//                                    identity, acceptor meant, nonce_a) }
//   acceptor -> dialer   welcome   { identity, HMAC(token, "welcome", job_id, identity, nonce_d) }
// The purposes name the frame-MAC setting and the connection's kind; the dialer checks that the
// welcome's identity is the worker it dialled.
// Thread-safety: pure functions (OpenSSL's HMAC and RAND are thread-safe).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "kf/common/keys.hpp"

namespace kf::transport {

using Nonce = std::array<std::byte, 16>;
using Mac = std::array<std::byte, 32>;

Nonce random_nonce();
/// `key`: derive_key(token, KeyUse::peers).
Mac handshake_mac(const Key& key, const char* purpose, const std::string& job_id,
                  const std::string& identity, const Nonce& nonce);
bool mac_equal(const Mac& a, const Mac& b) noexcept;

struct Hello {
  std::string job_id;
  std::string identity;
  Nonce nonce{};
  Mac mac{};
  bool frame_auth = true;  ///< the dialer's PeerOptions::frame_auth (in the MAC's purpose)
};
struct Welcome {
  std::string identity;
  Mac mac{};
  bool frame_auth = true;  ///< the acceptor's (in the MAC's purpose)
};

/// The handshake MAC's purpose: `base` ("hello", "welcome"), marked when frames carry MACs, so
/// that a setting altered on the way fails the MAC, and with the connection's kind (TCP or a
/// same-host socket), so that a handshake relayed from one kind into the other fails too.
std::string handshake_purpose(bool hello, bool frame_auth, bool tcp);

/// The hello's MAC: the dialer's `identity` and the worker it meant to reach (`to`, that
/// worker's endpoint), so that a dial redirected to another worker of the job is refused by the
/// acceptor (docs/protocol.md, "Handshake").
Mac hello_mac(const Key& key, bool frame_auth, bool tcp, const std::string& job_id,
              const std::string& identity, const std::string& to, const Nonce& nonce);
/// The welcome's MAC over the acceptor's `identity`, which the dialer compares with the
/// endpoint it dialled.
Mac welcome_mac(const Key& key, bool frame_auth, bool tcp, const std::string& job_id,
                const std::string& identity, const Nonce& nonce);

std::vector<std::byte> encode(const Hello& h);
std::vector<std::byte> encode(const Welcome& w);
/// nullopt when the payload is malformed (lengths that do not add up).
std::optional<Hello> decode_hello(const std::vector<std::byte>& payload);
std::optional<Welcome> decode_welcome(const std::vector<std::byte>& payload);

}  // namespace kf::transport
