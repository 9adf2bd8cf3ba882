// SPDX-License-Identifier: Apache-2.0
// The --listen argument: HOST:PORT where PORT may be 0 (any free port). Thread-safety: value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kf::config_server {

struct ListenAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;

  /// Parses "HOST:PORT" ("[::1]:PORT" for IPv6); HOST is a name or an address, of letters,
  /// digits and ". - _ : %". Throws: std::invalid_argument naming what is wrong.
  static ListenAddress parse(std::string_view text);
};

}  // namespace kf::config_server
