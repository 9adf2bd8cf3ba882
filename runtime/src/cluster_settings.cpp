// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/cluster_settings.hpp"

#include <cmath>
#include <functional>
#include <utility>

namespace kf {

namespace {

using nlohmann::json;

// A value as a message shows it: JSON text, cut short when long.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

std::optional<std::int64_t> integer_at_least(const json& v, std::int64_t lo) {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
    return std::nullopt;
  }
  const auto n = v.get<std::int64_t>();
  if (n < lo) return std::nullopt;
  return n;
}

// One known key: what it must be, and how to take a valid value into the typed settings.
struct Rule {
  const char* key;
  const char* expected;
  std::function<bool(const json&, ClusterSettings&)> take;  // false: invalid
};

const std::vector<Rule>& rules() {
  static const std::vector<Rule> kRules{
      {"algorithm", "one of \"auto\", \"star\", \"ring\", \"tree\", \"clique\", \"rhd\"",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_string()) return false;
         s.algorithm = parse_algorithm(v.get<std::string>());
         return s.algorithm.has_value();
       }},
      {"batch_size", "an integer >= 1",
       [](const json& v, ClusterSettings& s) {
         s.batch_size = integer_at_least(v, 1);
         return s.batch_size.has_value();
       }},
      {"lr", "a finite number",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_number() || !std::isfinite(v.get<double>())) return false;
         s.learning_rate = v.get<double>();
         return true;
       }},
      {"min_workers", "an integer >= 0",
       [](const json& v, ClusterSettings& s) {
         s.min_workers = integer_at_least(v, 0);
         return s.min_workers.has_value();
       }},
      {"max_workers", "an integer >= 0",
       [](const json& v, ClusterSettings& s) {
         s.max_workers = integer_at_least(v, 0);
         return s.max_workers.has_value();
       }},
      {"mode", "a training mode such as \"sync-sgd\" or \"sma:period=4\"",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_string()) return false;
         try {
           s.mode = parse_mode(v.get<std::string>());
         } catch (const std::invalid_argument&) {
           return false;
         }
         return true;
       }},
      {"compression", "a compression such as \"none\", \"fp16\" or \"topk:0.01\"",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_string()) return false;
         try {
           s.compression = parse_compression(v.get<std::string>());
         } catch (const std::invalid_argument&) {
           return false;
         }
         return true;
       }},
      {"balance", "true or false",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_boolean()) return false;
         s.balance = v.get<bool>();
         return true;
       }},
      {"finished", "true or false",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_boolean()) return false;
         s.finished = v.get<bool>();
         return true;
       }},
      {"stop", "true or false",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_boolean()) return false;
         s.stop = v.get<bool>();
         return true;
       }},
  };
  return kRules;
}

}  // namespace

ParsedSettings parse_cluster_settings(const json& settings) {
  ParsedSettings out;
  if (settings.is_null()) return out;
  if (!settings.is_object()) {
    out.errors.push_back("settings: expected an object, got " + shown(settings));
    return out;
  }
  out.valid = settings;
  for (const auto& rule : rules()) {
    const auto it = settings.find(rule.key);
    if (it == settings.end()) continue;
    ClusterSettings candidate = out.typed;
    if (rule.take(*it, candidate)) {
      out.typed = std::move(candidate);
    } else {
      out.errors.push_back(std::string("settings.") + rule.key + ": expected " + rule.expected +
                           ", got " + shown(*it));
      out.valid.erase(rule.key);
    }
  }
  return out;
}

}  // namespace kf
