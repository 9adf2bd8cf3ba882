// SPDX-License-Identifier: Apache-2.0
#include "kf/policies/training_spec.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

namespace kf {

namespace {

[[noreturn]] void bad(std::string_view what, std::string_view text, const std::string& why) {
  throw std::invalid_argument(std::string(what) + " '" + std::string(text) + "': " + why);
}

template <class T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

std::string join(const std::vector<std::string_view>& names) {
  std::string s;
  for (auto n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

constexpr std::string_view kModeNames[] = {"sync-sgd", "sma", "pair-avg", "async-ps"};

}  // namespace

std::string_view to_string(TrainingMode mode) noexcept {
  return kModeNames[static_cast<int>(mode)];
}

ModeSpec parse_mode(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  ModeSpec spec;
  bool known = false;
  for (int i = 0; i < 4; ++i) {
    if (name == kModeNames[i]) {
      spec.mode = static_cast<TrainingMode>(i);
      known = true;
    }
  }
  if (!known) {
    bad("mode", text, "not one of sync-sgd, sma, pair-avg, async-ps");
  }
  std::vector<std::string_view> allowed;
  switch (spec.mode) {
    case TrainingMode::sync_sgd: break;
    case TrainingMode::sma: allowed = {"period", "post_local"}; break;
    case TrainingMode::pair_avg: allowed = {"seed"}; break;
    case TrainingMode::async_ps: allowed = {"max_staleness", "soft_sync", "scale_lr"}; break;
  }
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  if (rest.empty()) bad("mode", text, "nothing after ':'");
  std::set<std::string_view> seen;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) bad("mode", text, "a trailing ','");
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      bad("mode", text, "'" + std::string(item) + "' is not key=value");
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    bool ok_key = false;
    for (auto a : allowed) ok_key = ok_key || a == key;
    if (!ok_key) {
      bad("mode", text,
          "'" + std::string(key) + "' is not a parameter of " + std::string(name) +
              (allowed.empty() ? " (it has none)" : " (it has " + join(allowed) + ")"));
    }
    if (!seen.insert(key).second) bad("mode", text, "'" + std::string(key) + "' given twice");
    const auto need = [&](bool ok, const char* expected) {
      if (!ok) {
        bad("mode", text,
            std::string(key) + " must be " + expected + ", not '" + std::string(value) + "'");
      }
    };
    if (key == "period") {
      need(parse_number(value, spec.period) && spec.period >= 1 && spec.period <= 1000000,
           "an integer from 1 to 1000000");
    } else if (key == "post_local") {
      need(parse_number(value, spec.post_local) && spec.post_local >= 0, "an integer >= 0");
    } else if (key == "seed") {
      need(parse_number(value, spec.seed), "an integer >= 0");
    } else if (key == "max_staleness") {
      need(parse_number(value, spec.max_staleness) && spec.max_staleness >= 0 &&
               spec.max_staleness <= 1000000,
           "an integer from 0 to 1000000");
    } else if (key == "soft_sync") {
      need(parse_number(value, spec.soft_sync) && spec.soft_sync >= 1 && spec.soft_sync <= 1000000,
           "an integer from 1 to 1000000");
    } else if (key == "scale_lr") {
      need(value == "0" || value == "1", "0 or 1");
      spec.scale_lr = value == "1";
    }
  }
  return spec;
}

std::string ModeSpec::str() const {
  const ModeSpec d;
  std::string s(to_string(mode));
  std::vector<std::string> params;
  switch (mode) {
    case TrainingMode::sync_sgd: break;
    case TrainingMode::sma:
      if (period != d.period) params.push_back("period=" + std::to_string(period));
      if (post_local != d.post_local) params.push_back("post_local=" + std::to_string(post_local));
      break;
    case TrainingMode::pair_avg:
      if (seed != d.seed) params.push_back("seed=" + std::to_string(seed));
      break;
    case TrainingMode::async_ps:
      if (max_staleness != d.max_staleness) {
        params.push_back("max_staleness=" + std::to_string(max_staleness));
      }
      if (soft_sync != d.soft_sync) params.push_back("soft_sync=" + std::to_string(soft_sync));
      if (scale_lr != d.scale_lr)
        params.push_back(std::string("scale_lr=") + (scale_lr ? "1" : "0"));
      break;
  }
  for (std::size_t i = 0; i < params.size(); ++i) s += (i == 0 ? ":" : ",") + params[i];
  return s;
}

CompressionSpec parse_compression(std::string_view text) {
  const std::size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const std::string_view arg =
      colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  CompressionSpec spec;
  const auto no_arg = [&] {
    if (colon != std::string_view::npos) {
      bad("compression", text, std::string(name) + " takes no argument");
    }
  };
  if (name == "none") {
    no_arg();
  } else if (name == "fp16") {
    no_arg();
    spec.kind = Compression::fp16;
  } else if (name == "bf16") {
    no_arg();
    spec.kind = Compression::bf16;
  } else if (name == "topk" || name == "randomk") {
    spec.kind = name == "topk" ? Compression::topk : Compression::randomk;
    if (!parse_number(arg, spec.ratio) || !std::isfinite(spec.ratio) || spec.ratio <= 0 ||
        spec.ratio > 1) {
      bad("compression", text,
          std::string(name) + " needs a ratio in (0, 1] after ':', e.g. " + std::string(name) +
              ":0.01");
    }
  } else if (name == "powersgd") {
    spec.kind = Compression::powersgd;
    if (!parse_number(arg, spec.rank) || spec.rank < 1 || spec.rank > 1024) {
      bad("compression", text, "powersgd needs a rank from 1 to 1024 after ':', e.g. powersgd:4");
    }
  } else {
    bad("compression", text,
        "not one of none, fp16, bf16, topk:RATIO, randomk:RATIO, powersgd:RANK");
  }
  return spec;
}

std::string CompressionSpec::str() const {
  switch (kind) {
    case Compression::none: return "none";
    case Compression::fp16: return "fp16";
    case Compression::bf16: return "bf16";
    case Compression::topk:
    case Compression::randomk: {
      // The shortest text that reads back as the same double.
      char buf[64];
      const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, ratio);
      return std::string(kind == Compression::topk ? "topk:" : "randomk:") +
             std::string(buf, ec == std::errc{} ? end : buf);
    }
    case Compression::powersgd: return "powersgd:" + std::to_string(rank);
  }
  return "none";
}

}  // namespace kf
