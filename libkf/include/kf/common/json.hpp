// SPDX-License-Identifier: Apache-2.0
// JSON from outside the process (requests, answers, files, the environment, peers' messages),
// parsed with a bound on nesting. nlohmann::json parses deep nesting without recursion, but
// copies, compares, prints and destroys recursively: a body of a million '[' would overflow the
// stack of whatever touches the parsed value next. Everything kf parses nests a few levels.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

namespace kf {

/// Levels of arrays and objects a document may nest (the cluster document uses 4).
inline constexpr std::size_t kMaxJsonDepth = 64;

/// The deepest nesting of arrays and objects in `text`, stopping once it passes `limit`
/// (strings and their escapes are skipped; the text need not be valid JSON).
std::size_t json_depth(std::string_view text, std::size_t limit = kMaxJsonDepth) noexcept;

/// Parses `text`. Throws: std::invalid_argument when it nests deeper than `max_depth`;
/// nlohmann::json::parse_error (a std::exception) when it is not JSON.
nlohmann::json parse_json(std::string_view text, std::size_t max_depth = kMaxJsonDepth);

/// Parses `text`; a discarded value (is_discarded()) when it is not JSON or nests deeper than
/// `max_depth`.
nlohmann::json parse_json_or_discard(std::string_view text,
                                     std::size_t max_depth = kMaxJsonDepth) noexcept;

}  // namespace kf
