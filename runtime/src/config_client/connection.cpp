// SPDX-License-Identifier: Apache-2.0
// The config client's requests (detail::ConfigConnection): each on a fresh connection, with a
// deadline, run by the calling thread on the client's io_context; mutations signed, in the
// service's time once it has told it; and the streamed answers that etcd's watch and lease
// keep-alive give, one JSON message per line.
#include "config_client/connection.hpp"

#include <cstdlib>
#include <string_view>

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <openssl/ssl.h>

#include "kf/common/fd.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/request_signature.hpp"

namespace kf::detail {

namespace {

using tcp = asio::ip::tcp;
using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;  // etcds://

template <typename S>
S make_stream(asio::io_context& ioc, asio::ssl::context* tls) {
  if constexpr (std::is_same_v<S, TlsStream>) {
    return S(ioc, *tls);
  } else {
    return S(ioc);
  }
}

// The TCP stream under `s` (itself, or what TLS runs on).
template <typename S>
beast::tcp_stream& tcp_of(S& s) {
  return beast::get_lowest_layer(s);
}

// One request on a fresh connection: everything it touches, shared with its handlers so that a
// request cut short (deadline, cancel) leaves nothing dangling in the io_context; its handlers run,
// harmlessly, during a later request.
template <typename S>
struct BasicExchange {
  BasicExchange(asio::io_context& ioc, asio::ssl::context* tls)
      : resolver(ioc), stream(make_stream<S>(ioc, tls)) {}
  tcp::resolver resolver;
  S stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response<http::string_body> response;
  beast::error_code ec;
  bool done = false;
};

// Ends `x` with `ec`.
template <typename X>
void fail(const std::shared_ptr<X>& x, beast::error_code ec) {
  x->ec = ec;
  x->done = true;
}

// Resolves, connects (and over TLS shakes hands, checking the member's certificate against the
// host it was dialled as) and writes x's request, then calls `read(x)` to take the answer; a
// failure on the way ends `x` (either kind of exchange below). An address (what kf writes in URLs
// it makes) is connected to as it is: asio looks names up on a thread of its own, which would
// cost a thread per client and a hop to it per request.
template <typename X, typename Read>
void connect_and_send(const std::shared_ptr<X>& x, const Endpoint& server, Read read) {
  auto write = [x, read] {
    http::async_write(x->stream, x->request, [x, read](beast::error_code write_ec, std::size_t) {
      if (write_ec) return fail(x, write_ec);
      read(x);
    });
  };
  auto send = [x, write, host = server.host](beast::error_code connect_ec) {
    if (connect_ec) return fail(x, connect_ec);
    set_close_on_exec(tcp_of(x->stream).socket().native_handle());
    if constexpr (std::is_same_v<std::decay_t<decltype(x->stream)>, TlsStream>) {
      beast::error_code not_an_address;
      asio::ip::make_address(host, not_an_address);
      // A name goes as SNI; an address is checked against the certificate's IP names.
      if (not_an_address) SSL_set_tlsext_host_name(x->stream.native_handle(), host.c_str());
      x->stream.set_verify_callback(asio::ssl::host_name_verification(host));
      x->stream.async_handshake(asio::ssl::stream_base::client, [x, write](beast::error_code ec) {
        if (ec) return fail(x, ec);
        write();
      });
    } else {
      write();
    }
  };
  beast::error_code not_an_address;
  const auto address = asio::ip::make_address(server.host, not_an_address);
  if (!not_an_address) {
    tcp_of(x->stream).async_connect(tcp::endpoint(address, server.port), std::move(send));
    return;
  }
  x->resolver.async_resolve(
      server.host, std::to_string(server.port),
      [x, send](beast::error_code resolve_ec, tcp::resolver::results_type results) {
        if (resolve_ec) return fail(x, resolve_ec);
        tcp_of(x->stream).async_connect(
            results,
            [send](beast::error_code connect_ec, const tcp::endpoint&) { send(connect_ec); });
      });
}

// Starts resolve, connect, write and read; `x->done` is set when they have ended.
template <typename X>
void start(const std::shared_ptr<X>& x, const Endpoint& server) {
  connect_and_send(x, server, [](const std::shared_ptr<X>& ex) {
    http::async_read(ex->stream, ex->buffer, ex->response,
                     [ex](beast::error_code read_ec, std::size_t) {
                       if (read_ec) return fail(ex, read_ec);
                       beast::error_code ignored;
                       tcp_of(ex->stream).socket().shutdown(tcp::socket::shutdown_both, ignored);
                       ex->done = true;
                     });
  });
}

// A request whose answer is a stream of JSON messages, one per line (etcd's watch through its
// JSON gateway): each complete line goes to on_message, which returns true to stop reading.
template <typename S>
struct BasicStreamExchange {
  BasicStreamExchange(asio::io_context& ioc, asio::ssl::context* tls)
      : resolver(ioc), stream(make_stream<S>(ioc, tls)) {}
  tcp::resolver resolver;
  S stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response_parser<http::string_body> parser;
  std::size_t consumed = 0;  // bytes of the body handed to on_message
  std::function<bool(const json&)> on_message;
  std::string bad_message;  // a line that is not JSON
  beast::error_code ec;
  bool done = false;
};

// A streamed message may be at most this long; a stream itself may go on for ever.
constexpr std::size_t kMaxStreamedMessage = std::size_t{64} << 20;

// Hands the complete lines of the body received so far to on_message, and drops them from the
// body, so that a long watch holds no more than the message being received. Returns true to
// stop.
template <typename X>
bool take_lines(X& x) {
  std::string& body = x.parser.get().body();
  for (;;) {
    const auto end = body.find('\n', x.consumed);
    if (end == std::string::npos) {
      body.erase(0, x.consumed);
      x.consumed = 0;
      if (body.size() > kMaxStreamedMessage) {
        x.bad_message = "(a message longer than " + std::to_string(kMaxStreamedMessage >> 20) +
                        " MiB, cut off)";
        return true;
      }
      return false;
    }
    const std::string_view line(body.data() + x.consumed, end - x.consumed);
    x.consumed = end + 1;
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
    const json m = parse_json_or_discard(line);
    if (m.is_discarded()) {
      x.bad_message = std::string(line.substr(0, 200));
      return true;
    }
    if (x.on_message(m)) return true;
  }
}

template <typename X>
void read_stream(const std::shared_ptr<X>& x) {
  http::async_read_some(x->stream, x->buffer, x->parser, [x](beast::error_code ec, std::size_t) {
    if (ec) {
      x->ec = ec;
      x->done = true;
      return;
    }
    if (take_lines(*x) || x->parser.is_done()) {
      beast::error_code ignored;
      tcp_of(x->stream).socket().shutdown(tcp::socket::shutdown_both, ignored);
      x->done = true;
      return;
    }
    read_stream(x);
  });
}

template <typename X>
void start_stream(const std::shared_ptr<X>& x, const Endpoint& server) {
  x->parser.body_limit(boost::none);  // take_lines() bounds what is held
  connect_and_send(x, server, [](const std::shared_ptr<X>& sx) { read_stream(sx); });
}

// Takes an answer of kf's service only when its X-KF-Answer MAC matches (under the job's control
// key, bound to the request's nonce): anything else did not come from the job's service. A MAC
// that does not match is what a wrong token gives (the service signs under its own key), and is
// refused as such; an answer without one (a proxy's page, another server at the address, or
// one forged on the way) is dropped as though the service had not answered. Either way whoever
// sends it can delay the job but never steer it. Throws: Error (auth_failed,
// service_unavailable).
void check_answer(const Key& control, const std::string& what, http::verb verb,
                  const std::string& target, const std::string& nonce,
                  const http::response<http::string_body>& response) {
  const unsigned status = response.result_int();
  const auto mac = response.find(kAnswerHeader);
  if (mac == response.end()) {
    throw Error(make_error_code(errc::service_unavailable),
                what + ": an answer (" + std::to_string(status) + ") with no " +
                    std::string(kAnswerHeader) +
                    " was dropped: it is not from this job's config service");
  }
  if (!answer_matches(control, mac->value(), http::to_string(verb), target, nonce, status,
                      response.body())) {
    throw Error(make_error_code(errc::auth_failed),
                what + ": the answer (" + std::to_string(status) + ") is not signed with this " +
                    "job's key: the job token differs from the config service's (or the answer " +
                    "was altered on the way)");
  }
}

}  // namespace

template <typename X>
beast::error_code ConfigConnection::run(const std::shared_ptr<X>& x,
                                        std::chrono::milliseconds deadline) {
  tcp_of(x->stream).expires_after(deadline);
  // The resolver has no deadline of its own: bound the whole run as well.
  const auto end = std::chrono::steady_clock::now() + deadline + std::chrono::milliseconds(100);
  while (!x->done) {
    // cancel() sets the flag before it stops the context, so a stop that restart() clears here
    // is seen in the flag.
    if (ioc_.stopped()) ioc_.restart();
    if (cancelled_.load()) break;
    if (ioc_.run_one_until(end) == 0 && std::chrono::steady_clock::now() >= end) break;
  }
  if (x->done) return x->ec;
  // Cut short: close what is open; its handlers complete later, on shared state.
  x->resolver.cancel();
  beast::error_code ignored;
  tcp_of(x->stream).socket().close(ignored);
  return cancelled_.load() ? beast::error_code(asio::error::operation_aborted)
                           : beast::error_code(beast::error::timeout);
}

Answer ConfigConnection::call(const Endpoint& server, const Key* control, http::verb verb,
                              const std::string& target, const json* body,
                              std::chrono::milliseconds deadline,
                              const std::string* authorization) {
  return tls_ ? call_on<TlsStream>(server, control, verb, target, body, deadline, authorization)
              : call_on<PlainStream>(server, control, verb, target, body, deadline, authorization);
}

bool ConfigConnection::stream(const Endpoint& server, const std::string& target, const json& body,
                              std::chrono::milliseconds wait,
                              const std::function<bool(const json&)>& on_message,
                              const std::string* authorization) {
  return tls_ ? stream_on<TlsStream>(server, target, body, wait, on_message, authorization)
              : stream_on<PlainStream>(server, target, body, wait, on_message, authorization);
}

template <typename S>
Answer ConfigConnection::call_on(const Endpoint& server, const Key* control, http::verb verb,
                                 const std::string& target, const json* body,
                                 std::chrono::milliseconds deadline,
                                 const std::string* authorization) {
  const std::string what = std::string(http::to_string(verb)) + (tls_ ? " https://" : " http://") +
                           server.str() + target;
  std::shared_ptr<BasicExchange<S>> x;
  for (int attempt = 0;; ++attempt) {
    if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
    x = std::make_shared<BasicExchange<S>>(ioc_, tls_.get());
    auto& req = x->request;
    req = http::request<http::string_body>{verb, target, 11};
    req.set(http::field::host, server.str());
    req.set(http::field::user_agent, "kf-config-client");
    if (body != nullptr) {
      req.set(http::field::content_type, "application/json");
      req.body() = body->dump();
    }
    if (authorization != nullptr) req.set(http::field::authorization, *authorization);
    const std::int64_t offset = offset_ms_;
    // Every request to kf's service has a fresh nonce, which its answer's MAC (and, for a
    // signed request, the service's clock) comes back bound to: a signed request's own, a
    // read's in a header of its own.
    std::string nonce;
    if (control != nullptr && verb != http::verb::get) {
      const std::string auth = sign_request(*control, std::string(http::to_string(verb)), target,
                                            req.body(), local_ms() + offset);
      std::string why;
      if (const auto sig = parse_request_signature(auth, why)) nonce = sig->nonce;
      req.set(http::field::authorization, auth);
    } else if (control != nullptr) {
      nonce = fresh_nonce();
      req.set(kNonceHeader, nonce);
    }
    req.prepare_payload();
    start(x, server);
    const beast::error_code ec = run(x, deadline);
    if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
    if (ec == beast::error::timeout) {
      throw Error(make_error_code(errc::service_unavailable),
                  what + ": cannot reach the config service: no answer within " +
                      std::to_string(deadline.count()) + " ms");
    }
    if (ec) {
      throw Error(make_error_code(errc::service_unavailable),
                  what + ": cannot reach the config service: " + ec.message());
    }
    if (control != nullptr) check_answer(*control, what, verb, target, nonce, x->response);
    // The service's clock, told in the answer to a signed request and bound to its nonce:
    // later requests are signed in the service's time.
    const auto told = x->response.find(kServiceTimeHeader);
    if (!nonce.empty() && told != x->response.end()) {
      if (const auto service_ms = read_service_time(*control, told->value(), nonce)) {
        offset_ms_ = *service_ms - local_ms();
      }
    }
    // Refused for a signature made in another time than the service's (this clock is off, or
    // jumped): once more, in the service's time.
    constexpr std::int64_t kNoticeableMs = 1000;
    if (x->response.result_int() == 401 && attempt == 0 && control != nullptr &&
        std::abs(offset_ms_ - offset) > kNoticeableMs) {
      KF_LOG(warn, "config-client",
             "{}: this process's clock is {} ms off the service's (this one less the service's): "
             "signed again in the service's time, and so from now on",
             what, -offset_ms_);
      continue;
    }
    break;
  }
  Answer a;
  a.status = x->response.result_int();
  if (!x->response.body().empty()) {
    a.body = parse_json_or_discard(x->response.body());
  }
  if ((a.status >= 200 && a.status < 300) || a.status == 409) return a;
  const std::string message = what + ": " + std::to_string(a.status) + " " + reason_of(a);
  if (a.status == 401) throw Error(make_error_code(errc::auth_failed), message);
  if (a.status == 400 || a.status == 413) {
    throw Error(make_error_code(errc::invalid_argument), message);
  }
  if (a.status >= 500) throw Error(make_error_code(errc::service_unavailable), message);
  throw Error(make_error_code(errc::protocol_error), message);
}

template <typename S>
bool ConfigConnection::stream_on(const Endpoint& server, const std::string& target,
                                 const json& body, std::chrono::milliseconds wait,
                                 const std::function<bool(const json&)>& on_message,
                                 const std::string* authorization) {
  const std::string what =
      std::string(tls_ ? "POST https://" : "POST http://") + server.str() + target;
  if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
  auto x = std::make_shared<BasicStreamExchange<S>>(ioc_, tls_.get());
  auto& req = x->request;
  req = http::request<http::string_body>{http::verb::post, target, 11};
  req.set(http::field::host, server.str());
  req.set(http::field::user_agent, "kf-config-client");
  req.set(http::field::content_type, "application/json");
  // etcd's gateway passes this on as gRPC metadata: a watch then ends with an error on a member
  // that has lost its leader (a minority in a partition) instead of staying silent.
  req.set("Grpc-Metadata-hasleader", "true");
  if (authorization != nullptr) req.set(http::field::authorization, *authorization);
  req.body() = body.dump();
  req.prepare_payload();
  bool stopped = false;
  x->on_message = [&](const json& m) { return stopped = on_message(m); };
  start_stream(x, server);
  const beast::error_code ec = run(x, wait);
  if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
  if (ec == beast::error::timeout) return false;
  if (ec && !stopped) {
    throw Error(make_error_code(errc::service_unavailable),
                what + ": cannot reach the config service: " + ec.message());
  }
  const unsigned status = x->parser.get().result_int();
  if (status < 200 || status >= 300) {
    Answer a{status, parse_json_or_discard(x->parser.get().body())};
    throw Error(make_error_code(status >= 500   ? errc::service_unavailable
                                : status == 401 ? errc::auth_failed
                                                : errc::protocol_error),
                what + ": " + std::to_string(status) + " " + reason_of(a));
  }
  if (!x->bad_message.empty()) {
    throw Error(make_error_code(errc::protocol_error),
                what + ": a streamed message is not JSON: " + x->bad_message);
  }
  return stopped;
}

std::shared_ptr<asio::ssl::context> make_tls_context(const std::string& ca_file,
                                                     const std::string& cert_file,
                                                     const std::string& key_file) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                   asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                   asio::ssl::context::no_tlsv1_1);
  ctx->set_verify_mode(asio::ssl::verify_peer);
  beast::error_code ec;
  if (ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    ctx->load_verify_file(ca_file, ec);
  }
  if (ec) {
    throw std::invalid_argument("KF_ETCD_CA_FILE: cannot load the certificate authority " +
                                (ca_file.empty() ? std::string("(the system's)") : ca_file) + ": " +
                                ec.message());
  }
  if (cert_file.empty() != key_file.empty()) {
    throw std::invalid_argument(
        "KF_ETCD_CERT_FILE and KF_ETCD_KEY_FILE go together: give both or neither");
  }
  if (!cert_file.empty()) {
    ctx->use_certificate_chain_file(cert_file, ec);
    if (ec) {
      throw std::invalid_argument("KF_ETCD_CERT_FILE: cannot load " + cert_file + ": " +
                                  ec.message());
    }
    ctx->use_private_key_file(key_file, asio::ssl::context::pem, ec);
    if (ec) {
      throw std::invalid_argument("KF_ETCD_KEY_FILE: cannot load " + key_file + ": " +
                                  ec.message());
    }
  }
  return ctx;
}

}  // namespace kf::detail
