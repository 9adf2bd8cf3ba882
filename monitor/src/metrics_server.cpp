// SPDX-License-Identifier: Apache-2.0
// The only translation unit of the monitor that includes Asio and Beast.
#include "kf/monitor/metrics_server.hpp"

#include <pthread.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <exception>
#include <list>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "kf/common/fd.hpp"
#include "kf/common/log.hpp"
#include "kf/monitor/prometheus_text.hpp"

namespace kf::monitor {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kAsTuple = asio::as_tuple(asio::use_awaitable);
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
constexpr std::uint32_t kMaxHeaderBytes = 8 * 1024;
constexpr std::uint64_t kMaxBodyBytes = 64 * 1024;  // nothing here reads a body
constexpr std::string_view kTextType = "text/plain; charset=utf-8";
constexpr std::string_view kExpositionType = "text/plain; version=0.0.4; charset=utf-8";

struct Reply {
  http::status status = http::status::ok;
  std::string body;
  std::string_view content_type = kTextType;
  std::string_view allow;  // for 405
};

// GET/HEAD /metrics and /healthz; the rest is 404, or 405 for another method on a known path.
Reply route(const MetricsRegistry& registry, http::verb method, std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  const bool metrics = path == "/metrics";
  if (!metrics && path != "/healthz") {
    return {http::status::not_found, "not found; try /metrics or /healthz\n"};
  }
  if (method != http::verb::get && method != http::verb::head) {
    return {http::status::method_not_allowed, "method not allowed; use GET\n", kTextType,
            "GET, HEAD"};
  }
  if (!metrics) return {http::status::ok, "ok\n"};
  return {http::status::ok, to_prometheus_text(registry), kExpositionType};
}

std::string format_endpoint(const tcp::endpoint& e) {
  const auto a = e.address();
  const std::string host = a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
  return host + ":" + std::to_string(e.port());
}

// Completion of a spawned coroutine: an exception escaping one is a bug in this file, logged.
void log_exception(std::exception_ptr e) noexcept {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    KF_LOG(err, "metrics", "metrics server task failed: {}", ex.what());
  } catch (...) {
    KF_LOG(err, "metrics", "metrics server task failed with an unknown exception");
  }
}

asio::awaitable<beast::error_code> async_reply(beast::tcp_stream& stream, Reply reply,
                                               unsigned version, bool keep_alive, bool head) {
  http::response<http::string_body> res{reply.status, version};
  res.set(http::field::server, "kf-metrics");
  res.set(http::field::content_type, reply.content_type);
  if (!reply.allow.empty()) res.set(http::field::allow, reply.allow);
  res.keep_alive(keep_alive);
  res.body() = std::move(reply.body);
  res.prepare_payload();
  if (head) res.body().clear();  // Content-Length stays that of the GET answer
  auto [ec, n] = co_await http::async_write(stream, res, kAsTuple);
  co_return ec;
}

// The open connections, oldest first, and how many of them are not being closed already.
// Thread-safety: the server's thread only.
struct Open {
  struct Entry {
    beast::tcp_stream* stream;
    bool closing = false;
  };
  std::list<Entry> list;
  std::size_t active = 0;

  // Closes the oldest connection not closing already; its session ends (and leaves the list)
  // when its pending read or write completes.
  void close_oldest() {
    for (auto& e : list) {
      if (e.closing) continue;
      e.closing = true;
      --active;
      beast::error_code ignored;
      e.stream->socket().shutdown(tcp::socket::shutdown_both, ignored);
      e.stream->socket().close(ignored);
      return;
    }
  }
};

