// SPDX-License-Identifier: Apache-2.0
// The HTTP/1.1 front of the config service (Boost.Beast, C++20 coroutines, one I/O thread):
// accepts connections, reads each request under a deadline, hands it to a Service and writes the
// answer; a long-poll waits on a timer that any change of the cluster version cancels. Asio stays
// in http_server.cpp. Thread-safety: run_server() owns its io_context and runs it on the calling
// thread; the Service is used from that thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "kf-config-server/lib/listen_address.hpp"
#include "kf-config-server/lib/service.hpp"

namespace kf::config_server {

struct ServerOptions {
  ListenAddress listen;
  std::chrono::milliseconds watch_timeout{25'000};    ///< a long-poll answers after this at most
  std::chrono::milliseconds idle_timeout{30'000};     ///< reading one request, or idle keep-alive
  std::size_t max_header_bytes = 16 * 1024;           ///< larger request heads get 400
  std::size_t max_body_bytes = std::size_t{1} << 20;  ///< larger bodies get 413
  /// Called once with "HOST:PORT" after the socket is listening (the port resolved when 0).
  std::function<void(const std::string&)> on_listening;
};

/// Serves `service` until SIGINT or SIGTERM. Every accepted change is already in the state file
/// when its answer is written, so stopping needs no flush.
/// Throws: std::invalid_argument when the listen host does not resolve; std::system_error when
/// the address cannot be bound.
void run_server(Service& service, const ServerOptions& options);

}  // namespace kf::config_server
