// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/config_client.hpp"
#include "kf/common/fd.hpp"
#include "kf/common/host.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <ctime>
#include <functional>
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

#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/request_signature.hpp"

namespace kf {

bool is_client_event_type(std::string_view type) noexcept {
  static constexpr std::array<std::string_view, 15> kTypes{
      "added",   "removed", "joined",    "left",    "failed", "revoked",  "killed", "resized",
      "started", "exited",  "restarted", "adopted", "notice", "draining", "note"};
  for (const auto t : kTypes) {
    if (t == type) return true;
  }
  return false;
}

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

// Ends `x` with `ec`.
template <typename X>
void fail(const std::shared_ptr<X>& x, beast::error_code ec) {
  x->ec = ec;
  x->done = true;
}

// Resolves, connects and writes x's request, then calls `read(x)` to take the answer; a failure
// on the way ends `x` (either kind of exchange below). An address (what kf writes in URLs it
// makes) is connected to as it is: asio looks names up on a thread of its own, which would cost
// a thread per client and a hop to it per request.
template <typename X, typename Read>
void connect_and_send(const std::shared_ptr<X>& x, const Endpoint& server, Read read) {
  auto send = [x, read](beast::error_code connect_ec) {
    if (connect_ec) return fail(x, connect_ec);
    set_close_on_exec(x->stream.socket().native_handle());
    http::async_write(x->stream, x->request, [x, read](beast::error_code write_ec, std::size_t) {
      if (write_ec) return fail(x, write_ec);
      read(x);
    });
  };
  beast::error_code not_an_address;
  const auto address = asio::ip::make_address(server.host, not_an_address);
  if (!not_an_address) {
    x->stream.async_connect(tcp::endpoint(address, server.port), std::move(send));
    return;
  }
  x->resolver.async_resolve(
      server.host, std::to_string(server.port),
      [x, send](beast::error_code resolve_ec, tcp::resolver::results_type results) {
        if (resolve_ec) return fail(x, resolve_ec);
        x->stream.async_connect(results, [send](beast::error_code connect_ec,
                                                const tcp::endpoint&) { send(connect_ec); });
      });
}

// Starts resolve, connect, write and read; `x->done` is set when they have ended.
void start(const std::shared_ptr<Exchange>& x, const Endpoint& server) {
  connect_and_send(x, server, [](const std::shared_ptr<Exchange>& ex) {
    http::async_read(ex->stream, ex->buffer, ex->response,
                     [ex](beast::error_code read_ec, std::size_t) {
                       if (read_ec) return fail(ex, read_ec);
                       beast::error_code ignored;
                       ex->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
                       ex->done = true;
                     });
  });
}

// A request whose answer is a stream of JSON messages, one per line (etcd's watch through its
// JSON gateway): each complete line goes to on_message, which returns true to stop reading.
struct StreamExchange {
  explicit StreamExchange(asio::io_context& ioc) : resolver(ioc), stream(ioc) {}
  tcp::resolver resolver;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> request;
  http::response_parser<http::string_body> parser;
  std::size_t consumed = 0;  // bytes of the body handed to on_message
  std::function<bool(const json&)> on_message;
  std::string bad_message;  // a line that is not JSON
  beast::error_code ec;
  bool done = false;
};

// Hands the complete lines of the body received so far to on_message. Returns true to stop.
bool take_lines(StreamExchange& x) {
  const std::string& body = x.parser.get().body();
  for (;;) {
    const auto end = body.find('\n', x.consumed);
    if (end == std::string::npos) return false;
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
  http::async_read_some(x->stream, x->buffer, x->parser, [x](beast::error_code ec, std::size_t) {
    if (ec) {
      x->ec = ec;
      x->done = true;
      return;
    }
    if (take_lines(*x) || x->parser.is_done()) {
      beast::error_code ignored;
      x->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      x->done = true;
      return;
    }
    read_stream(x);
  });
}

void start_stream(const std::shared_ptr<StreamExchange>& x, const Endpoint& server) {
  x->parser.body_limit(std::uint64_t{256} << 20);
  connect_and_send(x, server, [](const std::shared_ptr<StreamExchange>& sx) { read_stream(sx); });
}

std::string reason_of(const Answer& a) {
  if (a.body.is_object() && a.body.contains("error") && a.body["error"].is_string()) {
    return a.body["error"].get<std::string>();
  }
  if (a.body.is_object() && a.body.contains("message") && a.body["message"].is_string()) {
    return a.body["message"].get<std::string>();  // etcd's JSON gateway
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

// Runs `read`, which takes an answer apart: a JSON field of the wrong type (nlohmann's exceptions)
// becomes a protocol error naming the call.
template <typename Read>
auto reading(const char* what, Read&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    throw Error(make_error_code(errc::protocol_error),
                std::string(what) + ": the service sent a malformed answer: " + e.what());
  }
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
  if (const std::string why = host_problem(host); !why.empty()) throw bad("has " + why);
  return Endpoint{std::move(host), static_cast<std::uint16_t>(port)};
}

// The client's io_context, driven by the calling thread during each request.
class ConfigClient::Connection {
 public:
  explicit Connection(std::function<std::chrono::system_clock::time_point()> now)
      : now_(std::move(now)) {}

  // Sends one request and maps transport failures and error statuses to kf::Error. Returns the
  // answer for 2xx and 409 (the caller handles the conflict).
  // A mutation (not GET) is signed with `control` when given (request_signature.hpp).
  Answer call(const Endpoint& server, const Key* control, http::verb verb,
              const std::string& target, const json* body, std::chrono::milliseconds deadline);

  // POSTs `body` to `target` and hands each message of the streamed answer to `on_message`
  // until it returns true (then returns true) or `wait` has passed (then returns false). Throws
  // as call() when the service cannot be reached or answers an error status.
  bool stream(const Endpoint& server, const std::string& target, const json& body,
              std::chrono::milliseconds wait, const std::function<bool(const json&)>& on_message);

  void cancel() noexcept {
    cancelled_.store(true);
    ioc_.stop();  // thread-safe: the request's run loop returns at once
  }

  const std::function<std::chrono::system_clock::time_point()>& clock() const noexcept {
    return now_;
  }

 private:
  // Runs `x` until it is done, the deadline passes or cancel() is called. Returns the error, or
  // none with x's answer filled in.
  template <typename X>
  beast::error_code run(const std::shared_ptr<X>& x, std::chrono::milliseconds deadline);

  std::int64_t local_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now_().time_since_epoch()).count();
  }

  asio::io_context ioc_;
  std::atomic<bool> cancelled_{false};
  std::function<std::chrono::system_clock::time_point()> now_;
  // The service's clock less this one's, as its last answer said (0 before any): mutations are
  // signed in the service's time.
  std::int64_t offset_ms_ = 0;
};

template <typename X>
beast::error_code ConfigClient::Connection::run(const std::shared_ptr<X>& x,
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

Answer ConfigClient::Connection::call(const Endpoint& server, const Key* control, http::verb verb,
                                      const std::string& target, const json* body,
                                      std::chrono::milliseconds deadline) {
  const std::string what = std::string(http::to_string(verb)) + " http://" + server.str() + target;
  std::shared_ptr<Exchange> x;
  for (int attempt = 0;; ++attempt) {
    if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
    x = std::make_shared<Exchange>(ioc_);
    auto& req = x->request;
    req = http::request<http::string_body>{verb, target, 11};
    req.set(http::field::host, server.str());
    req.set(http::field::user_agent, "kf-config-client");
    if (body != nullptr) {
      req.set(http::field::content_type, "application/json");
      req.body() = body->dump();
    }
    const std::int64_t offset = offset_ms_;
    std::string nonce;  // of a signed request: the service's clock comes back bound to it
    if (control != nullptr && verb != http::verb::get) {
      const std::string auth = sign_request(*control, std::string(http::to_string(verb)), target,
                                            req.body(), local_ms() + offset);
      std::string why;
      if (const auto sig = parse_request_signature(auth, why)) nonce = sig->nonce;
      req.set(http::field::authorization, auth);
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

bool ConfigClient::Connection::stream(const Endpoint& server, const std::string& target,
                                      const json& body, std::chrono::milliseconds wait,
                                      const std::function<bool(const json&)>& on_message) {
  const std::string what = "POST http://" + server.str() + target;
  if (cancelled_.load()) throw Error(make_error_code(errc::cancelled), what + ": cancelled");
  auto x = std::make_shared<StreamExchange>(ioc_);
  auto& req = x->request;
  req = http::request<http::string_body>{http::verb::post, target, 11};
  req.set(http::field::host, server.str());
  req.set(http::field::user_agent, "kf-config-client");
  req.set(http::field::content_type, "application/json");
  // etcd's gateway passes this on as gRPC metadata: a watch then ends with an error on a member
  // that has lost its leader (a minority in a partition) instead of staying silent.
  req.set("Grpc-Metadata-hasleader", "true");
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
    throw Error(make_error_code(status >= 500 ? errc::service_unavailable : errc::protocol_error),
                what + ": " + std::to_string(status) + " " + reason_of(a));
  }
  if (!x->bad_message.empty()) {
    throw Error(make_error_code(errc::protocol_error),
                what + ": a streamed message is not JSON: " + x->bad_message);
  }
  return stopped;
}

// ---- etcd ----------------------------------------------------------------------------------
//
// The job's keys under PREFIX: PREFIX/cluster holds the document (JSON) and PREFIX/events/ID one
// event each, its seq being the etcd revision that created it. Changes are transactions that
// compare the key's mod_revision (compare-and-swap) and write the document together with its
// cluster_changed event; a watch streams the document's next change.

namespace {

std::string base64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string unbase64(const std::string& s, const std::string& what) {
  if (s.size() % 4 != 0) {
    throw Error(make_error_code(errc::protocol_error), what + ": a value is not base64");
  }
  std::string out(3 * s.size() / 4, '\0');
  const int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) throw Error(make_error_code(errc::protocol_error), what + ": a value is not base64");
  std::size_t size = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes.
  if (!s.empty() && s[s.size() - 1] == '=') --size;
  if (s.size() > 1 && s[s.size() - 2] == '=') --size;
  out.resize(size);
  return out;
}

// An int64 of the gateway's answers (written as a JSON string), or 0 when absent.
std::uint64_t int_field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const json& v = j[key];
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    std::uint64_t n = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec == std::errc{} && ptr == s.data() + s.size()) return n;
  }
  return 0;
}

std::string now_rfc3339() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

// The key after every key that starts with `prefix` (a range's end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// "/kf/" and 16 hex digits of SHA-256 of the token: every process of a job holds the token, so
// they all find the same keys, and the keys do not reveal it.
std::string prefix_for_token(const std::string& token) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest.data());
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "/kf/";
  for (std::size_t i = 0; i < 8; ++i) {
    out.push_back(kDigits[digest[i] >> 4]);
    out.push_back(kDigits[digest[i] & 0xf]);
  }
  return out;
}

