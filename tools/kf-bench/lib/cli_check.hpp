// SPDX-License-Identifier: Apache-2.0
// CLI11 validators built from kf-bench's parse functions, so that the command line accepts
// exactly the values that later convert, and a rejected value's message says what is wrong.
// Thread-safety: the validators are pure.
#pragma once

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>

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

}  // namespace kf::tools::bench
