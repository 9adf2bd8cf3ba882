// SPDX-License-Identifier: Apache-2.0
// The only translation unit of the config server that includes Asio and Beast.
#include "kf-config-server/lib/http_server.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <exception>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "kf/common/fd.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/request_signature.hpp"

namespace kf::config_server {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr auto kAsTuple = asio::as_tuple(asio::use_awaitable);
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

std::string format_endpoint(const tcp::endpoint& e) {
  const auto a = e.address();
  const std::string host = a.is_v6() ? "[" + a.to_string() + "]" : a.to_string();
  return host + ":" + std::to_string(e.port());
}

Response error_response(int status, const std::string& why) {
  return Response{
      status,
      nlohmann::json{{"error", why}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      "application/json",
      {}};
}

// Completion of a spawned coroutine: an exception escaping one is a bug in this file, logged.
void log_exception(std::exception_ptr e) noexcept {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    KF_LOG(err, "config-server", "connection task failed: {}", ex.what());
  } catch (...) {
    KF_LOG(err, "config-server", "connection task failed with an unknown exception");
  }
}

using RequestParser = http::request_parser<http::string_body>;

// What an answer is bound to: the request's method and target, its signature (a mutation's) and
// its nonce header (a read's).
struct AnswerTo {
  std::string method;
  std::string target;
  std::string authorization;
  std::string nonce;
};

template <class Fields>
AnswerTo answer_to(const http::request_header<Fields>& req) {
  return AnswerTo{std::string(req.method_string()), std::string(req.target()),
                  std::string(req[http::field::authorization]), std::string(req[kNonceHeader])};
}

// Reads a request's header into a new `parser`. The bytes of each read are put, with the
// header's earlier bytes, to a fresh parser, so that what the header is found to be (whole,
// malformed, or not yet whole) depends on its bytes alone and not on how they were split into
// reads. Beast's parser, fed read by read, looks at a header's lines before its end only
// within the read that brought them; after a read that ended without the end it waits for the
// end, and can miss an end that straddles that read, so a malformed header got its 400 or no
// answer by chance. A header is at most max_header_bytes, so parsing it again per read costs
// little. Without an error, `parser` holds the header and `buffer` the bytes after it.
asio::awaitable<beast::error_code> async_read_head(beast::tcp_stream& stream,
                                                   beast::flat_buffer& buffer,
                                                   std::optional<RequestParser>& parser,
                                                   const ServerOptions& options) {
  for (;;) {
    parser.emplace();
    parser->header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
    parser->body_limit(options.max_body_bytes);
    if (buffer.size() > 0) {
      beast::error_code ec;
      const std::size_t used = parser->put(buffer.data(), ec);  // stops after the header
      if (!ec && parser->is_header_done()) {
        buffer.consume(used);
        co_return ec;
      }
      if (ec && ec != http::error::need_more) co_return ec;
    }
    const std::size_t room = std::max<std::size_t>(512, options.max_header_bytes);
    auto [ec, n] = co_await stream.async_read_some(buffer.prepare(room), kAsTuple);
    buffer.commit(n);
    if (ec == asio::error::eof) {
      co_return buffer.size() == 0 ? http::error::end_of_stream : http::error::partial_message;
    }
    if (ec) co_return ec;
  }
}

// Serves connections for one Service. Thread-safety: I/O thread only (one-threaded io_context).
class Server {
 public:
  Server(Service& service, const ServerOptions& options) : service_(service), options_(options) {}

  asio::awaitable<void> async_accept(tcp::acceptor& acceptor);
  // Serves one accepted connection (what async_accept does with each, caps aside).
  asio::awaitable<void> async_serve(tcp::socket socket, std::string source) {
    connections_.add(source);
    co_await async_session(std::move(socket), std::move(source));
  }

 private:
  // How many of something (connections, long-polls) are open, in all and by address.
  struct Count {
    std::size_t all = 0;
    std::map<std::string, std::size_t> by_source;
    // Why one more from `source` would pass a cap, or "" when it would not.
    std::string refusal(const std::string& source, std::size_t max_all, std::size_t max_source,
                        const char* what) const {
      if (all >= max_all) return std::to_string(all) + " " + what + " are open (the limit)";
      const auto it = by_source.find(source);
      if (it != by_source.end() && it->second >= max_source) {
        return std::to_string(it->second) + " " + what + " from " + source +
               " are open (the limit)";
      }
      return {};
    }
    void add(const std::string& source) {
      ++all;
      ++by_source[source];
    }
    void remove(const std::string& source) {
      --all;
      if (auto it = by_source.find(source); it != by_source.end() && --it->second == 0) {
        by_source.erase(it);
      }
    }
  };

