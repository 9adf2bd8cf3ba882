// SPDX-License-Identifier: Apache-2.0
// Single copy between workers on one host (transport/single_copy.hpp).
#include "transport/single_copy.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

namespace kf::detail {

std::pair<pid_t, bool> peer_process(local_stream::socket& s) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(s.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return {0, false};
  }
  return {cred.pid, cred.uid == ::geteuid()};
}

std::error_code copy_from_process(pid_t pid, std::uint64_t addr, std::byte* dst, std::size_t n) {
  while (n > 0) {
    iovec local{dst, n};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)), n};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return {errno, std::system_category()};
    if (got == 0) return std::make_error_code(std::errc::bad_address);
    dst += got;
    addr += static_cast<std::uint64_t>(got);
    n -= static_cast<std::size_t>(got);
  }
  return {};
}

bool copy_refused(const std::error_code& ec) {
  return ec == std::errc::operation_not_permitted || ec == std::errc::permission_denied ||
         ec == std::errc::function_not_supported;
}

}  // namespace kf::detail
