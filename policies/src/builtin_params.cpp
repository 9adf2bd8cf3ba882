// SPDX-License-Identifier: Apache-2.0
#include "builtin_params.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace kf::detail {

namespace {

std::string describe(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

std::string list(std::initializer_list<std::string_view> items) {
  std::string s;
  for (auto item : items) s += (s.empty() ? "" : ", ") + std::string(item);
  return s;
}

bool contains(std::initializer_list<std::string_view> items, std::string_view x) {
  for (auto item : items) {
    if (item == x) return true;
  }
  return false;
}

}  // namespace

std::string format_number(double value) {
  // The shortest of %.15g and %.17g that reads back as the same double: "0", "0.5", "1e+09".
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", value);
  if (std::strtod(buf, nullptr) != value) std::snprintf(buf, sizeof buf, "%.17g", value);
  return buf;
}

std::string short_number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  return buf;
}

ParamReader::ParamReader(std::string policy, const nlohmann::json& params)
    : policy_(std::move(policy)), params_(params.is_null() ? nlohmann::json::object() : params) {
  if (!params_.is_object()) {
    throw std::invalid_argument(policy_ + ": params must be a mapping of parameters (got " +
                                describe(params_) + ")");
  }
}

void ParamReader::fail(std::string_view name, std::string_view what) const {
  throw std::invalid_argument(policy_ + ": parameter '" + std::string(name) + "' " +
                              std::string(what));
}

const nlohmann::json* ParamReader::find(const char* name) {
  known_.insert(name);
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : &*it;
}

std::optional<std::int64_t> ParamReader::optional_integer(const char* name, std::int64_t low,
                                                          std::int64_t high) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return std::nullopt;
  const std::string expected =
      "must be an integer in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
  if (v->is_number_unsigned()) {
    const auto u = v->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(high)) fail(name, expected + " (got " + v->dump() + ")");
    return static_cast<std::int64_t>(u);
  }
  if (!v->is_number_integer()) fail(name, expected + " (got " + describe(*v) + ")");
  const auto i = v->get<std::int64_t>();
  if (i < low || i > high) fail(name, expected + " (got " + std::to_string(i) + ")");
  return i;
}

std::int64_t ParamReader::integer(const char* name, std::int64_t fallback, std::int64_t low,
                                  std::int64_t high) {
  return optional_integer(name, low, high).value_or(fallback);
}

std::optional<double> ParamReader::optional_number(const char* name, NumberRange range) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return std::nullopt;
  const std::string expected = std::string("must be a number in ") + (range.low_open ? "(" : "[") +
                               format_number(range.low) + ", " + format_number(range.high) +
                               (range.high_open ? ")" : "]");
  if (!v->is_number()) fail(name, expected + " (got " + describe(*v) + ")");
  const double x = v->get<double>();
  const bool low_ok = range.low_open ? x > range.low : x >= range.low;
  const bool high_ok = range.high_open ? x < range.high : x <= range.high;
  if (!std::isfinite(x) || !low_ok || !high_ok) {
    fail(name, expected + " (got " + format_number(x) + ")");
  }
  return x;
}

double ParamReader::number(const char* name, double fallback, NumberRange range) {
  return optional_number(name, range).value_or(fallback);
}

std::string ParamReader::choice(const char* name, std::string fallback,
                                std::initializer_list<std::string_view> choices) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return fallback;
  if (!v->is_string() || !contains(choices, v->get_ref<const std::string&>())) {
    fail(name, "must be one of " + list(choices) + " (got " + describe(*v) + ")");
  }
  return v->get<std::string>();
}

bool ParamReader::boolean(const char* name, bool fallback) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) fail(name, "must be true or false (got " + describe(*v) + ")");
  return v->get<bool>();
}

std::string ParamReader::string(const char* name, std::string fallback) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return fallback;
  if (!v->is_string()) fail(name, "must be a string (got " + describe(*v) + ")");
  return v->get<std::string>();
}

std::vector<std::string> ParamReader::choice_list(const char* name,
                                                  std::vector<std::string> fallback,
                                                  std::initializer_list<std::string_view> choices) {
  const nlohmann::json* v = find(name);
  if (v == nullptr) return fallback;
  const std::string expected = "must be a non-empty list of distinct names from " + list(choices);
  if (!v->is_array() || v->empty()) fail(name, expected + " (got " + describe(*v) + ")");
  std::vector<std::string> out;
  for (const auto& item : *v) {
    if (!item.is_string() || !contains(choices, item.get_ref<const std::string&>())) {
      fail(name, expected + " (got " + describe(item) + ")");
    }
    for (const auto& seen : out) {
      if (seen == item.get_ref<const std::string&>()) {
        fail(name, expected + " (" + describe(item) + " is named twice)");
      }
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

void ParamReader::reject_unknown() const {
  for (const auto& [key, value] : params_.items()) {
    if (known_.count(key) > 0) continue;
    std::string known;
    for (const auto& k : known_) known += (known.empty() ? "" : ", ") + k;
    throw std::invalid_argument(policy_ + ": unknown parameter '" + key + "' (known: " + known +
                                ")");
  }
}

void ParamReader::require_ordered(const char* low_name, const std::optional<std::int64_t>& low,
                                  const char* high_name,
                                  const std::optional<std::int64_t>& high) const {
  if (low && high && *low > *high) {
    fail(low_name, "must not exceed " + std::string(high_name) + " (" + std::to_string(*low) +
                       " > " + std::to_string(*high) + ")");
  }
}

}  // namespace kf::detail
