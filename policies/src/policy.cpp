// SPDX-License-Identifier: Apache-2.0
#include "kf/policies/policy.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <cmath>
#include <stdexcept>

#include "kf/cluster/cluster.hpp"
#include "kf/coll/types.hpp"
#include "kf/policies/training_spec.hpp"

namespace kf {

// ---- PolicyInputs -----------------------------------------------------------------------------

nlohmann::json PolicyInputs::to_json() const {
  nlohmann::json j = {{"step", step},       {"epoch", epoch},       {"workers", workers},
                      {"version", version}, {"settings", settings}, {"metrics", metrics}};
  if (!speeds.empty()) {
    j["speeds"] = nlohmann::json::array();
    for (const auto& w : speeds) {
      j["speeds"].push_back({{"worker", w.worker},
                             {"vs_fastest", w.vs_fastest},
                             {"vs_own_best", w.vs_own_best},
                             {"slow", w.slow}});
    }
  }
  return j;
}

PolicyInputs PolicyInputs::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("policy inputs: not a JSON object");
  PolicyInputs in;
  const auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key))
      throw std::invalid_argument(std::string("policy inputs: no \"") + key + "\"");
    return j.at(key);
  };
  try {
    in.step = need("step").get<std::int64_t>();
    in.epoch = j.value("epoch", std::int64_t{-1});
    in.workers = need("workers").get<int>();
    in.version = j.value("version", std::uint64_t{0});
    in.settings = j.value("settings", nlohmann::json::object());
    if (!in.settings.is_object())
      throw std::invalid_argument("policy inputs: settings is not an object");
    const nlohmann::json metrics = j.value("metrics", nlohmann::json::object());
    if (!metrics.is_object())
      throw std::invalid_argument("policy inputs: metrics is not an object");
    for (const auto& [k, v] : metrics.items()) {
      if (!v.is_number())
        throw std::invalid_argument("policy inputs: metric '" + k + "' is not a number");
      in.metrics[k] = v.get<double>();
    }
    const nlohmann::json speeds = j.value("speeds", nlohmann::json::array());
    if (!speeds.is_array()) throw std::invalid_argument("policy inputs: speeds is not an array");
    for (const auto& w : speeds) {
      const auto at = "policy inputs: speeds[" + std::to_string(in.speeds.size()) + "]";
      if (!w.is_object() || !w.contains("worker") || !w["worker"].is_string() ||
          !w.contains("vs_fastest") || !w["vs_fastest"].is_number() || !w.contains("vs_own_best") ||
          !w["vs_own_best"].is_number() || !w.contains("slow") || !w["slow"].is_boolean()) {
        throw std::invalid_argument(
            at + " needs worker (a string), vs_fastest, vs_own_best (numbers) and slow (a bool)");
      }
      in.speeds.push_back({w["worker"].get<std::string>(), w["vs_fastest"].get<double>(),
                           w["vs_own_best"].get<double>(), w["slow"].get<bool>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("policy inputs: ") + e.what());
  }
  return in;
}

// ---- Proposal ---------------------------------------------------------------------------------

void Proposal::merge(const Proposal& later) {
  if (later.workers) workers = later.workers;
  if (later.batch_size) batch_size = later.batch_size;
  if (later.learning_rate) learning_rate = later.learning_rate;
  if (later.algorithm) algorithm = later.algorithm;
  if (later.mode) mode = later.mode;
  if (later.compression) compression = later.compression;
  if (later.balance) balance = later.balance;
  for (const auto& w : later.revoke) {
    if (std::find(revoke.begin(), revoke.end(), w) == revoke.end()) revoke.push_back(w);
  }
  stop = stop || later.stop;
  reasons.insert(reasons.end(), later.reasons.begin(), later.reasons.end());
}

bool Proposal::changes_nothing(int current_workers, const nlohmann::json& settings) const {
  const auto same = [&](const char* key, const auto& v) {
    return settings.contains(key) && settings[key] == nlohmann::json(v);
  };
  if (stop || !revoke.empty()) return false;
  if (workers && *workers != current_workers) return false;
  if (balance && settings.value("balance", false) != *balance) return false;
  if (batch_size && !same("batch_size", *batch_size)) return false;
  if (learning_rate && !same("lr", *learning_rate)) return false;
  if (algorithm && !same("algorithm", *algorithm)) return false;
  // The settings may spell a mode or compression otherwise ("sma:period=1" is "sma").
  const auto same_spec = [&](const char* key, const std::string& v, auto parse) {
    if (!settings.contains(key) || !settings[key].is_string()) return false;
    try {
      return parse(settings[key].template get<std::string>()) == parse(v);
    } catch (const std::invalid_argument&) {
      return false;
    }
  };
  if (mode && !same_spec("mode", *mode, parse_mode)) {
    // An absent "mode" is sync-sgd.
    if (settings.contains("mode") || parse_mode(*mode) != ModeSpec{}) return false;
  }
  if (compression && !same_spec("compression", *compression, parse_compression)) {
    if (settings.contains("compression") || parse_compression(*compression) != CompressionSpec{}) {
      return false;
    }
  }
  return true;
}

nlohmann::json Proposal::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  if (workers) j["workers"] = *workers;
  if (batch_size) j["batch_size"] = *batch_size;
  if (learning_rate) j["lr"] = *learning_rate;
  if (algorithm) j["algorithm"] = *algorithm;
  if (mode) j["mode"] = *mode;
  if (compression) j["compression"] = *compression;
  if (balance) j["balance"] = *balance;
  if (!revoke.empty()) j["revoke"] = revoke;
  if (stop) j["stop"] = true;
  j["reasons"] = reasons;
  return j;
}

