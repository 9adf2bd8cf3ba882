// SPDX-License-Identifier: Apache-2.0
// An HTTP/1.1 endpoint for a MetricsRegistry, for Prometheus to scrape:
//   GET /metrics  200, text/plain; version=0.0.4 (to_prometheus_text)
//   GET /healthz  200, "ok"
//   other paths 404; other methods on these two paths 405 (HEAD is answered like GET).
// It serves from a background thread ("kf-metrics") with an io_context of its own, not the
// runtime's: the monitor sits below the runtime (docs/design.md, "Parts and folders"), and a slow
// scraper must never delay the I/O thread that carries the collectives. Asio and Beast stay in
// metrics_server.cpp.
// Ownership: the server keeps a reference to the registry, which must outlive it.
// Thread-safety: port() and address() from any thread; construct and destroy on one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kf/monitor/metrics.hpp"

namespace kf::monitor {

struct MetricsServerOptions {
  std::string host = "127.0.0.1";  ///< a numeric address or a name; "0.0.0.0" for every IPv4
  std::uint16_t port = 0;          ///< 0: the kernel picks a free port (see port())
  std::chrono::milliseconds idle_timeout{30'000};  ///< reading a request, or idle keep-alive
  /// Open connections, at most. One more closes the oldest, so that clients that connect and
  /// stay idle can neither use up the worker's descriptors (its peers' connections need them)
  /// nor keep the next scrape out.
  std::size_t max_connections = 64;
};

class MetricsServer {
 public:
  /// Binds and listens on host:port, then serves from a new thread until destroyed.
  /// Throws: std::invalid_argument when the host does not resolve; std::system_error naming
  /// HOST:PORT when the address cannot be bound (the port is taken, for example).
  explicit MetricsServer(const MetricsRegistry& registry, MetricsServerOptions options = {});
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  /// Stops the thread and closes the listening socket and every connection; a scrape in
  /// progress is dropped.
  ~MetricsServer();

  /// The port it listens on: the kernel's choice when options.port was 0.
  std::uint16_t port() const noexcept;
  /// "HOST:PORT" it listens on ("[::1]:9100" for IPv6), with the real port.
  const std::string& address() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kf::monitor
