// SPDX-License-Identifier: Apache-2.0
// kf-bench compare's command line: the subcommand and its options, validated with the same
// parse functions that convert them afterwards. Here rather than in main.cpp so that main.cpp
// stays short and the validation can be tested. Thread-safety: as CLI11's App.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "kf-bench/lib/compare.hpp"

namespace kf::tools::bench {

/// What the compare subcommand's options are parsed into.
struct CompareCommand {
  CompareOptions options;
  std::vector<std::string> sizes{"4", "4K", "64K", "1M", "16M", "64M"};  ///< as given
  std::vector<std::string> methods{"barrier", "back-to-back"};           ///< as given
};

/// Adds the compare subcommand to `app`, its options parsed into `command`, which must outlive
/// the parse. Returns the subcommand.
CLI::App* add_compare_command(CLI::App& app, CompareCommand& command);

/// The options of a parsed and validated `command`, the sizes converted to bytes.
CompareOptions compare_options(const CompareCommand& command);

}  // namespace kf::tools::bench
