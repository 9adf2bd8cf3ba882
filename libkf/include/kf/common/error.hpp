// SPDX-License-Identifier: Apache-2.0
// kf's error codes. Expected failures (a lost peer, a timeout, a protocol violation) are
// std::error_code values of the kf category; the blocking public API throws kf::Error, which
// carries such a code. Thread-safety: everything here is immutable and safe to share.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace kf {

/// Every expected failure kf reports. Values are stable: they appear in logs and exit paths.
enum class errc {
  ok = 0,
  peer_lost = 1,             ///< a peer's connection broke or a peer reported another peer gone
  timeout = 2,               ///< no progress from a peer within the configured deadline
  cancelled = 3,             ///< the operation was cancelled (shutdown)
  stale_version = 4,         ///< a message or request named another cluster version
  protocol_error = 5,        ///< a peer sent a malformed frame
  auth_failed = 6,           ///< the handshake did not prove the job token
  invalid_argument = 7,      ///< a call's arguments do not make sense (size, root, dtype)
  not_member = 8,            ///< this worker is not in the cluster it was given
  closed = 9,                ///< the peer is shut down
  service_unavailable = 10,  ///< the config service could not be reached
  conflict = 11,             ///< a compare-and-swap lost (the version moved on)
  device_error = 12,         ///< CUDA or NCCL failed (no device, out of memory, a fault)
  no_progress = 13,          ///< no step committed for too long while the membership churned
};

/// Conditions callers branch on. peer_failure matches peer_lost and timeout.
enum class errcond {
  peer_failure = 1,
};

const std::error_category& category() noexcept;
const std::error_category& condition_category() noexcept;

std::error_code make_error_code(errc e) noexcept;
std::error_condition make_error_condition(errcond e) noexcept;

/// The exception of the blocking API. what() names the operation and the reason.
class Error : public std::system_error {
 public:
  Error(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
};

}  // namespace kf

template <>
struct std::is_error_code_enum<kf::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<kf::errcond> : std::true_type {};
