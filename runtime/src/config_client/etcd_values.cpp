// SPDX-License-Identifier: Apache-2.0
// What etcd.cpp's backend reads and writes around its requests: the job's key prefix, the seals
// on every value kf keeps in etcd (etcd.hpp, sealed_text), and etcd's user from the environment.
#include <openssl/sha.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "config_client/etcd.hpp"
#include "kf/common/json.hpp"

namespace kf::detail {

// "/kf/" and 16 hex digits of SHA-256 of the token: every process of a job holds the token, so
// they all find the same keys, and the keys do not reveal it.
std::string prefix_for_token(const std::string& token) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "/kf/";
  for (std::size_t i = 0; i < 8; ++i) {
    out.push_back(kDigits[digest[i] >> 4]);
    out.push_back(kDigits[digest[i] & 0xf]);
  }
  return out;
}

std::string sealed_text(const Key& control, const std::string& key, const std::string& text) {
  return json{{"document", text},
              {"mac", hmac_sha256_hex(control, "kf etcd value\n" + key + "\n" + text)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sealed_document(const Key& control, const std::string& prefix, const Cluster& c) {
  return sealed_text(control, prefix + "/cluster", c.to_json().dump());
}

std::optional<std::string> unsealed_text(const Key& control, const std::string& key,
                                         const std::string& value, std::string& why) {
  const json j = parse_json_or_discard(value);
  if (!j.is_object() || !j.contains("document") || !j["document"].is_string() ||
      !j.contains("mac") || !j["mac"].is_string()) {
    why = "not a value kf sealed (no \"document\" and \"mac\")";
    return std::nullopt;
  }
  std::string text = j["document"].get<std::string>();
  if (!equal_in_constant_time(j["mac"].get<std::string>(),
                              hmac_sha256_hex(control, "kf etcd value\n" + key + "\n" + text))) {
    why = "not sealed with this job's key (written without the job token, or with another)";
    return std::nullopt;
  }
  return text;
}

void etcd_credentials_from_environment(std::string& user, std::string& password) {
  const char* u = std::getenv("KF_ETCD_USER");
  const char* f = std::getenv("KF_ETCD_PASSWORD_FILE");
  const bool has_user = u != nullptr && *u != '\0';
  const bool has_file = f != nullptr && *f != '\0';
  if (!has_user && !has_file) return;
  if (!has_user)
    throw std::invalid_argument("KF_ETCD_PASSWORD_FILE is set but KF_ETCD_USER is not");
  if (!has_file)
    throw std::invalid_argument("KF_ETCD_USER is set but KF_ETCD_PASSWORD_FILE is not");
  std::ifstream in(f);
  std::string line;
  if (!in || !std::getline(in, line)) {
    throw std::invalid_argument("KF_ETCD_PASSWORD_FILE: cannot read a password from " +
                                std::string(f));
  }
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  user = u;
  password = std::move(line);
}

}  // namespace kf::detail
