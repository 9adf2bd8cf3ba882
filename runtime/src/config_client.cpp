// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/config_client.hpp"

#include <atomic>
#include <charconv>
#include <memory>
#include <stdexcept>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace kf {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

struct Answer {
  unsigned status = 0;
  json body;
};

// One request on a fresh connection: everything it touches, shared with its handlers so that a
// request cut short (deadline, cancel) leaves nothing dangling in the io_context; its handlers run,
// harmlessly, during a later request.
struct Exchange {
  explicit Exchange(asio::io_context& ioc) : resolver(ioc), stream(ioc) {}
  tcp::resolver resolver;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response<http::string_body> response;
  beast::error_code ec;
  bool done = false;
};

// Starts resolve, connect, write and read; `x->done` is set when they have ended.
void start(const std::shared_ptr<Exchange>& x, const Endpoint& server) {
  const auto fail = [x](beast::error_code ec) {
    x->ec = ec;
    x->done = true;
  };
  x->resolver.async_resolve(
      server.host, std::to_string(server.port),
      [x, fail](beast::error_code resolve_ec, tcp::resolver::results_type results) {
        if (resolve_ec) return fail(resolve_ec);
        x->stream.async_connect(results, [x, fail](beast::error_code connect_ec,
                                                   const tcp::endpoint&) {
          if (connect_ec) return fail(connect_ec);
          http::async_write(
              x->stream, x->request, [x, fail](beast::error_code write_ec, std::size_t) {
                if (write_ec) return fail(write_ec);
                http::async_read(x->stream, x->buffer, x->response,
                                 [x, fail](beast::error_code read_ec, std::size_t) {
                                   if (read_ec) return fail(read_ec);
                                   beast::error_code ignored;
                                   x->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
                                   x->done = true;
                                 });
              });
        });
      });
}

std::string reason_of(const Answer& a) {
  if (a.body.is_object() && a.body.contains("error") && a.body["error"].is_string()) {
    return a.body["error"].get<std::string>();
  }
  return "HTTP " + std::to_string(a.status);
}

ConfigEvent event_from_json(const json& j) {
  ConfigEvent e;
  e.seq = j.value("seq", std::uint64_t{0});
  e.time = j.value("time", std::string());
  e.type = j.value("type", std::string());
  e.worker = j.value("worker", std::string());
  e.detail = j.value("detail", std::string());
  if (j.contains("version") && j["version"].is_number_unsigned()) {
    e.version = j["version"].get<std::uint64_t>();
  }
  return e;
}

Cluster cluster_from(const Answer& a, const std::string& what) {
  try {
    return Cluster::from_json(a.body);
  } catch (const std::exception& e) {
    throw Error(make_error_code(errc::protocol_error),
                what + ": the server sent a malformed cluster document: " + e.what());
  }
}

}  // namespace

Endpoint ConfigClient::parse_url(std::string_view url) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("config service URL '" + std::string(url) + "' " + why +
                                 " (expected http://HOST:PORT)");
  };
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) throw bad("does not start with http://");
  std::string_view rest = url.substr(kScheme.size());
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) throw bad("has a path or query");
  std::string host;
  std::string_view port_text;
  if (rest.starts_with('[')) {
    const auto close = rest.find(']');
    if (close == std::string_view::npos || close == 1 || close + 1 >= rest.size() ||
        rest[close + 1] != ':') {
      throw bad("has a malformed IPv6 host or no port");
    }
    host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) throw bad("has no port");
    if (colon == 0 || rest.substr(0, colon).find(':') != std::string_view::npos) {
      throw bad("has no host or a malformed one");
    }
    host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  unsigned port = 0;
  const auto [ptr, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || ptr != port_text.data() + port_text.size() ||
      port == 0 || port > 65535) {
    throw bad("has no valid port (1-65535)");
  }
  return Endpoint{std::move(host), static_cast<std::uint16_t>(port)};
}

// The client's io_context, driven by the calling thread during each request.
class ConfigClient::Connection {
 public:
  // Sends one request and maps transport failures and error statuses to kf::Error. Returns the
  // answer for 2xx and 409 (the caller handles the conflict).
  Answer call(const Endpoint& server, const std::string& token, http::verb verb,
              const std::string& target, const json* body, std::chrono::milliseconds deadline);

  void cancel() noexcept {
    cancelled_.store(true);
    ioc_.stop();  // thread-safe: the request's run loop returns at once
  }

 private:
  // Runs `x` until it is done, the deadline passes or cancel() is called. Returns the error, or
  // none with x->response filled in.
  beast::error_code run(const std::shared_ptr<Exchange>& x, std::chrono::milliseconds deadline);

