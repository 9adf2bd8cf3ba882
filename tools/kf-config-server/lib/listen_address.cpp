// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/listen_address.hpp"

#include <charconv>
#include <stdexcept>

#include "kf/common/host.hpp"

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
  // A host name or an IP address: brackets only around all of it (removed above).
  if (const std::string why = host_problem(host); !why.empty()) {
    throw std::invalid_argument("--listen '" + std::string(text) + "' has " + why);
  }
  return ListenAddress{std::string(host), static_cast<std::uint16_t>(port)};
}

}  // namespace kf::config_server
