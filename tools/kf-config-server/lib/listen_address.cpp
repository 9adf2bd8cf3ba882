// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/listen_address.hpp"

#include <charconv>
#include <cstdio>
#include <stdexcept>

namespace kf::config_server {

ListenAddress ListenAddress::parse(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    throw std::invalid_argument("--listen '" + std::string(text) + "' is not HOST:PORT");
  }
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto digits = text.substr(colon + 1);
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc{} || ptr != digits.data() + digits.size() || port > 65535) {
    throw std::invalid_argument("--listen '" + std::string(text) +
                                "' has no valid port (0-65535, 0 for any free port)");
  }
  if (host.empty()) throw std::invalid_argument("--listen '" + std::string(text) + "' has no host");
  // A host name or an IP address (IPv6 with a zone after '%'): brackets only around all of it.
  for (const char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
    if (!ok) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02x", static_cast<unsigned char>(c));
      throw std::invalid_argument("--listen '" + std::string(text) +
                                  "' has a host with character " + code +
                                  ", which is in no host name or IP address");
    }
  }
  return ListenAddress{std::string(host), static_cast<std::uint16_t>(port)};
}

}  // namespace kf::config_server