std::string workers_text(const Cluster& c) {
  return std::to_string(c.size()) + (c.size() == 1 ? " worker" : " workers");
}

// The document without its version, to tell whether a stored one is the one we wrote.
json content_of(const Cluster& c) {
  json j = c.to_json();
  j.erase("version");
  return j;
}

}  // namespace

class ConfigClient::Etcd {
 public:
  Etcd(ServiceUrl url, const std::string& token, Connection& connection,
       ConfigClientOptions options)
      : endpoints_(std::move(url.endpoints)),
        prefix_(url.prefix.empty() ? prefix_for_token(token) : url.prefix),
        cluster_key_(prefix_ + "/cluster"),
        events_prefix_(prefix_ + "/events/"),
        agents_prefix_(prefix_ + "/agents/"),
        connection_(connection),
        beside_(connection.clock()),
        options_(options) {}

  void cancel() noexcept { beside_.cancel(); }

  Cluster get_cluster() { return read().cluster; }

  Cluster put_cluster(const Cluster& next, const Cluster* from) {
    if (next.workers.empty()) {
      throw Error(make_error_code(errc::invalid_argument),
                  "etcd put cluster: workers must not be empty");
    }
    if (const auto why = next.validate(); !why.empty()) {
      throw Error(make_error_code(errc::invalid_argument), "etcd put cluster: " + why);
    }
    if (const auto parsed = parse_cluster_settings(next.settings); !parsed.errors.empty()) {
      std::string why;
      for (const auto& e : parsed.errors) why += (why.empty() ? "" : "; ") + e;
      throw Error(make_error_code(errc::invalid_argument), "etcd put cluster: " + why);
    }
    // What the write replaces, checked by the transaction's compare (a failed compare answers
    // with the current document, so a read first would only add a round trip): the document this
    // client read last, when the edit was made from it (the usual read, edit, write); else the
    // document the caller edited (`from`), byte for byte, as kf writes every document
    // (Cluster::to_json().dump()); else what a read finds.
    std::optional<Stored> current;
    const bool read_last = last_ && last_->cluster.version == next.version;
    const bool by_value = !read_last && from != nullptr && from->version == next.version;
    if (!by_value) {
      current = read_last ? *last_ : read();
      if (next.version != current->cluster.version) {
        throw ConflictError("etcd put cluster: stale version " + std::to_string(next.version) +
                                ", current is " + std::to_string(current->cluster.version),
                            current->cluster);
      }
    }
    Cluster stored = next;
    stored.version = next.version + 1;
    const json event = {{"type", "cluster_changed"},
                        {"version", stored.version},
                        {"detail", workers_text(stored)},
                        {"time", now_rfc3339()}};
    const json compare = by_value ? json{{"key", base64(cluster_key_)},
                                         {"target", "VALUE"},
                                         {"result", "EQUAL"},
                                         {"value", base64(from->to_json().dump())}}
                         : current->mod_revision == 0
                             ? json{{"key", base64(cluster_key_)},
                                    {"target", "CREATE"},
                                    {"result", "EQUAL"},
                                    {"create_revision", "0"}}
                             : json{{"key", base64(cluster_key_)},
                                    {"target", "MOD"},
                                    {"result", "EQUAL"},
                                    {"mod_revision", std::to_string(current->mod_revision)}};
    const json txn = {
        {"compare", json::array({compare})},
        {"success", json::array({put_op(cluster_key_, stored.to_json().dump()),
                                 put_op(events_prefix_ + random_hex(8), event.dump())})},
        {"failure", json::array({json{{"request_range", {{"key", base64(cluster_key_)}}}}})}};
    json answer;
    try {
      answer = call("/v3/kv/txn", txn);
    } catch (const Error& e) {
      if (e.code() != errc::service_unavailable) throw;
      // The write may have been committed with its answer lost: then the document is ours.
      // Saying so keeps a caller that would re-apply its edit after a conflict from applying
      // it twice.
      Stored after;
      try {
        after = read();
      } catch (const Error&) {
        throw e;
      }
      if (after.cluster.version == stored.version &&
          content_of(after.cluster) == content_of(stored)) {
        return after.cluster;
      }
      throw;
    }
    last_.reset();
    if (answer.value("succeeded", false)) {
      // The transaction's revision is the document's new mod_revision.
      const std::uint64_t revision = int_field(answer.value("header", json::object()), "revision");
      if (revision > 0) last_ = Stored{stored, revision, revision};
      return stored;
    }
    // The compare failed: someone else wrote first.
    std::optional<Stored> now = current;
    if (answer.contains("responses") && answer["responses"].is_array()) {
      for (const auto& r : answer["responses"]) {
        if (!r.contains("response_range")) continue;
        Stored s = from_range(r["response_range"], "etcd txn");
        now = s;
        if (s.mod_revision > 0) last_ = std::move(s);
      }
    }
    if (!now) {
      throw Error(make_error_code(errc::protocol_error),
                  "etcd put cluster: a failed compare without the current document");
    }
    // Compared by value, the document of the same version may still differ in its bytes (written
    // by another program): compared by its revision, which the answer gave, the write goes on.
    if (by_value && now->cluster.version == next.version) {
      return put_cluster(next, nullptr);
    }
    throw ConflictError("etcd put cluster: version " + std::to_string(next.version) +
                            " was changed meanwhile, current is " +
                            std::to_string(now->cluster.version),
                        now->cluster);
  }

