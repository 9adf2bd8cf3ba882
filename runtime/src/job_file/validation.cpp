// SPDX-License-Identifier: Apache-2.0
// Validation of the job file (docs/job-file.md). yaml-cpp builds the node tree but types nothing:
// every scalar is text. Scalars are typed here by the YAML 1.2 core schema, so that the same file
// means the same to kf as to other YAML 1.2 tools: a quoted or block scalar is a string; a plain
// one is null, a bool, an int or a float when it reads as one (`yes` and `1_000` are strings),
// else a string. yaml-cpp keeps the first of two equal keys silently, so keys are checked here.
// kf::parse_job_file (job_file.cpp) hands the document here.
#include "job_file/validation.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

namespace kf {
namespace {

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr const char* kMissingJob =
    "missing required key (expected a mapping such as `job: {name: my-job}`)";

enum class Kind { null, boolean, integer, floating, string, sequence, mapping };

// The core schema's patterns, matched by hand: GCC 12 warns inside <regex> in the -O1 sanitizer
// builds, which CI builds with -Werror.

/// `s` is one or more digits of `base` (8, 10 or 16).
bool is_digits(std::string_view s, int base) {
  if (s.empty()) return false;
  for (const char c : s) {
    const bool ok = base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                               : c >= '0' && c < static_cast<char>('0' + base);
    if (!ok) return false;
  }
  return true;
}

std::string_view without_sign(std::string_view s) {
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) s.remove_prefix(1);
  return s;
}

/// [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+
bool is_core_int(std::string_view s) {
  if (s.starts_with("0o")) return is_digits(s.substr(2), 8);
  if (s.starts_with("0x")) return is_digits(s.substr(2), 16);
  return is_digits(without_sign(s), 10);
}

/// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? | [-+]?\.(inf|Inf|INF) | \.(nan|NaN|NAN)
bool is_core_float(std::string_view s) {
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return true;
  s = without_sign(s);
  if (s == ".inf" || s == ".Inf" || s == ".INF") return true;
  const auto digits = [&s] {
    std::size_t n = 0;
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
    s.remove_prefix(n);
    return n;
  };
  std::size_t mantissa = digits();
  if (s.starts_with(".")) {
    s.remove_prefix(1);
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (s.starts_with("e") || s.starts_with("E")) {
    s = without_sign(s.substr(1));
    if (digits() == 0) return false;
  }
  return s.empty();
}

/// The type the YAML 1.2 core schema gives a plain (unquoted, untagged) scalar.
Kind resolve_plain(std::string_view s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return Kind::null;
  for (const char* b : {"true", "True", "TRUE", "false", "False", "FALSE"}) {
    if (s == b) return Kind::boolean;
  }
  if (is_core_int(s)) return Kind::integer;
  if (is_core_float(s)) return Kind::floating;
  return Kind::string;
}

/// A core-schema int that fits in 64 bits: signed, or unsigned when it is too large for int64.
struct IntValue {
  bool is_unsigned = false;
  std::int64_t i = 0;
  std::uint64_t u = 0;
};

std::optional<IntValue> parse_int(std::string_view s) {
  bool negative = false;
  int base = 10;
  if (s.starts_with("0o") || s.starts_with("0x")) {
    base = s[1] == 'o' ? 8 : 16;
    s.remove_prefix(2);
  } else if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  std::uint64_t magnitude = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), magnitude, base);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  constexpr auto kMax = static_cast<std::uint64_t>(kInt64Max);
  if (negative) {
    if (magnitude > kMax + 1) return std::nullopt;
    // -(2^63) is representable, its magnitude as int64 is not: negate the magnitude minus one.
    return IntValue{false, magnitude == 0 ? 0 : -static_cast<std::int64_t>(magnitude - 1) - 1, 0};
  }
  if (magnitude <= kMax) return IntValue{false, static_cast<std::int64_t>(magnitude), magnitude};
  return IntValue{true, 0, magnitude};
}

