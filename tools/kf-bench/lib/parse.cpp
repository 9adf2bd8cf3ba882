// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/parse.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace kf::tools::bench {

std::size_t parse_bytes(std::string_view text) {
  const std::string quoted = "size '" + std::string(text) + "'";
  if (text.empty()) throw std::invalid_argument("a size is empty");
  int shift = 0;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    default: break;
  }
  const std::string_view digits = shift == 0 ? text : text.substr(0, text.size() - 1);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec == std::errc::invalid_argument || end != digits.data() + digits.size()) {
    throw std::invalid_argument(quoted +
                                " is not a number of bytes with an optional K, M or G "
                                "suffix (e.g. 4, 64K, 16M)");
  }
  constexpr std::uint64_t kMax = std::uint64_t{1} << 63;
  if (ec == std::errc::result_out_of_range || value > (kMax >> shift)) {
    throw std::invalid_argument(quoted + " is too large");
  }
  if (value == 0) throw std::invalid_argument(quoted + " is zero; sizes start at 1 byte");
  return static_cast<std::size_t>(value << shift);
}

std::string format_bytes(std::size_t bytes) {
  int suffix = 0;
  while (suffix < 3 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++suffix;
  }
  return std::to_string(bytes) + (suffix == 0 ? "" : std::string(1, "KMG"[suffix - 1]));
}

std::size_t element_count(std::size_t bytes, DType dtype) noexcept {
  return std::max<std::size_t>(1, bytes / dtype_bytes(dtype));
}

std::vector<Algorithm> parse_algorithms(std::string_view name) {
  if (name == "all") {
    return {Algorithm::star, Algorithm::ring,         Algorithm::tree,       Algorithm::clique,
            Algorithm::rhd,  Algorithm::hierarchical, Algorithm::auto_select};
  }
  const auto a = parse_algorithm(name);
  if (!a) {
    throw std::invalid_argument(
        "algorithm '" + std::string(name) +
        "' is not one of star, ring, tree, clique, rhd, hierarchical, auto, all");
  }
  return {*a};
}

}  // namespace kf::tools::bench
