// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/line_prefixer.hpp"

#include <utility>

namespace kf::tools {

LinePrefixer::LinePrefixer(std::string prefix, Sink sink)
    : prefix_(std::move(prefix)), sink_(std::move(sink)) {}

void LinePrefixer::feed(std::string_view data) {
  while (!data.empty()) {
    const auto newline = data.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(data);
      if (partial_.size() >= kMaxLineBytes) {
        emit(partial_);
        partial_.clear();
      }
      return;
    }
    if (partial_.empty()) {
      emit(data.substr(0, newline));
    } else {
      partial_.append(data.substr(0, newline));
      emit(partial_);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
}

void LinePrefixer::finish() {
  if (partial_.empty()) return;
  emit(partial_);
  partial_.clear();
}

void LinePrefixer::emit(std::string_view line) {
  line_.assign(prefix_);
  line_.append(line);
  line_.push_back('\n');
  sink_(line_);
}

}  // namespace kf::tools
