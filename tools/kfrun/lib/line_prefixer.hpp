// SPDX-License-Identifier: Apache-2.0
// Tags a worker's output stream line by line (mpirun --tag-output style): bytes come in chunks of
// any size, whole lines go out with a prefix such as "[3] ". A partial line is held until its
// newline arrives or the stream ends. Thread-safety: one object per stream, used by one thread.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace kf::tools {

class LinePrefixer {
 public:
  /// Receives one tagged line, prefix and final '\n' included.
  using Sink = std::function<void(std::string_view)>;

  /// A partial line longer than this is written out as a line of its own, so that a worker
  /// printing without newlines cannot make kfrun buffer without bound.
  static constexpr std::size_t kMaxLineBytes = 64 * 1024;

  LinePrefixer(std::string prefix, Sink sink);

  /// Writes every line that `data` completes to the sink, and keeps the rest. Throws: whatever
  /// the sink throws.
  void feed(std::string_view data);

  /// At end of stream: writes a pending partial line, followed by '\n'. Throws: as feed().
  void finish();

 private:
  void emit(std::string_view line);

  std::string prefix_;
  Sink sink_;
  std::string partial_;  // bytes after the last newline seen
  std::string line_;     // scratch: prefix + line + '\n', reused to avoid an allocation per line
};

}  // namespace kf::tools