// One connection: requests in turn (keep-alive) until the client closes, a read times out or a
// request is malformed, or the server closes it for a newer one. Thread-safety: the server's
// thread only.
asio::awaitable<void> async_session(tcp::socket socket, const MetricsRegistry& registry,
                                    std::chrono::milliseconds idle_timeout, Open& open) {
  beast::tcp_stream stream(std::move(socket));
  const auto entry = open.list.insert(open.list.end(), Open::Entry{&stream});
  ++open.active;
  struct Leave {
    Open& open;
    std::list<Open::Entry>::iterator entry;
    ~Leave() {
      if (!entry->closing) --open.active;
      open.list.erase(entry);
    }
  } leave{open, entry};
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(kMaxBodyBytes);
    stream.expires_after(idle_timeout);  // for the whole request, and the write after it
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, kAsTuple);
    if (ec == http::error::body_limit) {
      co_await async_reply(stream, {http::status::payload_too_large, "body too large\n"}, 11, false,
                           false);
      break;
    }
    if (ec && ec != http::error::end_of_stream && ec != http::error::partial_message &&
        ec.category() == http::make_error_code(http::error::bad_target).category()) {
      co_await async_reply(stream,
                           {http::status::bad_request, "bad request: " + ec.message() + "\n"}, 11,
                           false, false);
      break;
    }
    if (ec) break;  // closed by the client, timed out or reset
    const auto& req = parser.get();
    const bool keep_alive = req.keep_alive();
    const bool head = req.method() == http::verb::head;
    Reply reply = route(registry, req.method(), req.target());
    if (co_await async_reply(stream, std::move(reply), req.version(), keep_alive, head) ||
        !keep_alive) {
      break;
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.close();
}

asio::awaitable<void> async_accept(tcp::acceptor& acceptor, const MetricsRegistry& registry,
                                   MetricsServerOptions options, Open& open) {
  asio::steady_timer retry(acceptor.get_executor());
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kAsTuple);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) {
      // Out of descriptors, for example: wait a little instead of spinning.
      KF_LOG(warn, "metrics", "accept failed: {}", ec.message());
      retry.expires_after(kAcceptRetry);
      co_await retry.async_wait(kAsTuple);
      continue;
    }
    set_close_on_exec(socket.native_handle());
    if (open.active >= std::max<std::size_t>(options.max_connections, 1)) open.close_oldest();
    asio::co_spawn(acceptor.get_executor(),
                   async_session(std::move(socket), registry, options.idle_timeout, open),
                   log_exception);
  }
}

tcp::endpoint resolve(asio::io_context& ioc, const MetricsServerOptions& options) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  const auto results =
      resolver.resolve(options.host, std::to_string(options.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    throw std::invalid_argument("metrics server host '" + options.host +
                                "' does not resolve: " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

struct MetricsServer::Impl {
  Impl(const MetricsRegistry& r, MetricsServerOptions o)
      : registry(r), options(std::move(o)), acceptor(ioc) {}

  const MetricsRegistry& registry;
  MetricsServerOptions options;
  // Before ioc: the sessions that ioc destroys with itself leave this list as they go.
  Open open;
  asio::io_context ioc{1};
  tcp::acceptor acceptor;
  std::string address;
  std::uint16_t port = 0;
  std::thread thread;  // runs ioc; joined by ~MetricsServer before the members go
};

MetricsServer::MetricsServer(const MetricsRegistry& registry, MetricsServerOptions options)
    : impl_(std::make_unique<Impl>(registry, std::move(options))) {
  const tcp::endpoint endpoint = resolve(impl_->ioc, impl_->options);
  auto& acceptor = impl_->acceptor;
  // The error_code forms: Boost's own system_error is not a std::system_error.
  beast::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) set_close_on_exec(acceptor.native_handle());
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::system_error(ec, "metrics server cannot listen on " + format_endpoint(endpoint));
  }
  impl_->port = acceptor.local_endpoint().port();
  impl_->address = format_endpoint(acceptor.local_endpoint());
  asio::co_spawn(impl_->ioc, async_accept(acceptor, impl_->registry, impl_->options, impl_->open),
                 log_exception);
  impl_->thread = std::thread([impl = impl_.get()] {
    ::pthread_setname_np(::pthread_self(), "kf-metrics");
    try {
      impl->ioc.run();
    } catch (const std::exception& e) {
      KF_LOG(err, "metrics", "metrics server on {} stopped: {}", impl->address, e.what());
    }
  });
}

// After the thread is joined the members go in reverse order: the acceptor closes, then the
// io_context destroys the sessions it still holds, closing their sockets.
MetricsServer::~MetricsServer() {
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t MetricsServer::port() const noexcept { return impl_->port; }

const std::string& MetricsServer::address() const noexcept { return impl_->address; }

}  // namespace kf::monitor