  asio::awaitable<void> async_session(tcp::socket socket, std::string source);
  asio::awaitable<void> async_refuse(tcp::socket socket, std::string why);
  asio::awaitable<Response> async_handle(const Request& request, const std::string& source);
  // `head`: the answer to a HEAD request, which states the length of its body without it.
  // `to`: the request answered, when its head was read: the answer then carries the service's
  // clock for a signed request (X-KF-Time) and its MAC for a request with a nonce (X-KF-Answer).
  asio::awaitable<beast::error_code> async_write(beast::tcp_stream& stream, const Response& r,
                                                 unsigned version, bool keep_alive,
                                                 bool head = false, const AnswerTo* to = nullptr);
  void on_change() noexcept;

  Service& service_;
  const ServerOptions& options_;
  std::set<asio::steady_timer*> waiters_;  // long-polls waiting for the next version
  Count connections_;
  Count watches_;
  LogLimiter refusals_log_{20, std::chrono::seconds(10)};
};

asio::awaitable<void> Server::async_accept(tcp::acceptor& acceptor) {
  asio::steady_timer retry(acceptor.get_executor());
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kAsTuple);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) {
      // Out of descriptors, for example: wait a little instead of spinning.
      KF_LOG(warn, "config-server", "accept failed: {}", ec.message());
      retry.expires_after(kAcceptRetry);
      co_await retry.async_wait(kAsTuple);
      continue;
    }
    kf::set_close_on_exec(socket.native_handle());
    beast::error_code rec;
    const auto remote = socket.remote_endpoint(rec);
    std::string source = rec ? std::string("an unknown address") : remote.address().to_string();
    if (auto why = connections_.refusal(source, options_.max_connections,
                                        options_.max_connections_per_source, "connections");
        !why.empty()) {
      asio::co_spawn(acceptor.get_executor(), async_refuse(std::move(socket), std::move(why)),
                     log_exception);
      continue;
    }
    connections_.add(source);
    asio::co_spawn(acceptor.get_executor(), async_session(std::move(socket), std::move(source)),
                   log_exception);
  }
}

// A connection past a cap: a 503 saying which, then closed.
asio::awaitable<void> Server::async_refuse(tcp::socket socket, std::string why) {
  std::uint64_t left_out = 0;
  if (refusals_log_.allow(left_out)) {
    KF_LOG(warn, "config-server", "refused a connection: {}{}", why,
           left_out > 0 ? " (" + std::to_string(left_out) + " more such lines were left out)" : "");
  }
  beast::tcp_stream stream(std::move(socket));
  co_await async_write(stream, error_response(503, why), 11, false);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.close();
}

asio::awaitable<void> Server::async_session(tcp::socket socket, std::string source) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    std::optional<RequestParser> read;
    stream.expires_after(options_.idle_timeout);  // deadline for the whole request
    beast::error_code ec = co_await async_read_head(stream, buffer, read, options_);
    RequestParser& parser = *read;
    std::size_t n = 0;
    const bool reads =
        parser.get().method() == http::verb::get || parser.get().method() == http::verb::head;
    if (!ec && reads && (parser.chunked() || parser.content_length().value_or(0) > 0)) {
      // Nobody needs to send a body with a read, and nobody may make the server take one in
      // (a long-poll would hold it for the whole wait): refused from the header, unread.
      const AnswerTo to = answer_to(parser.get());
      co_await async_write(stream, error_response(400, "a GET or HEAD request may not have a body"),
                           parser.get().version(), false, parser.get().method() == http::verb::head,
                           &to);
      break;
    }
    if (!ec && !reads) {
      // A mutation: its credentials are looked at before its body is read (the signature itself
      // covers the body and is checked after), so that nobody without them gets the server to
      // take in a body.
      const std::string auth(parser.get()[http::field::authorization]);
      const std::string before_start = service_.signed_before_start(auth);
      const std::string why =
          before_start.empty() ? service_.unauthorized_before_body(auth) : before_start;
      if (!why.empty()) {
        const AnswerTo to = answer_to(parser.get());
        co_await async_write(stream, error_response(before_start.empty() ? 401 : 503, why),
                             parser.get().version(), false, false, &to);
        break;
      }
    }
    if (!ec && parser.get()[http::field::expect] == "100-continue") {
      http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
      std::tie(ec, n) = co_await http::async_write(stream, go_on, kAsTuple);
    }
    if (!ec && !parser.is_done()) {
      std::tie(ec, n) = co_await http::async_read(stream, buffer, parser, kAsTuple);
    }
    if (ec == http::error::body_limit) {
      const auto why = "body is over " + std::to_string(options_.max_body_bytes) + " bytes";
      const AnswerTo to = answer_to(parser.get());
      co_await async_write(stream, error_response(413, why), 11, false, false, &to);
      break;
    }
    if (ec && ec != http::error::end_of_stream && ec != http::error::partial_message &&
        ec.category() == http::make_error_code(http::error::bad_target).category()) {
      const AnswerTo to = answer_to(parser.get());
      co_await async_write(stream, error_response(400, "bad request: " + ec.message()), 11, false,
                           false, &to);
      break;
    }
    if (ec) break;  // closed by the client, timed out or reset
    const auto& req = parser.get();
    const Request request{std::string(req.method_string()), std::string(req.target()),
                          std::string(req[http::field::authorization]), req.body()};
    const bool keep_alive = req.keep_alive();
    const unsigned version = req.version();
    const bool head = req.method() == http::verb::head;
    const AnswerTo to = answer_to(req);
    const Response response = co_await async_handle(request, source);
    if (co_await async_write(stream, response, version, keep_alive, head, &to) || !keep_alive) {
      break;
    }
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  stream.close();
  connections_.remove(source);
}