/// A core-schema float; infinities and NaN as such; nullopt when the text overflows.
std::optional<double> parse_float(std::string_view s) {
  if (s.ends_with("inf") || s.ends_with("Inf") || s.ends_with("INF")) {
    return s[0] == '-' ? -std::numeric_limits<double>::infinity()
                       : std::numeric_limits<double>::infinity();
  }
  if (s.starts_with(".")) {
    if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  double d = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return d;
}

/// A node with the key path and the line that errors about it name.
struct Value {
  YAML::Node node;
  std::string path;
  int line = 1;
};

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

int line_of(const YAML::Node& n, int fallback) {
  // yaml-cpp marks an empty value at the token after it, so callers pass the key's line.
  return n.IsNull() || n.Mark().is_null() ? fallback : n.Mark().line + 1;
}

using Fields = std::map<std::string, Value>;

const Value* find(const Fields& f, const char* key) {
  const auto it = f.find(key);
  return it == f.end() ? nullptr : &it->second;
}

/// Reads values for one source, throwing JobFileError with its name.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const Value& v, const std::string& reason) const {
    throw JobFileError(source_, v.line, v.path, reason);
  }
  [[noreturn]] void expected(const Value& v, const std::string& expectation) const {
    fail(v, "must be " + expectation + ", got " + describe(v));
  }

  Kind kind(const Value& v) const {
    const YAML::Node& n = v.node;
    if (!n.IsDefined() || n.IsNull()) return Kind::null;
    if (n.IsSequence()) return Kind::sequence;
    if (n.IsMap()) return Kind::mapping;
    const std::string& tag = n.Tag();
    if (tag == "!") return Kind::string;  // quoted or block scalar
    const Kind plain = resolve_plain(n.Scalar());
    if (tag == "?" || tag.empty()) return plain;
    static const std::string kCore = "tag:yaml.org,2002:";
    if (tag == kCore + "str") return Kind::string;
    for (const auto& [name, k] : {std::pair{"int", Kind::integer},
                                  {"float", Kind::floating},
                                  {"bool", Kind::boolean},
                                  {"null", Kind::null}}) {
      if (tag != kCore + name) continue;
      if (plain == k || (k == Kind::floating && plain == Kind::integer)) return k;
      fail(v, std::string("is tagged !!") + name + " but \"" + n.Scalar() + "\" is not one");
    }
    fail(v, "has the tag " + tag + "; only the core schema's !!str, !!int, !!float, !!bool " +
                "and !!null are understood");
  }

  /// The value as an error message shows it: 1, 0.5, true, null, "text", a mapping.
  std::string describe(const Value& v) const {
    switch (kind(v)) {
      case Kind::null: return "null";
      case Kind::sequence: return "a sequence";
      case Kind::mapping: return "a mapping";
      case Kind::string: {
        std::string s = v.node.Scalar();
        if (s.size() > 60) s = s.substr(0, 57) + "...";
        // Quoted, with control characters escaped; a character the cut at 57 bytes split shows
        // as U+FFFD rather than failing the message.
        return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
      default: return v.node.Scalar();
    }
  }

  /// The entries of mapping `v`, checked: each key a scalar, one of `known`, and given once.
  Fields fields(const Value& v, std::initializer_list<const char*> known) const {
    if (kind(v) != Kind::mapping) expected(v, "a mapping");
    std::string known_list;
    for (const char* k : known) known_list += (known_list.empty() ? "" : ", ") + std::string(k);
    Fields out;
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      const Value key = key_of(v, it->first);
      bool is_known = false;
      for (const char* k : known) is_known = is_known || key.node.Scalar() == k;
      if (!is_known) fail(key, "unknown key (expected one of: " + known_list + ")");
      check_unique(out, key);
      out.emplace(key.node.Scalar(), Value{it->second, key.path, key.line});
    }
    return out;
  }

  /// The key node of an entry of mapping `map`, with its path and line.
  Value key_of(const Value& map, const YAML::Node& key) const {
    Value k{key, map.path, line_of(key, map.line)};
    if (!key.IsScalar()) fail(k, "a key must be a scalar, got " + describe(k));
    k.path = join(map.path, key.Scalar());
    // yaml-cpp does not implement merge keys; left alone, "<<" would become an ordinary key.
    if (key.Scalar() == "<<" && key.Tag() == "?") {
      fail(k, "merge keys (<<) are not supported; write the keys out");
    }
    return k;
  }

  template <class Map>
  void check_unique(const Map& seen, const Value& key) const {
    if (const auto it = seen.find(key.node.Scalar()); it != seen.end()) {
      fail(key, "duplicate key (first on line " + std::to_string(it->second.line) +
                    "); a key may appear once");
    }
  }

  /// An integer in [lo, hi]; `expectation` defaults to "an integer in lo..hi" (">= lo" when
  /// hi is int's or int64's maximum, which then is only named for a larger value).
  std::int64_t integer(const Value& v, std::int64_t lo, std::int64_t hi,
                       std::string expectation = {}) const {
    const bool open = hi == kIntMax || hi == kInt64Max;
    if (expectation.empty()) {
      expectation = "an integer " + (open ? ">= " + std::to_string(lo)
                                          : "in " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    if (kind(v) != Kind::integer) expected(v, expectation);
    const auto x = parse_int(v.node.Scalar());
    if (!x || x->is_unsigned || x->i > hi) {
      expected(v, open ? expectation + " and <= " + std::to_string(hi) : expectation);
    }
    if (x->i < lo) expected(v, expectation);
    return x->i;
  }

  /// A finite number > 0 (an integer is taken as a float).
  double positive_number(const Value& v) const {
    const std::string expectation = "a finite number > 0";
    const Kind k = kind(v);
    if (k != Kind::integer && k != Kind::floating) expected(v, expectation);
    std::optional<double> d;
    if (k == Kind::integer) {
      const auto x = parse_int(v.node.Scalar());  // 0x10 and 0o7 are ints too
      if (x) d = x->is_unsigned ? static_cast<double>(x->u) : static_cast<double>(x->i);
    } else {
      d = parse_float(v.node.Scalar());
    }
    if (!d || !std::isfinite(*d) || !(*d > 0)) expected(v, expectation);
    return *d;
  }

  std::string string(const Value& v, const std::string& expectation = "a non-empty string") const {
    if (kind(v) != Kind::string || v.node.Scalar().empty()) expected(v, expectation);
    return v.node.Scalar();
  }

  /// The items of sequence `v`, each with its path ("plugins[2]") and line.
  std::vector<Value> items(const Value& v, const std::string& expectation) const {
    if (kind(v) != Kind::sequence) expected(v, expectation);
    std::vector<Value> out;
    for (std::size_t i = 0; i < v.node.size(); ++i) {
      const YAML::Node item = v.node[i];
      out.push_back(Value{item, v.path + "[" + std::to_string(i) + "]", line_of(item, v.line)});
    }
    return out;
  }

  /// YAML to JSON, keeping each scalar's type; mapping keys become strings. Bounded: at most
  /// kMaxValues values in all per file (an alias repeats what it names, so a few lines of
  /// aliases of aliases would expand without end) and kMaxDepth levels.
  nlohmann::json to_json(const Value& v, int depth = 0) const {
    if (++converted_ > kMaxValues) {
      fail(v, "expands to more than " + std::to_string(kMaxValues) +
                  " values (aliases that repeat a large part of the file?)");
    }
    if (depth > kMaxDepth)
      fail(v, "is nested deeper than " + std::to_string(kMaxDepth) + " levels");
    switch (kind(v)) {
      case Kind::null: return nullptr;
      case Kind::boolean: {
        const char c = v.node.Scalar()[0];
        return c == 't' || c == 'T';
      }
      case Kind::integer: {
        const auto x = parse_int(v.node.Scalar());
        if (!x) fail(v, "integer " + v.node.Scalar() + " does not fit in 64 bits");
        if (x->is_unsigned) return x->u;
        return x->i;
      }
      case Kind::floating: {
        const auto d = parse_float(v.node.Scalar());
        if (!d || !std::isfinite(*d)) {
          expected(v, "a finite number (JSON holds no infinity or NaN)");
        }
        return *d;
      }
      case Kind::string: return v.node.Scalar();
      case Kind::sequence: {
        auto a = nlohmann::json::array();
        for (const Value& item : items(v, "a sequence")) a.push_back(to_json(item, depth + 1));
        return a;
      }
      case Kind::mapping: break;
    }
    auto o = nlohmann::json::object();
    std::map<std::string, Value> seen;
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      const Value key = key_of(v, it->first);
      check_unique(seen, key);
      seen.emplace(key.node.Scalar(), key);
      o[key.node.Scalar()] = to_json(Value{it->second, key.path, key.line}, depth + 1);
    }
    return o;
  }

 private:
  static constexpr std::size_t kMaxValues = 100'000;
  static constexpr int kMaxDepth = 64;
  std::string source_;
  mutable std::size_t converted_ = 0;  // values to_json made so far, for kMaxValues
};

