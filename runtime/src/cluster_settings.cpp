// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/cluster_settings.hpp"

#include <algorithm>
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
      {"spares", "an integer in 0-1024",
       [](const json& v, ClusterSettings& s) {
         const auto n = integer_at_least(v, 0);
         if (!n || *n > 1024) return false;
         s.spares = *n;
         return true;
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
      {"boundaries", "\"every-step\" or \"on-change\"",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_string()) return false;
         const auto text = v.get<std::string>();
         if (text != "every-step" && text != "on-change") return false;
         s.on_change = text == "on-change";
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
      {"suspended", "true or false",
       [](const json& v, ClusterSettings& s) {
         if (!v.is_boolean()) return false;
         s.suspended = v.get<bool>();
         return true;
       }},
  };
  return kRules;
}

}  // namespace

nlohmann::json AutoscaleSettings::to_json() const {
  json j = {{"min", min}, {"cooldown_s", cooldown_s}};
  if (max) j["max"] = *max;
  if (target) {
    j["target"] = *target;
  } else {
    j["target"] = "all";
  }
  if (per_host) j["per_host"] = *per_host;
  return j;
}

std::optional<AutoscaleSettings> parse_autoscale(const json& value, std::string& why) {
  if (!value.is_object()) {
    why = "expected an object such as {\"min\": 2, \"max\": 16, \"target\": \"all\"}, got " +
          shown(value);
    return std::nullopt;
  }
  AutoscaleSettings a;
  for (const auto& [key, v] : value.items()) {
    std::optional<std::int64_t> n;
    if (key == "min" || key == "max" || key == "per_host") {
      n = integer_at_least(v, 1);
      if (!n) {
        why = key + ": expected an integer >= 1, got " + shown(v);
        return std::nullopt;
      }
      if (key == "min") a.min = *n;
      if (key == "max") a.max = n;
      if (key == "per_host") a.per_host = n;
    } else if (key == "target") {
      if (v.is_string() && v.get<std::string>() == "all") continue;
      n = integer_at_least(v, 1);
      if (!n) {
        why = "target: expected an integer >= 1 or \"all\", got " + shown(v);
        return std::nullopt;
      }
      a.target = n;
    } else if (key == "cooldown_s") {
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
          v.get<double>() > 86400) {
        why = "cooldown_s: expected a number of seconds from 0 to 86400, got " + shown(v);
        return std::nullopt;
      }
      a.cooldown_s = v.get<double>();
    } else {
      why = "unknown key \"" + key + "\" (known: min, max, target, cooldown_s, per_host)";
      return std::nullopt;
    }
  }
  if (a.max && a.min > *a.max) {
    why = "min " + std::to_string(a.min) + " is greater than max " + std::to_string(*a.max);
    return std::nullopt;
  }
  if (a.target && (*a.target < a.min || (a.max && *a.target > *a.max))) {
    why = "target " + std::to_string(*a.target) + " is outside [min " + std::to_string(a.min) +
          ", max " + (a.max ? std::to_string(*a.max) : std::string("none")) + "]";
    return std::nullopt;
  }
  return a;
}

AutoscaleSettings autoscale_within_bounds(const ClusterSettings& settings) {
  AutoscaleSettings a = settings.autoscale.value();
  if (settings.max_workers && *settings.max_workers > 0) {
    a.max = std::min(a.max.value_or(*settings.max_workers), *settings.max_workers);
  }
  if (settings.min_workers && *settings.min_workers > 0)
    a.min = std::max(a.min, *settings.min_workers);
  if (a.max) a.min = std::min(a.min, *a.max);
  if (a.target) {
    a.target = std::max(*a.target, a.min);
    if (a.max) a.target = std::min(*a.target, *a.max);
  }
  return a;
}

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
  if (const auto it = settings.find("autoscale"); it != settings.end()) {
    std::string why;
    if (auto a = parse_autoscale(*it, why)) {
      out.typed.autoscale = std::move(a);
    } else {
      out.errors.push_back("settings.autoscale: " + why);
      out.valid.erase("autoscale");
    }
  }
  return out;
}

}  // namespace kf
