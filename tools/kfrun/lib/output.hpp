// SPDX-License-Identifier: Apache-2.0
// kfrun's side of the workers' output, shared by the static mode and the agent: an output of
// kfrun that survives a closed reader (FdWriter), and reading a worker's non-blocking pipe into a
// LinePrefixer chunk by chunk or, once the worker is gone, to what is left. Thread-safety: one
// object per fd, used by one thread.
#pragma once

#include <span>
#include <string_view>

#include "kfrun/lib/line_prefixer.hpp"
#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

/// Writes all of `data`, waiting while a non-blocking fd is full. Returns false on an error.
bool write_all(int fd, std::string_view data) noexcept;

/// One output of kfrun. After the first failed write (e.g. a closed pipe) it says so once on
/// `report_fd` and drops what follows; the workers keep running.
class FdWriter {
 public:
  FdWriter(int fd, int report_fd) noexcept : fd_(fd), report_fd_(report_fd) {}
  void write(std::string_view data) noexcept;

 private:
  int fd_;
  int report_fd_;
  bool failed_ = false;
};

/// Reads one chunk of what `fd` has into `lines`; at end of stream completes the last line and
/// closes `fd`. Returns false when nothing more can be read now. Throws: what the sink throws.
bool read_chunk(UniqueFd& fd, LinePrefixer& lines, std::span<char> buffer);

/// After a worker exited: takes what is left in its pipe without waiting for writers it may have
/// left behind (a background child still holding the pipe), then closes `fd`.
void drain(UniqueFd& fd, LinePrefixer& lines, std::span<char> buffer);

}  // namespace kf::tools
