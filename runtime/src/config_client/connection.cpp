// SPDX-License-Identifier: Apache-2.0
// The config client's requests (detail::ConfigConnection): each on a fresh connection, with a
// deadline, run by the calling thread on the client's io_context; mutations signed, in the
// service's time once it has told it; and the streamed answers that etcd's watch and lease
// keep-alive give, one JSON message per line.
#include "config_client/connection.hpp"

#include <array>
#include <cstdlib>
#include <span>
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

// The completion handler of one read or write of an AnyStream, type-erased and move-only, as
// Beast's handlers are. It runs on the stream's executor: everything here runs on the client's
// one io_context, driven by the calling thread (ConfigConnection::run).
class IoHandler {
 public:
  template <typename H>
  explicit IoHandler(H handler) : impl_(std::make_unique<Impl<H>>(std::move(handler))) {}
  void operator()(beast::error_code ec, std::size_t bytes) {
    const std::unique_ptr<Base> impl = std::move(impl_);
    impl->call(ec, bytes);
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void call(beast::error_code ec, std::size_t bytes) = 0;
  };
  template <typename H>
  struct Impl final : Base {
    explicit Impl(H&& h) : handler(std::move(h)) {}
    void call(beast::error_code ec, std::size_t bytes) override { std::move(handler)(ec, bytes); }
    H handler;
  };
  std::unique_ptr<Base> impl_;
};

// A connection's stream, plain or TLS, as one type: Beast's HTTP reads and writes are compiled
// once, over this, rather than once per kind of stream (over TLS they were most of this file's
// compile time). A read goes into the first non-empty buffer it is given and a write takes up to
// kGather of its buffers, as read_some and write_some may; Beast's operations loop for the rest.
class AnyStream {
 public:
  using executor_type = asio::any_io_executor;
  static constexpr std::size_t kGather = 16;

  AnyStream() = default;
  AnyStream(const AnyStream&) = delete;
  AnyStream& operator=(const AnyStream&) = delete;
  virtual ~AnyStream() = default;
  virtual executor_type get_executor() = 0;
  // The TCP stream underneath (the stream itself, or what TLS runs on).
  virtual beast::tcp_stream& tcp() = 0;
  // Over TLS: the client's handshake, the member's certificate checked against `host` (an
  // address against the certificate's IP names, a name also sent as SNI); plain: nothing.
  // `done` runs once, with the outcome.
  virtual void handshake(const std::string& host, std::function<void(beast::error_code)> done) = 0;

  template <typename Buffers, typename Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(beast::error_code, std::size_t)>(
        [this](auto handler, const Buffers& b) {
          asio::mutable_buffer into;
          for (auto it = asio::buffer_sequence_begin(b); it != asio::buffer_sequence_end(b); ++it) {
            const asio::mutable_buffer one(*it);
            if (one.size() > 0) {
              into = one;
              break;
            }
          }
          read_some(into, IoHandler(std::move(handler)));
        },
        token, buffers);
  }

  template <typename Buffers, typename Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(beast::error_code, std::size_t)>(
        [this](auto handler, const Buffers& b) {
          gathered_ = 0;
          for (auto it = asio::buffer_sequence_begin(b);
               it != asio::buffer_sequence_end(b) && gathered_ < kGather; ++it) {
            const asio::const_buffer one(*it);
            if (one.size() > 0) gather_[gathered_++] = one;
          }
          write_some(IoHandler(std::move(handler)));
        },
        token, buffers);
  }

 protected:
  virtual void read_some(asio::mutable_buffer into, IoHandler handler) = 0;
  // Writes from gathered(), which stays as it is until the handler runs (one write at a time).
  virtual void write_some(IoHandler handler) = 0;
  std::span<const asio::const_buffer> gathered() const noexcept {
    return {gather_.data(), gathered_};
  }

 private:
  std::array<asio::const_buffer, kGather> gather_{};
  std::size_t gathered_ = 0;
};

template <typename S>
class StreamOf final : public AnyStream {
 public:
  StreamOf(asio::io_context& ioc, asio::ssl::context* tls) : stream_(make(ioc, tls)) {}
  executor_type get_executor() override { return stream_.get_executor(); }
  beast::tcp_stream& tcp() override { return beast::get_lowest_layer(stream_); }

  void handshake(const std::string& host, std::function<void(beast::error_code)> done) override {
    if constexpr (std::is_same_v<S, TlsStream>) {
      beast::error_code not_an_address;
      asio::ip::make_address(host, not_an_address);
      if (not_an_address) SSL_set_tlsext_host_name(stream_.native_handle(), host.c_str());
      stream_.set_verify_callback(asio::ssl::host_name_verification(host));
      stream_.async_handshake(asio::ssl::stream_base::client, std::move(done));
    } else {
      done(beast::error_code{});
    }
  }

 private:
  static S make(asio::io_context& ioc, asio::ssl::context* tls) {
    if constexpr (std::is_same_v<S, TlsStream>) {
      return S(ioc, *tls);
    } else {
      return S(ioc);
    }
  }
  void read_some(asio::mutable_buffer into, IoHandler handler) override {
    stream_.async_read_some(into, std::move(handler));
  }
  void write_some(IoHandler handler) override {
    stream_.async_write_some(gathered(), std::move(handler));
  }

  S stream_;
};