// ---- PolicyContext ----------------------------------------------------------------------------

double PolicyContext::metric(std::string_view name, double fallback) const {
  auto it = inputs_.metrics.find(std::string(name));
  return it == inputs_.metrics.end() ? fallback : it->second;
}

bool PolicyContext::has_metric(std::string_view name) const {
  return inputs_.metrics.count(std::string(name)) > 0;
}

void PolicyContext::note(std::string_view field, std::string_view why) {
  std::string r = policy_ + ": " + std::string(field);
  if (!why.empty()) r += " (" + std::string(why) + ")";
  proposal_.reasons.push_back(std::move(r));
}

void PolicyContext::resize(int n, std::string_view why) {
  if (n < 1)
    throw std::invalid_argument(policy_ + ": resize(" + std::to_string(n) + "): need >= 1 worker");
  proposal_.workers = n;
  note("workers=" + std::to_string(n), why);
}

void PolicyContext::set_batch_size(std::int64_t b, std::string_view why) {
  if (b < 1)
    throw std::invalid_argument(policy_ + ": set_batch_size(" + std::to_string(b) + "): need >= 1");
  proposal_.batch_size = b;
  note("batch_size=" + std::to_string(b), why);
}

void PolicyContext::set_learning_rate(double lr, std::string_view why) {
  if (!std::isfinite(lr) || lr <= 0) {
    throw std::invalid_argument(policy_ + ": set_learning_rate(" + std::to_string(lr) +
                                "): need a finite rate > 0");
  }
  proposal_.learning_rate = lr;
  note("lr=" + nlohmann::json(lr).dump(), why);
}

void PolicyContext::set_algorithm(std::string_view algorithm, std::string_view why) {
  if (!parse_algorithm(algorithm)) {
    throw std::invalid_argument(policy_ + ": set_algorithm('" + std::string(algorithm) +
                                "'): not one of auto, star, ring, tree, clique, rhd, hierarchical");
  }
  proposal_.algorithm = std::string(algorithm);
  note("algorithm=" + std::string(algorithm), why);
}

void PolicyContext::set_mode(std::string_view mode, std::string_view why) {
  ModeSpec spec;
  try {
    spec = parse_mode(mode);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(policy_ + ": set_mode: " + e.what());
  }
  proposal_.mode = spec.str();
  note("mode=" + *proposal_.mode, why);
}

void PolicyContext::set_compression(std::string_view compression, std::string_view why) {
  CompressionSpec spec;
  try {
    spec = parse_compression(compression);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(policy_ + ": set_compression: " + e.what());
  }
  proposal_.compression = spec.str();
  note("compression=" + *proposal_.compression, why);
}

void PolicyContext::stop(std::string_view why) {
  proposal_.stop = true;
  note("stop", why);
}

void PolicyContext::set_balance(bool on, std::string_view why) {
  proposal_.balance = on;
  note(on ? "balance=true" : "balance=false", why);
}

void PolicyContext::revoke(std::string_view worker, std::string_view why) {
  try {
    (void)Endpoint::parse(worker);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(policy_ + ": revoke('" + std::string(worker) + "'): " + e.what());
  }
  if (std::find(proposal_.revoke.begin(), proposal_.revoke.end(), worker) ==
      proposal_.revoke.end()) {
    proposal_.revoke.emplace_back(worker);
  }
  note("revoke " + std::string(worker), why);
}