  Cluster watch(std::uint64_t after_version, std::chrono::milliseconds timeout) {
    using Clock = std::chrono::steady_clock;
    const auto end = Clock::now() + timeout;
    for (;;) {
      const Stored s = read();
      if (s.cluster.version > after_version) return s.cluster;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now());
      if (left <= std::chrono::milliseconds::zero()) return s.cluster;
      // Every change of the document after the store's revision when the watch begins. Not
      // from the revision read (start_revision): etcd serves a watch that begins at a revision
      // already past from a loop that runs every 100 ms, so after any write in between (an
      // event, an agent's key) the change would come up to 100 ms late. The watch's first
      // message says where it began; a change between the read and there is read then.
      const json request = {{"create_request", {{"key", base64(cluster_key_)}}}};
      std::optional<Cluster> seen;
      bool lost = false;    // the member ended the watch: no leader, or cancelled it
      bool unread = false;  // the store moved on before the watch began and could not be read
      try {
        connection_.stream(endpoints_[current_], "/v3/watch", request, left, [&](const json& m) {
          if (m.contains("error")) return lost = true;
          const json& result = m.contains("result") ? m["result"] : m;
          if (result.value("canceled", false)) return lost = true;
          // A created message without its revision cannot say that nothing moved: read too.
          const auto began = int_field(result.value("header", json::object()), "revision");
          if (result.value("created", false) && (began == 0 || began > s.revision)) {
            try {
              Cluster now = read_beside().cluster;
              if (now.version > after_version) seen = std::move(now);
            } catch (const Error& e) {
              if (e.code() != errc::service_unavailable) throw;
              unread = true;
            }
            return seen.has_value() || unread;
          }
          if (!result.contains("events") || !result["events"].is_array()) return false;
          for (const auto& e : result["events"]) {
            if (e.value("type", std::string()) == "DELETE" || !e.contains("kv")) continue;
            Cluster c = parse_document(e["kv"], "etcd watch");
            if (c.version > after_version) seen = std::move(c);
          }
          return seen.has_value();
        });
      } catch (const Error& e) {
        if (e.code() != errc::service_unavailable) throw;
        next_endpoint();
        continue;  // read again, from another member
      }
      if (seen) return *seen;
      if (lost || unread) next_endpoint();
      if (Clock::now() >= end) return read().cluster;
    }
  }

  ConfigEvent post_event(const std::string& type, const std::string& worker,
                         const std::string& detail, std::optional<std::uint64_t> version) {
    if (!is_client_event_type(type)) {
      throw Error(make_error_code(errc::invalid_argument),
                  "etcd post event: unknown event type '" + type + "'");
    }
    if (!worker.empty()) {
      try {
        Endpoint::parse(worker);
      } catch (const std::invalid_argument& e) {
        throw Error(make_error_code(errc::invalid_argument),
                    "etcd post event: worker must be host:port: " + std::string(e.what()));
      }
    }
    json event = {{"type", type}, {"time", now_rfc3339()}};
    if (!worker.empty()) event["worker"] = worker;
    if (!detail.empty()) event["detail"] = detail;
    if (version) event["version"] = *version;
    const std::string key = events_prefix_ + random_hex(8);
    // Created only if absent: a retry after a lost answer finds it there and writes nothing.
    const json txn = {{"compare", json::array({json{{"key", base64(key)},
                                                    {"target", "CREATE"},
                                                    {"result", "EQUAL"},
                                                    {"create_revision", "0"}}})},
                      {"success", json::array({put_op(key, event.dump())})},
                      {"failure", json::array({json{{"request_range", {{"key", base64(key)}}}}})}};
    const json answer = call("/v3/kv/txn", txn);
    std::uint64_t seq = int_field(answer.value("header", json::object()), "revision");
    if (!answer.value("succeeded", false) && answer.contains("responses")) {
      for (const auto& r : answer["responses"]) {
        const json& range = r.value("response_range", json::object());
        for (const auto& kv : range.value("kvs", json::array()))
          seq = int_field(kv, "create_revision");
      }
    }
    ConfigEvent e = event_from_json(event);
    e.seq = seq;
    return e;
  }

  std::vector<ConfigEvent> get_events(std::uint64_t after_seq) {
    const json request = {{"key", base64(events_prefix_)},
                          {"range_end", base64(prefix_end(events_prefix_))},
                          {"sort_order", "ASCEND"},
                          {"sort_target", "CREATE"},
                          {"min_create_revision", std::to_string(after_seq + 1)}};
    const json answer = call("/v3/kv/range", request);
    std::vector<ConfigEvent> events;
    for (const auto& kv : answer.value("kvs", json::array())) {
      const std::string value = unbase64(kv.value("value", std::string()), "etcd events");
      const json j = parse_json_or_discard(value);
      if (!j.is_object()) {
        throw Error(make_error_code(errc::protocol_error), "etcd events: an event is not JSON");
      }
      ConfigEvent e = event_from_json(j);
      e.seq = int_field(kv, "create_revision");
      events.push_back(std::move(e));
    }
    return events;
  }

  bool announce_agent(const std::string& host, std::chrono::seconds ttl) {
    agent_host_ = host;
    agent_ttl_ = ttl;
    const json granted = call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
    lease_ = int_field(granted, "ID");
    if (lease_ == 0) {
      throw Error(make_error_code(errc::protocol_error), "etcd lease grant: no lease ID");
    }
    const json record = {{"host", host}, {"since", now_rfc3339()}};
    json put = {{"key", base64(agents_prefix_ + host)},
                {"value", base64(record.dump())},
                {"lease", std::to_string(lease_)}};
    call("/v3/kv/put", put);
    return true;
  }

  void keep_agent_alive() {
    if (lease_ == 0) return;
    std::uint64_t ttl = 0;
    const json request = {{"ID", std::to_string(lease_)}};
    connection_.stream(endpoints_[current_], "/v3/lease/keepalive", request, options_.deadline,
                       [&](const json& m) {
                         ttl = int_field(m.value("result", json::object()), "TTL");
                         return true;
                       });
    // A lease that had expired (the agent was away for longer than its TTL) renews to nothing.
    if (ttl == 0) announce_agent(agent_host_, agent_ttl_);
  }

  void retire_agent() {
    if (lease_ == 0) return;
    call("/v3/lease/revoke", {{"ID", std::to_string(lease_)}});
    lease_ = 0;
  }

  std::vector<std::string> live_agents() {
    const json answer = call("/v3/kv/range", {{"key", base64(agents_prefix_)},
                                              {"range_end", base64(prefix_end(agents_prefix_))}});
    std::vector<std::string> hosts;
    for (const auto& kv : answer.value("kvs", json::array())) {
      const std::string key = unbase64(kv.value("key", std::string()), "etcd agents");
      if (!key.starts_with(agents_prefix_)) {
        throw Error(make_error_code(errc::protocol_error),
                    "etcd agents: the answer holds a key outside " + agents_prefix_);
      }
      hosts.push_back(key.substr(agents_prefix_.size()));
    }
    return hosts;
  }

 private:
  struct Stored {
    Cluster cluster;
    std::uint64_t mod_revision = 0;  // 0: no document yet
    std::uint64_t revision = 0;      // of the store when it was read
  };

  static json put_op(const std::string& key, const std::string& value) {
    return json{{"request_put", {{"key", base64(key)}, {"value", base64(value)}}}};
  }

  Cluster parse_document(const json& kv, const std::string& what) const {
    const std::string value = unbase64(kv.value("value", std::string()), what);
    const json j = parse_json_or_discard(value);
    return cluster_from(Answer{200, j}, what + " " + cluster_key_);
  }

  Stored from_range(const json& answer, const std::string& what) const {
    Stored s;
    s.revision = int_field(answer.value("header", json::object()), "revision");
    const json kvs = answer.value("kvs", json::array());
    if (kvs.empty()) return s;
    s.cluster = parse_document(kvs[0], what);
    s.mod_revision = int_field(kvs[0], "mod_revision");
    return s;
  }

  Stored read() {
    last_ = from_range(call("/v3/kv/range", {{"key", base64(cluster_key_)}}), "etcd");
    return *last_;
  }

  // read() from the current member on a connection of its own, for a watch whose stream holds
  // this client's.
  Stored read_beside() {
    const json range = {{"key", base64(cluster_key_)}};
    last_ = from_range(beside_
                           .call(endpoints_[current_], nullptr, http::verb::post, "/v3/kv/range",
                                 &range, options_.deadline)
                           .body,
                       "etcd");
    return *last_;
  }

  void next_endpoint() { current_ = (current_ + 1) % endpoints_.size(); }

  // POSTs to the current member; a member that cannot be reached (or has no quorum: etcd then
  // answers 5xx) is left for the next, each tried once.
  json call(const std::string& target, const json& body) {
    std::string reasons;
    for (std::size_t tried = 0; tried < endpoints_.size(); ++tried) {
      try {
        return connection_
            .call(endpoints_[current_], nullptr, http::verb::post, target, &body, options_.deadline)
            .body;
      } catch (const Error& e) {
        if (e.code() != errc::service_unavailable) throw;
        reasons += (reasons.empty() ? "" : "; ") + std::string(e.what());
        next_endpoint();
      }
    }
    throw Error(make_error_code(errc::service_unavailable), "no etcd member answered: " + reasons);
  }

  std::vector<Endpoint> endpoints_;
  std::size_t current_ = 0;
  std::string prefix_;
  std::string cluster_key_;
  std::string events_prefix_;
  std::string agents_prefix_;
  Connection& connection_;
  Connection beside_;  // for a read while a watch's stream holds connection_ (read_beside)
  ConfigClientOptions options_;
  std::optional<Stored> last_;  // the document as this client last read or wrote it
  std::uint64_t lease_ = 0;     // announce_agent's
  std::string agent_host_;
  std::chrono::seconds agent_ttl_{0};
};

