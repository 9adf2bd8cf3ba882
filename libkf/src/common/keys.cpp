// SPDX-License-Identifier: Apache-2.0
#include "kf/common/keys.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <memory>
#include <stdexcept>

namespace kf {

namespace {

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 0xf]);
  }
  return out;
}

}  // namespace

Key derive_key(std::string_view token, KeyUse use) {
  static constexpr std::string_view kSalt = "kf job token";
  const std::string_view info = use == KeyUse::control ? "kf control v1" : "kf peers v1";
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr), &EVP_PKEY_CTX_free);
  Key key{};
  std::size_t len = key.size();
  const auto u = [](std::string_view s) {
    return reinterpret_cast<const unsigned char*>(s.data());
  };
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), u(kSalt), static_cast<int>(kSalt.size())) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), u(token), static_cast<int>(token.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), u(info), static_cast<int>(info.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), key.data(), &len) <= 0 || len != key.size()) {
    throw std::runtime_error("cannot derive a key from the job token (OpenSSL HKDF failed)");
  }
  return key;
}

std::string hmac_sha256_hex(const Key& key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  return hex(out, len);
}

std::string sha256_hex(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return hex(out, sizeof out);
}

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) != 1) {
    throw std::runtime_error("cannot generate random bytes (OpenSSL RAND_bytes failed)");
  }
  return hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

bool equal_in_constant_time(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace kf