// A fresh stream: over TLS with `tls`, plain TCP without.
std::unique_ptr<AnyStream> open_stream(asio::io_context& ioc, asio::ssl::context* tls) {
  if (tls != nullptr) return std::make_unique<StreamOf<TlsStream>>(ioc, tls);
  return std::make_unique<StreamOf<PlainStream>>(ioc, nullptr);
}

// One request on a fresh connection: everything it touches, shared with its handlers so that a
// request cut short (deadline, cancel) leaves nothing dangling in the io_context; its handlers run,
// harmlessly, during a later request.
struct Exchange {
  Exchange(asio::io_context& ioc, asio::ssl::context* tls)
      : resolver(ioc), stream(open_stream(ioc, tls)) {}
  tcp::resolver resolver;
  std::unique_ptr<AnyStream> stream;
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

// Resolves, connects (and over TLS shakes hands) and writes x's request, then calls `read(x)` to
// take the answer; a failure on the way ends `x` (either kind of exchange below). An address
// (what kf writes in URLs it makes) is connected to as it is: asio looks names up on a thread of
// its own, which would cost a thread per client and a hop to it per request.
template <typename X, typename Read>
void connect_and_send(const std::shared_ptr<X>& x, const Endpoint& server, Read read) {
  auto write = [x, read](beast::error_code handshake_ec) {
    if (handshake_ec) return fail(x, handshake_ec);
    http::async_write(*x->stream, x->request, [x, read](beast::error_code write_ec, std::size_t) {
      if (write_ec) return fail(x, write_ec);
      read(x);
    });
  };
  auto send = [x, write, host = server.host](beast::error_code connect_ec) {
    if (connect_ec) return fail(x, connect_ec);
    set_close_on_exec(x->stream->tcp().socket().native_handle());
    x->stream->handshake(host, write);
  };
  beast::error_code not_an_address;
  const auto address = asio::ip::make_address(server.host, not_an_address);
  if (!not_an_address) {
    x->stream->tcp().async_connect(tcp::endpoint(address, server.port), std::move(send));
    return;
  }
  x->resolver.async_resolve(
      server.host, std::to_string(server.port),
      [x, send](beast::error_code resolve_ec, tcp::resolver::results_type results) {
        if (resolve_ec) return fail(x, resolve_ec);
        x->stream->tcp().async_connect(results, [send](beast::error_code connect_ec,
                                                       const tcp::endpoint&) { send(connect_ec); });
      });
}

// Starts resolve, connect, write and read; `x->done` is set when they have ended.
void start(const std::shared_ptr<Exchange>& x, const Endpoint& server) {
  connect_and_send(x, server, [](const std::shared_ptr<Exchange>& ex) {
    http::async_read(*ex->stream, ex->buffer, ex->response,
                     [ex](beast::error_code read_ec, std::size_t) {
                       if (read_ec) return fail(ex, read_ec);
                       beast::error_code ignored;
                       ex->stream->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
                       ex->done = true;
                     });
  });
}

// A request whose answer is a stream of JSON messages, one per line (etcd's watch through its
// JSON gateway): each complete line goes to on_message, which returns true to stop reading.
struct StreamExchange {
  StreamExchange(asio::io_context& ioc, asio::ssl::context* tls)
      : resolver(ioc), stream(open_stream(ioc, tls)) {}
  tcp::resolver resolver;
  std::unique_ptr<AnyStream> stream;
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
bool take_lines(StreamExchange& x) {
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

void read_stream(const std::shared_ptr<StreamExchange>& x) {
  http::async_read_some(*x->stream, x->buffer, x->parser, [x](beast::error_code ec, std::size_t) {
    if (ec) {
      x->ec = ec;
      x->done = true;
      return;
    }
    if (take_lines(*x) || x->parser.is_done()) {
      beast::error_code ignored;
      x->stream->tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
      x->done = true;
      return;
    }
    read_stream(x);
  });
}

void start_stream(const std::shared_ptr<StreamExchange>& x, const Endpoint& server) {
  x->parser.body_limit(boost::none);  // take_lines() bounds what is held
  connect_and_send(x, server, [](const std::shared_ptr<StreamExchange>& sx) { read_stream(sx); });
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
  x->stream->tcp().expires_after(deadline);
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
  x->stream->tcp().socket().close(ignored);
  return cancelled_.load() ? beast::error_code(asio::error::operation_aborted)
                           : beast::error_code(beast::error::timeout);
}

Answer ConfigConnection::call(const Endpoint& server, const Key* control, http::verb verb,
                              const std::string& target, const json* body,
                              std::chrono::milliseconds deadline,
                              const std::string* authorization) {
  const std::string what = std::string(http::to_string(verb)) + (tls_ ? " https://" : " http://") +
                           server.str() + target;
  std::shared_ptr<Exchange> x;
  for (int attempt = 0;; ++attempt) {
    if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
    x = std::make_shared<Exchange>(ioc_, tls_.get());
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

bool ConfigConnection::stream(const Endpoint& server, const std::string& target, const json& body,
                              std::chrono::milliseconds wait,
                              const std::function<bool(const json&)>& on_message,
                              const std::string* authorization) {
  const std::string what =
      std::string(tls_ ? "POST https://" : "POST http://") + server.str() + target;
  if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
  auto x = std::make_shared<StreamExchange>(ioc_, tls_.get());
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