// ---- PolicyRegistry ---------------------------------------------------------------------------

void PolicyRegistry::add(const std::string& name, PolicyFactory factory) {
  if (name.empty()) throw std::invalid_argument("PolicyRegistry::add: empty policy name");
  if (!factory) throw std::invalid_argument("PolicyRegistry::add('" + name + "'): no factory");
  if (!factories_.emplace(name, std::move(factory)).second) {
    throw std::invalid_argument("PolicyRegistry::add: policy '" + name + "' is registered twice");
  }
}

std::vector<std::string> PolicyRegistry::names() const {
  std::vector<std::string> v;
  for (const auto& [k, f] : factories_) v.push_back(k);
  return v;
}

std::unique_ptr<Policy> PolicyRegistry::make(const std::string& name,
                                             const nlohmann::json& params) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& [k, f] : factories_) known += (known.empty() ? "" : ", ") + k;
    throw std::invalid_argument("unknown policy '" + name +
                                "' (known: " + (known.empty() ? "none" : known) + ")");
  }
  auto p = it->second(params.is_null() ? nlohmann::json::object() : params);
  if (!p) throw std::invalid_argument("policy '" + name + "': its factory returned nothing");
  return p;
}

namespace {

// Why the plugin open at `fd` may not be loaded, or "".
std::string unsafe_plugin(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to this user or root";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return std::string("its ") + ((st.st_mode & S_IWOTH) != 0 ? "other users" : "group") +
           " may write it (chmod go-w it)";
  }
  // The directory the file really is in (symbolic links followed): who may replace it.
  char real[PATH_MAX];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(self.c_str(), real, sizeof real - 1);
  if (n <= 0) return "cannot tell which directory it is in";
  const auto dir =
      std::filesystem::path(std::string(real, static_cast<std::size_t>(n))).parent_path();
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0) return "cannot stat its directory " + dir.string();
  if ((ds.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (ds.st_mode & S_ISVTX) == 0) {
    return "its directory " + dir.string() + " may be written by " +
           ((ds.st_mode & S_IWOTH) != 0 ? "other users" : "its group") +
           ", who could replace it (chmod go-w the directory)";
  }
  return {};
}

}  // namespace

void PolicyRegistry::load_plugin(const std::string& path) {
  const auto fail = [&](const std::string& why) {
    throw std::runtime_error("policy plugin '" + path + "': " + why);
  };
  if (!std::filesystem::path(path).is_absolute()) {
    fail("the path must be absolute (a job file's plugins are taken relative to the job file)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(std::string("cannot open it: ") + std::strerror(errno));
  if (const std::string why = unsafe_plugin(fd); !why.empty()) {
    ::close(fd);
    fail("refused: " + why);
  }
  // Loaded through the descriptor that was checked, so that the file cannot be swapped between
  // the check and the load. The library stays loaded for the life of the process (its
  // policies' code lives there), and so does the descriptor: the loader knows the library by
  // this name, and a number reused by a later plugin would make it hand back this one.
  void* handle = ::dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    ::close(fd);
    fail(std::string("cannot load it: ") + (err ? err : "?"));
  }
  // A plugin refused after loading is unloaded again, before its entry point runs.
  const auto refuse = [&](const std::string& why) {
    ::dlclose(handle);
    ::close(fd);
    fail(why);
  };
  void* version = ::dlsym(handle, kKfPolicyPluginApiSymbol);
  if (version == nullptr) {
    refuse(std::string("it has no ") + kKfPolicyPluginApiSymbol +
           " (a plugin built for an older kf): define its entry point with KF_POLICY_PLUGIN "
           "(kf/policies/policy.hpp) and rebuild it");
  }
  const int api = reinterpret_cast<kf_policy_plugin_api_version_fn>(version)();
  if (api != kPolicyPluginApi) {
    refuse("it was built for plugin API " + std::to_string(api) + ", and this kf has " +
           std::to_string(kPolicyPluginApi) + ": rebuild it against this kf");
  }
  void* sym = ::dlsym(handle, kKfRegisterPoliciesSymbol);
  if (sym == nullptr) {
    refuse(std::string("it has no entry point ") + kKfRegisterPoliciesSymbol +
           " (define it with KF_POLICY_PLUGIN, see kf/policies/policy.hpp)");
  }
  auto fn = reinterpret_cast<kf_register_policies_fn>(sym);
  try {
    fn(this);
  } catch (const std::exception& e) {
    throw std::runtime_error("policy plugin '" + path + "' failed to register: " + e.what());
  }
}

}  // namespace kf