ServiceUrl ConfigClient::parse_service_url(std::string_view url) {
  constexpr std::string_view kEtcd = "etcd://";
  if (!url.starts_with(kEtcd)) {
    if (!url.starts_with("http://")) {
      throw std::invalid_argument("config service URL '" + std::string(url) +
                                  "' starts with neither http:// nor etcd:// (expected "
                                  "http://HOST:PORT or etcd://HOST:PORT[,HOST:PORT...][/PREFIX])");
    }
    return ServiceUrl{ServiceUrl::Kind::http, {parse_url(url)}, {}};
  }
  ServiceUrl out;
  out.kind = ServiceUrl::Kind::etcd;
  std::string_view rest = url.substr(kEtcd.size());
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    out.prefix = std::string(rest.substr(slash));
    rest = rest.substr(0, slash);
    while (out.prefix.size() > 1 && out.prefix.back() == '/') out.prefix.pop_back();
    if (out.prefix == "/") out.prefix.clear();
  }
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view member = rest.substr(0, comma);
    try {
      out.endpoints.push_back(parse_url("http://" + std::string(member)));
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument("config service URL '" + std::string(url) + "': etcd member '" +
                                  std::string(member) + "' is not HOST:PORT");
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (out.endpoints.empty()) {
    throw std::invalid_argument("config service URL '" + std::string(url) +
                                "' names no etcd member (expected etcd://HOST:PORT,...)");
  }
  return out;
}

