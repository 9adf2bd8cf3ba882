// SPDX-License-Identifier: Apache-2.0
// CLI11 validators built from kf-bench's parse functions, so that the command line accepts
// exactly the values that later convert, and a rejected value's message says what is wrong.
// Thread-safety: the validators are pure.
#pragma once

#include <CLI/CLI.hpp>
#include <climits>
#include <stdexcept>
#include <string>

#include "kf-bench/lib/parse.hpp"

namespace kf::tools::bench {

/// The most timed or warm-up iterations a command line may ask for.
inline constexpr int kMaxIterations = 1000000;

/// A validator from `parse`, which throws std::invalid_argument (its message is the error) or
/// returns something false for a value that is not `what`.
template <typename Parse>
CLI::Validator checked_by(Parse parse, const std::string& what) {
  return CLI::Validator(
      [parse, what](std::string& text) -> std::string {
        try {
          return parse(text) ? std::string() : "'" + text + "' is not " + what;
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      "", what);
}

/// A size on the command line of the baselines (tools/bench/baselines): bytes with K/M/G
/// suffixes, at most 2^31 - 1 floats (MPI and Gloo count elements in an int).
inline CLI::Validator float_size_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          const std::size_t count = element_count(parse_bytes(text), DType::f32);
          return count <= INT_MAX ? "" : "'" + text + "' is more than 2^31 - 1 floats";
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      "SIZE", "size");
}

}  // namespace kf::tools::bench