asio::awaitable<Response> Server::async_handle(const Request& request, const std::string& source) {
  if (service_.watch_after(request)) {
    if (auto why = watches_.refusal(source, options_.max_watches, options_.max_watches_per_source,
                                    "long-polls");
        !why.empty()) {
      co_return error_response(503, why);
    }
    // on_change() cancels the wait; a timeout answers with the unchanged document.
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(options_.watch_timeout);
    waiters_.insert(&timer);
    watches_.add(source);
    co_await timer.async_wait(kAsTuple);
    watches_.remove(source);
    waiters_.erase(&timer);
  }
  const auto before = service_.version();
  Response response = service_.handle(request);
  if (service_.version() != before) on_change();
  co_return response;
}

asio::awaitable<beast::error_code> Server::async_write(beast::tcp_stream& stream, const Response& r,
                                                       unsigned version, bool keep_alive, bool head,
                                                       const AnswerTo* to) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "kf-config-server");
  res.set(http::field::content_type, r.content_type);
  res.set(http::field::cache_control, "no-store");
  res.body() = r.body + "\n";
  if (to != nullptr) {
    // The clock signatures are checked against, for the client of a signed request to sign in
    // the service's time should its own clock be off (docs/config-server.md).
    const std::string time_proof = service_.time_proof(to->authorization);
    if (!time_proof.empty()) res.set(kServiceTimeHeader, time_proof);
    // The answer's MAC, bound to the request's nonce: nobody on the way can answer in the
    // service's place (docs/security.md).
    const std::string nonce = service_.nonce_of(to->authorization, to->nonce);
    if (!nonce.empty()) {
      res.set(kAnswerHeader, service_.answer_mac(to->method, to->target, nonce,
                                                 static_cast<unsigned>(r.status), res.body()));
    }
  }
  if (!r.allow.empty()) res.set(http::field::allow, r.allow);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  if (head) res.body().clear();  // Content-Length stays that of the body left out
  stream.expires_after(options_.idle_timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kAsTuple);
  co_return ec;
}

void Server::on_change() noexcept {
  // cancel() only queues the waiters' completions, so waiters_ does not change underfoot.
  for (auto* timer : waiters_) timer->cancel();
}