ConfigClient::ConfigClient(std::string_view url, std::string token, ConfigClientOptions options)
    : token_(std::move(token)),
      control_key_(derive_key(token_, KeyUse::control)),
      options_(options),
      connection_(std::make_unique<Connection>(
          options_.now ? options_.now : [] { return std::chrono::system_clock::now(); })) {
  ServiceUrl parsed = parse_service_url(url);
  server_ = parsed.endpoints.front();
  if (parsed.kind == ServiceUrl::Kind::etcd) {
    etcd_ = std::make_unique<Etcd>(std::move(parsed), token_, *connection_, options_);
  }
}

ConfigClient::~ConfigClient() = default;
ConfigClient::ConfigClient(ConfigClient&&) noexcept = default;
ConfigClient& ConfigClient::operator=(ConfigClient&&) noexcept = default;

void ConfigClient::cancel() noexcept {
  connection_->cancel();
  if (etcd_) etcd_->cancel();
}

Cluster ConfigClient::get_cluster() {
  return reading("GET cluster", [&] {
    if (etcd_) return etcd_->get_cluster();
    const Answer a = connection_->call(server_, &control_key_, http::verb::get, "/v1/cluster",
                                       nullptr, options_.deadline);
    return cluster_from(a, "GET /v1/cluster");
  });
}

