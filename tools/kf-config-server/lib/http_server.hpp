// SPDX-License-Identifier: Apache-2.0
// The HTTP/1.1 front of the config service (Boost.Beast, C++20 coroutines, one I/O thread):
// accepts connections, reads each request under a deadline, hands it to a Service and writes the
// answer; a long-poll waits on a timer that any change of the cluster version cancels. Asio stays
// in http_server.cpp. Thread-safety: run_server() and HttpServer::run() run the server's io_context
// on the calling thread, and the Service is used from that thread only; HttpServer::stop() may be
// called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kf-config-server/lib/listen_address.hpp"
#include "kf-config-server/lib/service.hpp"

namespace kf::config_server {

struct ServerOptions {
  ListenAddress listen;
  std::chrono::milliseconds watch_timeout{25'000};    ///< a long-poll answers after this at most
  std::chrono::milliseconds idle_timeout{30'000};     ///< reading one request, or idle keep-alive
  std::size_t max_header_bytes = 16 * 1024;           ///< larger request heads get 400
  std::size_t max_body_bytes = std::size_t{1} << 20;  ///< larger bodies get 413
  /// Open connections, at most: in all and from one address. A connection past either gets a
  /// 503 (which kf's clients retry after a pause, as when the service is down) and is closed.
  std::size_t max_connections = 4096;
  std::size_t max_connections_per_source = 512;
  /// Long-polls (GET /v1/cluster?watch=1) waiting at once, at most: in all and from one
  /// address. One past either is answered 503 at once.
  std::size_t max_watches = 4096;
  std::size_t max_watches_per_source = 256;
  /// Called once with "HOST:PORT" after the socket is listening (the port resolved when 0).
  /// Used by run_server(); an HttpServer tells its address() instead.
  std::function<void(const std::string&)> on_listening;
};

/// A server that is listening from construction on (so its port is known before it serves) and
/// serves from run() until stop(). This is the form a process embeds (kfrun's builtin config
/// service runs one on a thread of its own). Destroying it closes every connection, long-polls
/// included. Thread-safety: run() on one thread at a time; stop() and address() from any thread.
class HttpServer {
 public:
  /// Binds and listens on options.listen. Throws: std::invalid_argument when the listen host does
  /// not resolve; std::system_error when the address cannot be bound.
  HttpServer(Service& service, ServerOptions options);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();

  /// "HOST:PORT" it listens on, with the real port when port 0 was asked for.
  const std::string& address() const noexcept;

  /// Serves until stop() is called (returns at once if it already was).
  void run();

  /// Makes run() return; requests in progress are dropped. Safe from any thread, also before
  /// run().
  void stop() noexcept;

 private:
  friend void run_server(Service& service, const ServerOptions& options);  // adds its signal set
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Serves one connection on 127.0.0.1 whose client sends `input` and then closes its side for
/// sending; returns all the server wrote before it closed the connection. What the fuzz harness
/// drives (tests/fuzz/http_session.cpp): the session is the one every accepted connection gets.
/// Throws: std::system_error when the loopback connection cannot be made.
std::string serve_bytes(Service& service, const ServerOptions& options, std::string_view input);

/// Serves `service` until SIGINT or SIGTERM. Every accepted change is already in the state file
/// when its answer is written, so stopping needs no flush.
/// Throws: std::invalid_argument when the listen host does not resolve; std::system_error when
/// the address cannot be bound.
void run_server(Service& service, const ServerOptions& options);

}  // namespace kf::config_server
