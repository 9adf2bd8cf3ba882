// SPDX-License-Identifier: Apache-2.0
#include "kf/common/env.hpp"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace kf {

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string require(const char* name) {
  auto v = get(name);
  if (!v) throw std::invalid_argument(std::string(name) + " is not set (start workers with kfrun)");
  return *v;
}

}  // namespace

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read job token file '" + path + "'");
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.empty()) throw std::runtime_error("job token file '" + path + "' is empty");
  return token;
}

Env Env::from_environment() {
  Env e;
  try {
    e.self = Endpoint::parse(require(env::kSelf));
  } catch (const std::invalid_argument& ex) {
    throw std::invalid_argument(std::string(env::kSelf) + ": " + ex.what());
  }
  const std::string cluster_text = require(env::kCluster);
  try {
    e.cluster = Cluster::from_json(nlohmann::json::parse(cluster_text));
  } catch (const std::exception& ex) {
    throw std::invalid_argument(std::string(env::kCluster) + ": " + ex.what());
  }
  e.job_id = get(env::kJobId).value_or("kf");
  if (auto t = get(env::kJobToken)) {
    e.job_token = *t;
  } else if (auto f = get(env::kJobTokenFile)) {
    e.job_token = read_token_file(*f);
  } else {
    throw std::invalid_argument(std::string("neither ") + env::kJobToken + " nor " +
                                env::kJobTokenFile + " is set");
  }
  e.config_server = get(env::kConfigServer);
  e.algorithm = get(env::kAlgorithm);
  if (auto t = get(env::kTimeoutMs)) {
    long ms = 0;
    auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), ms);
    if (ec != std::errc{} || p != t->data() + t->size() || ms <= 0) {
      throw std::invalid_argument(std::string(env::kTimeoutMs) + "='" + *t +
                                  "' is not a positive number of milliseconds");
    }
    e.timeout = std::chrono::milliseconds(ms);
  }
  if (auto t = get(env::kHeartbeatMs)) {
    long ms = -1;
    auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), ms);
    if (ec != std::errc{} || p != t->data() + t->size() || ms < 0) {
      throw std::invalid_argument(std::string(env::kHeartbeatMs) + "='" + *t +
                                  "' is not a number of milliseconds (0 disables heartbeats)");
    }
    e.heartbeat_timeout = std::chrono::milliseconds(ms);
  }
  if (auto t = get(env::kSpinUs)) {
    long us = -1;
    auto [p, ec] = std::from_chars(t->data(), t->data() + t->size(), us);
    if (ec != std::errc{} || p != t->data() + t->size() || us < 0 || us > 1000000) {
      throw std::invalid_argument(std::string(env::kSpinUs) + "='" + *t +
                                  "' is not a number of microseconds in 0-1000000");
    }
    e.spin = std::chrono::microseconds(us);
  }
  return e;
}

}  // namespace kf
