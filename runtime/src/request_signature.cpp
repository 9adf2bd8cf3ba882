// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/request_signature.hpp"

#include <array>
#include <charconv>
#include <stdexcept>

namespace kf {

namespace {

bool is_hex(std::string_view s, std::size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string string_to_sign(std::string_view method, std::string_view target, std::int64_t unix_ms,
                           std::string_view nonce, std::string_view body) {
  std::string s(kSignatureScheme);
  s.append("\n").append(method).append("\n").append(target).append("\n");
  s.append(std::to_string(unix_ms)).append("\n").append(nonce).append("\n");
  s.append(sha256_hex(body));
  return s;
}

std::string sign_request(const Key& control, std::string_view method, std::string_view target,
                         std::string_view body, std::int64_t unix_ms) {
  const std::string nonce = random_hex(16);
  const std::string sig =
      hmac_sha256_hex(control, string_to_sign(method, target, unix_ms, nonce, body));
  return std::string(kSignatureScheme) + " ts=" + std::to_string(unix_ms) + ",nonce=" + nonce +
         ",sig=" + sig;
}

std::optional<RequestSignature> parse_request_signature(std::string_view authorization,
                                                        std::string& why) {
  const std::string prefix = std::string(kSignatureScheme) + " ";
  if (!authorization.starts_with(prefix)) {
    why = "not a " + std::string(kSignatureScheme) + " signature";
    return std::nullopt;
  }
  std::string_view rest = authorization.substr(prefix.size());
  RequestSignature s;
  bool has_ts = false;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      why = "signature field '" + std::string(item.substr(0, 40)) + "' is not NAME=VALUE";
      return std::nullopt;
    }
    const std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    if (name == "ts") {
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), s.unix_ms);
      if (ec != std::errc() || ptr != value.data() + value.size() || s.unix_ms < 0) {
        why = "signature ts is not milliseconds since 1970";
        return std::nullopt;
      }
      has_ts = true;
    } else if (name == "nonce") {
      s.nonce = std::string(value);
    } else if (name == "sig") {
      s.sig = std::string(value);
    } else {
      why = "unknown signature field '" + std::string(name.substr(0, 40)) + "'";
      return std::nullopt;
    }
  }
  if (!has_ts || !is_hex(s.nonce, 32) || !is_hex(s.sig, 64)) {
    why = "a signature needs ts, nonce (32 hex digits) and sig (64 hex digits)";
    return std::nullopt;
  }
  return s;
}

namespace {

std::string time_message(std::int64_t unix_ms, std::string_view nonce) {
  std::string m = "kf service time\n";
  m.append(std::to_string(unix_ms)).append("\n").append(nonce);
  return m;
}

}  // namespace

std::string service_time_proof(const Key& control, std::int64_t unix_ms, std::string_view nonce) {
  return std::to_string(unix_ms) + ",mac=" + hmac_sha256_hex(control, time_message(unix_ms, nonce));
}

std::optional<std::int64_t> read_service_time(const Key& control, std::string_view header,
                                              std::string_view nonce) {
  const auto comma = header.find(",mac=");
  if (comma == std::string_view::npos) return std::nullopt;
  std::int64_t ms = 0;
  const auto [ptr, ec] = std::from_chars(header.data(), header.data() + comma, ms);
  if (ec != std::errc{} || ptr != header.data() + comma || ms < 0) return std::nullopt;
  if (!equal_in_constant_time(header.substr(comma + 5),
                              hmac_sha256_hex(control, time_message(ms, nonce)))) {
    return std::nullopt;
  }
  return ms;
}

std::string fresh_nonce() { return random_hex(16); }

bool is_nonce(std::string_view nonce) noexcept { return is_hex(nonce, 32); }

namespace {

std::string answer_message(std::string_view method, std::string_view target, std::string_view nonce,
                           unsigned status, std::string_view body) {
  std::string m = "kf service answer\n";
  m.append(method).append("\n").append(target).append("\n").append(nonce).append("\n");
  m.append(std::to_string(status)).append("\n").append(sha256_hex(body));
  return m;
}

}  // namespace

std::string answer_mac(const Key& control, std::string_view method, std::string_view target,
                       std::string_view nonce, unsigned status, std::string_view body) {
  return "mac=" + hmac_sha256_hex(control, answer_message(method, target, nonce, status, body));
}

bool answer_matches(const Key& control, std::string_view header, std::string_view method,
                    std::string_view target, std::string_view nonce, unsigned status,
                    std::string_view body) {
  return equal_in_constant_time(header, answer_mac(control, method, target, nonce, status, body));
}

bool signature_matches(const Key& control, const RequestSignature& s, std::string_view method,
                       std::string_view target, std::string_view body) {
  return equal_in_constant_time(
      s.sig, hmac_sha256_hex(control, string_to_sign(method, target, s.unix_ms, s.nonce, body)));
}

}  // namespace kf