void read_workers(const Reader& r, const Value& v, JobFile::Workers& w) {
  const Fields f = r.fields(v, {"min", "max", "initial"});
  const Value* min = find(f, "min");
  const Value* max = find(f, "max");
  if (min) w.min = static_cast<int>(r.integer(*min, 1, kIntMax));
  if (max) {
    w.max = static_cast<int>(r.integer(
        *max, w.min, kIntMax, "an integer >= workers.min (" + std::to_string(w.min) + ")"));
  } else if (w.min > w.max) {
    r.expected(*min, "an integer <= workers.max (" + std::to_string(w.max) + " by default)");
  }
  w.initial = w.min;
  if (const Value* initial = find(f, "initial")) {
    const std::string range = std::to_string(w.min) + ".." + std::to_string(w.max);
    w.initial = static_cast<int>(r.integer(
        *initial, w.min, w.max, "an integer in workers.min..workers.max (" + range + ")"));
  }
}

void read_timeouts(const Reader& r, const Value& v, JobFile::Timeouts& t) {
  const Fields f = r.fields(v, {"collective_ms", "heartbeat_ms", "connect_ms"});
  if (const Value* x = find(f, "collective_ms")) {
    t.collective = std::chrono::milliseconds(r.integer(*x, 1, 3'600'000));
  }
  if (const Value* x = find(f, "heartbeat_ms")) {
    t.heartbeat = std::chrono::milliseconds(
        r.integer(*x, 0, 600'000, "an integer in 0..600000 (0 disables heartbeats)"));
  }
  if (const Value* x = find(f, "connect_ms")) {
    t.connect = std::chrono::milliseconds(r.integer(*x, 1, 3'600'000));
  }
}

JobFile::Ports read_ports(const Reader& r, const Value& v) {
  const std::string expectation = "a port range \"A-B\" with 1 <= A <= B <= 65535";
  if (r.kind(v) != Kind::string) r.expected(v, expectation);
  const std::string& s = v.node.Scalar();
  const auto dash = s.find('-');
  if (dash == std::string::npos) r.expected(v, expectation);
  const std::string_view a = std::string_view(s).substr(0, dash);
  const std::string_view b = std::string_view(s).substr(dash + 1);
  if (!is_digits(a, 10) || !is_digits(b, 10) || a.size() > 5 || b.size() > 5) {
    r.expected(v, expectation);
  }
  const int first = std::stoi(std::string(a));
  const int last = std::stoi(std::string(b));
  if (first < 1 || first > last || last > 65535) r.expected(v, expectation);
  return {static_cast<std::uint16_t>(first), static_cast<std::uint16_t>(last)};
}

JobFile::Checkpoint read_checkpoint(const Reader& r, const Value& v) {
  const Fields f = r.fields(v, {"path", "every"});
  JobFile::Checkpoint c;
  const Value* path = find(f, "path");
  if (!path) {
    r.fail(Value{v.node, join(v.path, "path"), v.line},
           "missing required key (expected the checkpoint file's path, a non-empty string)");
  }
  c.path = r.string(*path);
  if (const Value* every = find(f, "every")) c.every = r.integer(*every, 1, kInt64Max);
  return c;
}

JobFile::Metrics read_metrics(const Reader& r, const Value& v) {
  const Fields f = r.fields(v, {"port", "jsonl"});
  JobFile::Metrics m;
  if (const Value* port = find(f, "port")) {
    m.port = static_cast<std::uint16_t>(
        r.integer(*port, 0, 65535, "an integer in 0..65535 (0 = no metrics endpoint)"));
  }
  if (const Value* jsonl = find(f, "jsonl")) m.jsonl = r.string(*jsonl);
  return m;
}

std::vector<PolicySpec> read_policies(const Reader& r, const Value& v) {
  std::vector<PolicySpec> out;
  for (const Value& item : r.items(v, "a sequence of policies ({name, params})")) {
    const Fields f = r.fields(item, {"name", "params"});
    PolicySpec p;
    p.line = item.line;
    const Value* name = find(f, "name");
    if (!name) {
      r.fail(Value{item.node, join(item.path, "name"), item.line},
             "missing required key (expected the policy's name, a non-empty string)");
    }
    p.name = r.string(*name);
    if (const Value* params = find(f, "params")) {
      if (r.kind(*params) != Kind::mapping) r.expected(*params, "a mapping of parameters");
      p.params = r.to_json(*params);
    }
    out.push_back(std::move(p));
  }
  return out;
}

/// Reads the keys of the top-level mapping `root` into `job`.
void read_root(const Reader& r, const Value& root, JobFile& job) {
  const Fields f =
      r.fields(root, {"job", "workers", "algorithm", "batch_size", "learning_rate", "mode",
                      "compression", "timeouts", "ports", "commit_every", "checkpoint", "metrics",
                      "autoscale", "spares", "policies", "plugins"});
  const Value* section = find(f, "job");
  if (!section) {
    r.fail(Value{root.node, "job", root.line}, kMissingJob);
  }
  const Fields job_fields = r.fields(*section, {"name"});
  if (const Value* name = find(job_fields, "name")) job.name = r.string(*name);
  if (const Value* v = find(f, "workers")) read_workers(r, *v, job.workers);
  if (const Value* v = find(f, "algorithm")) {
    const std::string expectation = "one of auto, star, ring, tree, clique, rhd, hierarchical";
    const auto a = r.kind(*v) == Kind::string ? parse_algorithm(v->node.Scalar()) : std::nullopt;
    if (!a) r.expected(*v, expectation);
    job.algorithm = *a;
  }
  if (const Value* v = find(f, "mode")) {
    const std::string text = r.string(*v, "a training mode such as sync-sgd or sma:period=4");
    try {
      job.mode = parse_mode(text);
    } catch (const std::invalid_argument& e) {
      r.fail(*v, e.what());
    }
  }
  if (const Value* v = find(f, "compression")) {
    const std::string text = r.string(*v, "a compression such as none, fp16 or topk:0.01");
    try {
      job.compression = parse_compression(text);
    } catch (const std::invalid_argument& e) {
      r.fail(*v, e.what());
    }
  }
  if (const Value* v = find(f, "batch_size")) job.batch_size = r.integer(*v, 1, 1'048'576);
  if (const Value* v = find(f, "learning_rate")) job.learning_rate = r.positive_number(*v);
  if (const Value* v = find(f, "timeouts")) read_timeouts(r, *v, job.timeouts);
  if (const Value* v = find(f, "ports")) job.ports = read_ports(r, *v);
  if (const Value* v = find(f, "commit_every")) job.commit_every = r.integer(*v, 1, kInt64Max);
  if (const Value* v = find(f, "checkpoint")) job.checkpoint = read_checkpoint(r, *v);
  if (const Value* v = find(f, "metrics")) job.metrics = read_metrics(r, *v);
  if (const Value* v = find(f, "autoscale")) {
    if (r.kind(*v) != Kind::mapping) {
      r.expected(*v, "a mapping {min, max, target, cooldown_s, per_host}");
    }
    std::string why;
    job.autoscale = parse_autoscale(r.to_json(*v), why);
    if (!job.autoscale) r.fail(*v, why);
    if (job.autoscale->max && *job.autoscale->max > job.workers.max) {
      r.fail(*v, "max " + std::to_string(*job.autoscale->max) + " is greater than workers.max " +
                     std::to_string(job.workers.max));
    }
  }
  if (const Value* v = find(f, "spares")) job.spares = r.integer(*v, 0, 1024);
  if (const Value* v = find(f, "policies")) job.policies = read_policies(r, *v);
  if (const Value* v = find(f, "plugins")) {
    for (const Value& item : r.items(*v, "a sequence of shared-library paths")) {
      job.plugins.push_back(r.string(item, "a shared-library path (a non-empty string)"));
    }
  }
}

}  // namespace

namespace detail {

JobFile read_job_document(const YAML::Node& root, const std::string& source_name) {
  const Reader r(source_name);
  // The top level has no key path; its errors name the file and line only.
  const Value top{root, "", line_of(root, 1)};
  if (r.kind(top) == Kind::null) {  // empty, or comments only
    r.fail(Value{root, "job", 1}, kMissingJob);
  }
  if (r.kind(top) != Kind::mapping) {
    r.expected(top, "a mapping of the job file's keys (job, workers, algorithm, ...)");
  }
  JobFile job;
  job.source = source_name;
  read_root(r, top, job);
  return job;
}

}  // namespace detail
}  // namespace kf
