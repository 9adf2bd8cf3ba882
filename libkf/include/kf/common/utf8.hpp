// SPDX-License-Identifier: Apache-2.0
// UTF-8 checks for text from outside that ends up in JSON or the metrics exposition, both of
// which must be UTF-8. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

namespace kf {

/// The offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos when there is none.
std::size_t first_invalid_utf8(std::string_view s) noexcept;

inline bool is_valid_utf8(std::string_view s) noexcept {
  return first_invalid_utf8(s) == std::string_view::npos;
}

}  // namespace kf
