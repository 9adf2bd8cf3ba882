// SPDX-License-Identifier: Apache-2.0
#include "kf/common/fd.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <mutex>
#include <set>

namespace kf {

bool set_close_on_exec(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFD);
  return flags >= 0 && ((flags & FD_CLOEXEC) != 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == 0);
}

void close_on_exec_from(int first) noexcept {
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, CLOSE_RANGE_CLOEXEC) == 0) {
    return;
  }
  rlimit limit{};
  int last = 65536;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < static_cast<rlim_t>(last)) {
    last = static_cast<int>(limit.rlim_cur);
  }
  for (int fd = first; fd < last; ++fd) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

int claim_inherited_fd(int fd) {
  static std::mutex mu;
  static std::set<int> claimed;
  std::lock_guard<std::mutex> lk(mu);
  return claimed.insert(fd).second ? fd : -1;
}

std::optional<std::string> read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> text(std::in_place);
  std::array<char, 4096> chunk{};
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) text.reset();
    if (n <= 0) break;
    text->append(chunk.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace kf