Cluster ConfigClient::put_cluster(const Cluster& next, const Cluster* from) {
  return reading("PUT cluster", [&] {
    if (etcd_) return etcd_->put_cluster(next, from);
    const json body = next.to_json();
    const Answer a = connection_->call(server_, &control_key_, http::verb::put, "/v1/cluster",
                                       &body, options_.deadline);
    if (a.status == 409) {
      json current = a.body.is_object() && a.body.contains("current") ? a.body["current"] : json();
      throw ConflictError("PUT /v1/cluster: 409 " + reason_of(a),
                          cluster_from(Answer{200, current}, "PUT /v1/cluster (409)"));
    }
    return cluster_from(a, "PUT /v1/cluster");
  });
}

Cluster ConfigClient::watch(std::uint64_t after_version, std::chrono::milliseconds timeout) {
  return reading("watch", [&] {
    if (etcd_) return etcd_->watch(after_version, timeout);
    using Clock = std::chrono::steady_clock;
    const auto end = Clock::now() + timeout;
    const std::string target = "/v1/cluster?watch=1&after=" + std::to_string(after_version);
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now());
      if (left <= std::chrono::milliseconds::zero()) return get_cluster();
      // The server answers a long-poll after its own watch timeout at the latest; we stop waiting
      // at ours. A poll cut short that way is not a failure: read once more (with the ordinary
      // deadline) and return what is there.
      Answer a;
      try {
        a = connection_->call(server_, &control_key_, http::verb::get, target, nullptr, left);
      } catch (const Error& e) {
        if (e.code() != errc::service_unavailable || Clock::now() < end) throw;
        return get_cluster();
      }
      Cluster c = cluster_from(a, "GET " + target);
      if (c.version > after_version) return c;
    }
  });
}

