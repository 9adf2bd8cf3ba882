// SPDX-License-Identifier: Apache-2.0
// Parsing kf-bench's command-line values: message sizes with binary suffixes ("64K", "16M") and
// algorithm lists ("ring", "all"); and writing sizes the same way. The command line validates
// with these same functions, so a value it accepts always converts. Thread-safety: pure
// functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kf/coll/types.hpp"

namespace kf::tools::bench {

/// Parses a message size: decimal digits and an optional suffix K, M or G (powers of 1024,
/// either case), e.g. "4", "1K", "64M". Throws: std::invalid_argument saying what is wrong
/// (empty, a bad suffix, zero, or more than 2^63 bytes).
std::size_t parse_bytes(std::string_view text);

/// The shortest form parse_bytes() reads back: "64K" for 65536, "16M", "3G"; "4", "1000".
std::string format_bytes(std::size_t bytes);

/// Elements of `dtype` in a message of `bytes`: rounded down, but at least one.
std::size_t element_count(std::size_t bytes, DType dtype) noexcept;

/// The algorithms named by `name`: one of star, ring, tree, clique, rhd, hierarchical, auto, or
/// "all" for star, ring, tree, clique, rhd, hierarchical, auto in that order. Throws:
/// std::invalid_argument for another name.
std::vector<Algorithm> parse_algorithms(std::string_view name);

}  // namespace kf::tools::bench
