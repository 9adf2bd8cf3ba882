// SPDX-License-Identifier: Apache-2.0
#include "kf/common/json.hpp"

#include <stdexcept>
#include <string>

namespace kf {

std::size_t json_depth(std::string_view text, std::size_t limit) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return deepest;
}

nlohmann::json parse_json(std::string_view text, std::size_t max_depth) {
  if (json_depth(text, max_depth) > max_depth) {
    throw std::invalid_argument("JSON nests deeper than " + std::to_string(max_depth) + " levels");
  }
  return nlohmann::json::parse(text);
}

nlohmann::json parse_json_or_discard(std::string_view text, std::size_t max_depth) noexcept {
  if (json_depth(text, max_depth) > max_depth)
    return nlohmann::json(nlohmann::json::value_t::discarded);
  try {
    return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception&) {  // out of memory
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

}  // namespace kf
