// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/output.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace kf::tools {

bool write_all(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    const auto n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (!(n < 0 && errno == EINTR)) {
      return false;
    }
  }
  return true;
}

void FdWriter::write(std::string_view data) noexcept {
  if (failed_ || write_all(fd_, data)) return;
  failed_ = true;
  const std::string message = "kfrun: cannot write worker output to fd " + std::to_string(fd_) +
                              ": " + std::strerror(errno) + "; dropping it\n";
  if (report_fd_ != fd_) write_all(report_fd_, message);
}

bool read_chunk(UniqueFd& fd, LinePrefixer& lines, std::span<char> buffer) {
  for (;;) {
    const auto n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n > 0) {
      lines.feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return false;
    lines.finish();
    fd.close();
    return false;
  }
}

void drain(UniqueFd& fd, LinePrefixer& lines, std::span<char> buffer) {
  if (!fd.is_open()) return;
  while (read_chunk(fd, lines, buffer)) {
  }
  lines.finish();
  fd.close();
}

}  // namespace kf::tools
