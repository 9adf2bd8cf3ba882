// SPDX-License-Identifier: Apache-2.0
// Signed requests to the config service: a mutation carries an HMAC of itself (method, target,
// time, a fresh nonce and a hash of the body) under the control key derived from the job token
// (kf/common/keys.hpp), so the token never travels and a recorded request cannot be replayed
// once the server has seen its nonce or its time has passed (docs/config-server.md).
//   Authorization: KF-HMAC-SHA256 ts=UNIX_MS,nonce=HEX32,sig=HEX64
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kf/common/keys.hpp"

namespace kf {

inline constexpr std::string_view kSignatureScheme = "KF-HMAC-SHA256";

struct RequestSignature {
  std::int64_t unix_ms = 0;  ///< when it was signed (milliseconds since 1970, UTC)
  std::string nonce;         ///< 32 lowercase hex digits, fresh per request
  std::string sig;           ///< 64 lowercase hex digits
};

/// What is signed: the scheme, method, target (path and query), time, nonce and SHA-256 of the
/// body, one per line.
std::string string_to_sign(std::string_view method, std::string_view target, std::int64_t unix_ms,
                           std::string_view nonce, std::string_view body);

/// The Authorization header's value for a request, with a fresh nonce. Throws:
/// std::runtime_error when no random bytes can be had.
std::string sign_request(const Key& control, std::string_view method, std::string_view target,
                         std::string_view body, std::int64_t unix_ms);

/// Parses an Authorization value of this scheme; nullopt with `why` set when it is not one.
std::optional<RequestSignature> parse_request_signature(std::string_view authorization,
                                                        std::string& why);

/// Whether `s` signs this request under `control` (compared in constant time).
bool signature_matches(const Key& control, const RequestSignature& s, std::string_view method,
                       std::string_view target, std::string_view body);

/// The service's clock, told in the answer to a signed request so that a client whose own clock
/// is off can sign in the service's time:
///   X-KF-Time: UNIX_MS,mac=HEX64   (HMAC under the control key of the time and the request's
///                                   nonce)
/// Only the service holds the key besides the job's processes, and the nonce binds the time to
/// this answer, so nobody on the way can make a client sign in another time.
inline constexpr std::string_view kServiceTimeHeader = "X-KF-Time";
std::string service_time_proof(const Key& control, std::int64_t unix_ms, std::string_view nonce);
/// The time in a header made by service_time_proof for `nonce`; nullopt when it is malformed or
/// its MAC does not match.
std::optional<std::int64_t> read_service_time(const Key& control, std::string_view header,
                                              std::string_view nonce);

/// Every answer of the service is authenticated, so that nobody on the way can stand in for it
/// (docs/security.md). A client gives each request a fresh nonce: a signed request's own, a read
/// the header below. The service answers a request that has one with
///   X-KF-Answer: mac=HEX64   (HMAC under the control key of the method, target, nonce, status
///                             and SHA-256 of the body as sent)
/// and the client takes no answer whose MAC does not match.
inline constexpr std::string_view kNonceHeader = "X-KF-Nonce";
inline constexpr std::string_view kAnswerHeader = "X-KF-Answer";

/// 32 lowercase hex digits from the system's random source. Throws: std::runtime_error when no
/// random bytes can be had.
std::string fresh_nonce();
/// Whether `nonce` has the form fresh_nonce() gives (32 lowercase hex digits).
bool is_nonce(std::string_view nonce) noexcept;
/// The X-KF-Answer value for this answer to this request.
std::string answer_mac(const Key& control, std::string_view method, std::string_view target,
                       std::string_view nonce, unsigned status, std::string_view body);
/// Whether `header` (an X-KF-Answer value) authenticates this answer (compared in constant time).
bool answer_matches(const Key& control, std::string_view header, std::string_view method,
                    std::string_view target, std::string_view nonce, unsigned status,
                    std::string_view body);

}  // namespace kf