tcp::endpoint resolve(asio::io_context& ioc, const ListenAddress& listen) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  const auto results =
      resolver.resolve(listen.host, std::to_string(listen.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    throw std::invalid_argument("--listen host '" + listen.host +
                                "' does not resolve: " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

struct HttpServer::Impl {
  Impl(Service& service, ServerOptions server_options)
      : options(std::move(server_options)), acceptor(ioc), server(service, options) {}

  ServerOptions options;  // before server, which keeps a reference
  asio::io_context ioc{1};
  tcp::acceptor acceptor;
  Server server;
  std::string address;
};

namespace {

// The connection caps, lowered where the process may not open that many descriptors: kReserve
// stay free for the state file (every change opens its log) and the listener, so that clients
// that fill the caps get 503s rather than making changes fail to be written.
ServerOptions within_descriptor_limit(ServerOptions o) {
  constexpr std::size_t kReserve = 64;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return o;
  const auto most = static_cast<std::size_t>(limit.rlim_cur);
  const std::size_t room = most > 2 * kReserve ? most - kReserve : most / 2;
  if (o.max_connections > room) {
    KF_LOG(warn, "config-server",
           "at most {} connections (not {}): this process may open {} descriptors "
           "(RLIMIT_NOFILE) and keeps {} for its state file",
           room, o.max_connections, most, most - room);
    o.max_connections = room;
  }
  o.max_connections_per_source = std::min(o.max_connections_per_source, o.max_connections);
  o.max_watches = std::min(o.max_watches, o.max_connections);
  o.max_watches_per_source = std::min(o.max_watches_per_source, o.max_watches);
  return o;
}

}  // namespace

HttpServer::HttpServer(Service& service, ServerOptions options)
    : impl_(std::make_unique<Impl>(service, within_descriptor_limit(std::move(options)))) {
  const tcp::endpoint endpoint = resolve(impl_->ioc, impl_->options.listen);
  auto& acceptor = impl_->acceptor;
  try {
    acceptor.open(endpoint.protocol());
    kf::set_close_on_exec(acceptor.native_handle());
    acceptor.set_option(asio::socket_base::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen();
  } catch (const boost::system::system_error& e) {  // what Asio throws (not a std one)
    throw std::system_error(e.code(), "cannot listen on " + format_endpoint(endpoint));
  }
  impl_->address = format_endpoint(acceptor.local_endpoint());
  asio::co_spawn(impl_->ioc, impl_->server.async_accept(acceptor), log_exception);
}

// Members go in reverse order: the io_context is destroyed after the acceptor and the Server, and
// the pending sessions and long-polls it still holds are destroyed with it, closing their sockets.
HttpServer::~HttpServer() = default;

const std::string& HttpServer::address() const noexcept { return impl_->address; }

void HttpServer::run() { impl_->ioc.run(); }

void HttpServer::stop() noexcept { impl_->ioc.stop(); }

std::string serve_bytes(Service& service, const ServerOptions& options, std::string_view input) {
  asio::io_context ioc{1};
  tcp::socket client(ioc);
  tcp::socket accepted(ioc);
  beast::error_code ec;
  tcp::acceptor acceptor(ioc);
  // A signal (a fuzzer's timer) may interrupt the blocking calls: they are tried again.
  const auto interrupted = [&] { return ec == asio::error::interrupted; };
  acceptor.open(tcp::v4(), ec);
  if (!ec) acceptor.bind(tcp::endpoint(asio::ip::address_v4::loopback(), 0), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) {
    const auto to = acceptor.local_endpoint(ec);
    while (!ec) {
      beast::error_code ignored;
      client.close(ignored);  // a connect cut short by a signal goes on in the kernel
      client.connect(to, ec);
      if (!interrupted()) break;
      ec = {};
    }
  }
  if (!ec) {
    // The connection to serve is the client's: a connect cut short by a signal and tried again
    // may have made an earlier one in the kernel, which would be accepted first and leave the
    // client's unanswered (the fuzzing suite hung on it once). Such strays are closed.
    const auto mine = client.local_endpoint(ec);
    while (!ec) {
      accepted = acceptor.accept(ec);
      if (interrupted()) {
        ec = {};
        continue;
      }
      if (ec) break;
      beast::error_code peer_ec;
      if (accepted.remote_endpoint(peer_ec) == mine && !peer_ec) break;
      accepted.close(peer_ec);
    }
  }
  if (ec) throw std::system_error(ec, "serve_bytes: no loopback connection");
  Server server(service, options);
  asio::co_spawn(ioc, server.async_serve(std::move(accepted), "127.0.0.1"), log_exception);
  std::string output;
  auto talk = [&]() -> asio::awaitable<void> {
    // Written while the server reads and answers: neither side waits for the other to finish.
    // A write cut short (the server closed first) still leaves its answers to read.
    (void)co_await asio::async_write(client, asio::buffer(input), kAsTuple);
    beast::error_code ignored;
    client.shutdown(tcp::socket::shutdown_send, ignored);
    char buf[4096];
    for (;;) {
      auto [read_ec, n] = co_await client.async_read_some(asio::buffer(buf), kAsTuple);
      output.append(buf, n);
      if (read_ec) break;
    }
  };
  asio::co_spawn(ioc, talk(), log_exception);  // `talk` outlives the run below
  ioc.run();
  return output;
}

void run_server(Service& service, const ServerOptions& options) {
  HttpServer server(service, options);
  asio::signal_set signals(server.impl_->ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const beast::error_code& ec, int signal) {
    if (ec) return;
    KF_LOG(info, "config-server", "signal {}: stopping", signal);
    server.stop();
  });
  if (options.on_listening) options.on_listening(server.address());
  server.run();
}

}  // namespace kf::config_server
