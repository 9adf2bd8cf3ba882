// SPDX-License-Identifier: Apache-2.0
// Reading a built-in policy's job-file parameters (the JSON `params` object): every value is
// checked for its type and range, a missing one takes its documented default, and a name the
// policy does not know is rejected, so that a typo in the job file fails at start-up instead of
// silently running with a default. Every error is a std::invalid_argument that names the policy
// and the parameter, e.g. "gns-batch-size: parameter 'every' must be an integer in
// [1, 1000000000] (got 0)".
// Thread-safety: none (one reader per factory call).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kf::detail {

/// An interval bound of a number parameter; open bounds exclude the value itself.
struct NumberRange {
  double low = 0.0;
  double high = 0.0;
  bool low_open = false;
  bool high_open = false;
};

class ParamReader {
 public:
  /// Throws: std::invalid_argument when `params` is neither null nor a JSON object.
  ParamReader(std::string policy, const nlohmann::json& params);

  /// An integer in [low, high]; `fallback` when absent. A JSON float is not an integer.
  /// Throws: std::invalid_argument naming the parameter (wrong type or out of range).
  std::int64_t integer(const char* name, std::int64_t fallback, std::int64_t low,
                       std::int64_t high);
  /// As integer(), nullopt when absent.
  std::optional<std::int64_t> optional_integer(const char* name, std::int64_t low,
                                               std::int64_t high);
  /// A finite number (integer or float) in `range`; `fallback` when absent.
  /// Throws: std::invalid_argument naming the parameter.
  double number(const char* name, double fallback, NumberRange range);
  /// As number(), nullopt when absent.
  std::optional<double> optional_number(const char* name, NumberRange range);
  /// A string that is one of `choices`; `fallback` when absent.
  /// Throws: std::invalid_argument naming the parameter and the choices.
  std::string choice(const char* name, std::string fallback,
                     std::initializer_list<std::string_view> choices);
  /// true or false; `fallback` when absent. Throws: std::invalid_argument naming the parameter.
  bool boolean(const char* name, bool fallback);
  /// A string; `fallback` when absent. Throws: std::invalid_argument naming the parameter.
  std::string string(const char* name, std::string fallback);
  /// A non-empty array of distinct strings, each one of `choices`; `fallback` when absent.
  /// Throws: std::invalid_argument naming the parameter.
  std::vector<std::string> choice_list(const char* name, std::vector<std::string> fallback,
                                       std::initializer_list<std::string_view> choices);

  /// Rejects every parameter that no call above asked for (called last, by each factory).
  /// Throws: std::invalid_argument naming the unknown parameter and the known ones.
  void reject_unknown() const;

  /// Fails on `low_name` when both bounds were given and `low` exceeds `high`: "must not exceed
  /// <high_name> (<low> > <high>)" (called after reject_unknown).
  void require_ordered(const char* low_name, const std::optional<std::int64_t>& low,
                       const char* high_name, const std::optional<std::int64_t>& high) const;

  /// "<policy>: parameter '<name>' <what>", the message of every error above.
  [[noreturn]] void fail(std::string_view name, std::string_view what) const;

 private:
  const nlohmann::json* find(const char* name);

  std::string policy_;
  nlohmann::json params_;
  std::set<std::string> known_;
};

/// "1234", "0.5", "1e+20": the shortest text that reads back as the same double, for messages.
std::string format_number(double value);

/// "0.333333", "1.5e+06": six significant digits, for the reasons a policy logs.
std::string short_number(double value);

}  // namespace kf::detail
