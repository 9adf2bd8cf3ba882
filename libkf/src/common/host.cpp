// SPDX-License-Identifier: Apache-2.0
#include "kf/common/host.hpp"

#include <cstdio>

namespace kf {

std::string host_problem(std::string_view host) {
  if (host.empty()) return "an empty host";
  for (const char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
    if (!ok) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02x", static_cast<unsigned char>(c));
      return std::string("a host with character ") + code +
             ", which is in no host name or IP address";
    }
  }
  return {};
}

}  // namespace kf