ConfigEvent ConfigClient::post_event(const std::string& type, const std::string& worker,
                                     const std::string& detail,
                                     std::optional<std::uint64_t> version) {
  return reading("post event", [&] {
    if (etcd_) return etcd_->post_event(type, worker, detail, version);
    json body = {{"type", type}};
    if (!worker.empty()) body["worker"] = worker;
    if (!detail.empty()) body["detail"] = detail;
    if (version) body["version"] = *version;
    const Answer a = connection_->call(server_, &control_key_, http::verb::post, "/v1/events",
                                       &body, options_.deadline);
    return event_from_json(a.body);
  });
}

bool ConfigClient::announce_agent(const std::string& host, std::chrono::seconds ttl) {
  return reading("announce agent",
                 [&] { return etcd_ ? etcd_->announce_agent(host, ttl) : false; });
}

void ConfigClient::keep_agent_alive() {
  return reading("keep agent alive", [&] {
    if (etcd_) etcd_->keep_agent_alive();
  });
}

void ConfigClient::retire_agent() {
  return reading("retire agent", [&] {
    if (etcd_) etcd_->retire_agent();
  });
}

std::optional<std::vector<std::string>> ConfigClient::live_agents() {
  return reading("live agents", [&]() -> std::optional<std::vector<std::string>> {
    if (!etcd_) return std::nullopt;
    return etcd_->live_agents();
  });
}

std::vector<ConfigEvent> ConfigClient::get_events(std::uint64_t after_seq) {
  return reading("GET events", [&] {
    if (etcd_) return etcd_->get_events(after_seq);
    const std::string target = "/v1/events?after=" + std::to_string(after_seq);
    const Answer a = connection_->call(server_, &control_key_, http::verb::get, target, nullptr,
                                       options_.deadline);
    std::vector<ConfigEvent> events;
    if (!a.body.is_object() || !a.body.contains("events") || !a.body["events"].is_array()) {
      throw Error(make_error_code(errc::protocol_error), "GET " + target + ": no events array");
    }
    for (const auto& j : a.body["events"]) events.push_back(event_from_json(j));
    return events;
  });
}

}  // namespace kf