  asio::io_context ioc_;
  std::atomic<bool> cancelled_{false};
};

beast::error_code ConfigClient::Connection::run(const std::shared_ptr<Exchange>& x,
                                                std::chrono::milliseconds deadline) {
  x->stream.expires_after(deadline);
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
  x->stream.socket().close(ignored);
  return cancelled_.load() ? beast::error_code(asio::error::operation_aborted)
                           : beast::error_code(beast::error::timeout);
}

Answer ConfigClient::Connection::call(const Endpoint& server, const std::string& token,
                                      http::verb verb, const std::string& target, const json* body,
                                      std::chrono::milliseconds deadline) {
  const std::string what = std::string(http::to_string(verb)) + " http://" + server.str() + target;
  if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
  auto x = std::make_shared<Exchange>(ioc_);
  auto& req = x->request;
  req = http::request<http::string_body>{verb, target, 11};
  req.set(http::field::host, server.str());
  req.set(http::field::user_agent, "kf-config-client");
  if (!token.empty() && verb != http::verb::get) {
    req.set(http::field::authorization, "Bearer " + token);
  }
  if (body != nullptr) {
    req.set(http::field::content_type, "application/json");
    req.body() = body->dump();
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
  Answer a;
  a.status = x->response.result_int();
  if (!x->response.body().empty()) {
    a.body = json::parse(x->response.body(), nullptr, /*allow_exceptions=*/false);
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

ConfigClient::ConfigClient(std::string_view url, std::string token, ConfigClientOptions options)
    : server_(parse_url(url)),
      token_(std::move(token)),
      options_(options),
      connection_(std::make_unique<Connection>()) {}

ConfigClient::~ConfigClient() = default;
ConfigClient::ConfigClient(ConfigClient&&) noexcept = default;
ConfigClient& ConfigClient::operator=(ConfigClient&&) noexcept = default;

void ConfigClient::cancel() noexcept { connection_->cancel(); }

Cluster ConfigClient::get_cluster() {
  const Answer a = connection_->call(server_, token_, http::verb::get, "/v1/cluster", nullptr,
                                     options_.deadline);
  return cluster_from(a, "GET /v1/cluster");
}

Cluster ConfigClient::put_cluster(const Cluster& next) {
  const json body = next.to_json();
  const Answer a =
      connection_->call(server_, token_, http::verb::put, "/v1/cluster", &body, options_.deadline);
  if (a.status == 409) {
    json current = a.body.is_object() && a.body.contains("current") ? a.body["current"] : json();
    throw ConflictError("PUT /v1/cluster: 409 " + reason_of(a),
                        cluster_from(Answer{200, current}, "PUT /v1/cluster (409)"));
  }
  return cluster_from(a, "PUT /v1/cluster");
}

Cluster ConfigClient::watch(std::uint64_t after_version, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + timeout;
  const std::string target = "/v1/cluster?watch=1&after=" + std::to_string(after_version);
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now());
    if (left <= std::chrono::milliseconds::zero()) return get_cluster();
    // The server answers a long-poll after its own watch timeout at the latest; we stop waiting at
    // ours. A poll cut short that way is not a failure: read once more (with the ordinary deadline)
    // and return what is there.
    Answer a;
    try {
      a = connection_->call(server_, token_, http::verb::get, target, nullptr, left);
    } catch (const Error& e) {
      if (e.code() != errc::service_unavailable || Clock::now() < end) throw;
      return get_cluster();
    }
    Cluster c = cluster_from(a, "GET " + target);
    if (c.version > after_version) return c;
  }
}

ConfigEvent ConfigClient::post_event(const std::string& type, const std::string& worker,
                                     const std::string& detail,
                                     std::optional<std::uint64_t> version) {
  json body = {{"type", type}};
  if (!worker.empty()) body["worker"] = worker;
  if (!detail.empty()) body["detail"] = detail;
  if (version) body["version"] = *version;
  const Answer a =
      connection_->call(server_, token_, http::verb::post, "/v1/events", &body, options_.deadline);
  return event_from_json(a.body);
}

std::vector<ConfigEvent> ConfigClient::get_events(std::uint64_t after_seq) {
  const std::string target = "/v1/events?after=" + std::to_string(after_seq);
  const Answer a =
      connection_->call(server_, token_, http::verb::get, target, nullptr, options_.deadline);
  std::vector<ConfigEvent> events;
  if (!a.body.is_object() || !a.body.contains("events") || !a.body["events"].is_array()) {
    throw Error(make_error_code(errc::protocol_error), "GET " + target + ": no events array");
  }
  for (const auto& j : a.body["events"]) events.push_back(event_from_json(j));
  return events;
}

}  // namespace kf
