// SPDX-License-Identifier: Apache-2.0
// Single copy between workers on one host: a large payload stays in its sender's memory and
// the receiver copies it straight out (process_vm_readv), when the kernel lets it.
// Thread-safety: free functions of their arguments.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>

#include "common/asio.hpp"

namespace kf::detail {

// The dialer's process on a same-host connection (0 over TCP), and whether its payloads may be
// copied out of it: only when it runs as this process's user. Otherwise a job member running as
// another user could have this process read, with this process's rights, memory it may not read
// itself (its pid may even have been reused by then); it gets "send inline" instead.
inline std::pair<pid_t, bool> peer_process(tcp::socket&) { return {0, false}; }
std::pair<pid_t, bool> peer_process(local_stream::socket& s);

/// Copies n bytes at `addr` in process `pid` into dst: one copy, kernel to kernel.
std::error_code copy_from_process(pid_t pid, std::uint64_t addr, std::byte* dst, std::size_t n);

/// Whether an error of copy_from_process means "not allowed here", as opposed to a peer that
/// is gone (ESRCH) or an address that is not the peer's (EFAULT).
bool copy_refused(const std::error_code& ec);
}  // namespace kf::detail
