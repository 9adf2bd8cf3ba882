// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/atomic_file.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <unistd.h>

#include "kf/common/keys.hpp"

namespace kf {
namespace {

[[noreturn]] void fail(const std::string& step, const std::string& file, int err) {
  throw std::runtime_error(step + " '" + file + "': " + std::strerror(err));
}

}  // namespace

namespace {
int (*g_directory_sync)(int) = nullptr;
}  // namespace

void set_directory_sync_for_testing(int (*sync)(int fd)) { g_directory_sync = sync; }

void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           mode_t mode, const std::function<void(const std::string&)>& warn) {
  // A fresh name each time: O_EXCL refuses whatever is already there, O_NOFOLLOW a link.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = path + ".tmp-" + random_hex(8);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && (errno != EEXIST || attempt >= 4)) fail("cannot create", tmp, errno);
  }
  int err = 0;
  std::string step;
  for (const std::string_view piece : pieces) {
    std::size_t done = 0;
    while (done < piece.size() && err == 0) {
      const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        step = "cannot write";
      } else {
        done += static_cast<std::size_t>(n);
      }
    }
  }
  if (err == 0 && ::fsync(fd) != 0) {
    err = errno;
    step = "cannot fsync";
  }
  if (::close(fd) != 0 && err == 0) {
    err = errno;
    step = "cannot close";
  }
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    step = "cannot rename " + tmp + " over";
    ::unlink(tmp.c_str());
    fail(step, path, err);
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    fail(step, tmp, err);
  }
  // The new content is in place; the directory's sync makes the rename itself durable.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int rc = dir_fd < 0 ? -1 : (g_directory_sync ? g_directory_sync(dir_fd) : ::fsync(dir_fd));
  const int sync_err = errno;
  if (dir_fd >= 0) ::close(dir_fd);
  if (rc != 0 && warn) {
    warn("wrote '" + path + "' but cannot sync its directory '" + dir +
         "': " + std::strerror(sync_err) + " (a crash now may bring back the old content)");
  }
}

}  // namespace kf
