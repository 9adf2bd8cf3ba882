// SPDX-License-Identifier: Apache-2.0
// What the files of kf::ConfigClient share: the Asio, Beast and JSON names they use, the answer
// to a request and what is read out of one, and the client's connection (connection.cpp), which
// ConfigClient names ConfigClient::Connection. Private to the runtime: Asio and Beast stay out of
// the public headers. Thread-safety: as ConfigClient's (one caller at a time; cancel() from any
// thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "kf/cluster/cluster.hpp"
#include "kf/common/error.hpp"
#include "kf/common/keys.hpp"
#include "kf/runtime/config_client.hpp"

namespace boost::asio::ssl {
class context;
}

namespace kf::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

struct Answer {
  unsigned status = 0;
  json body;
};

inline std::string reason_of(const Answer& a) {
  if (a.body.is_object() && a.body.contains("error") && a.body["error"].is_string()) {
    return a.body["error"].get<std::string>();
  }
  if (a.body.is_object() && a.body.contains("message") && a.body["message"].is_string()) {
    return a.body["message"].get<std::string>();  // etcd's JSON gateway
  }
  return "HTTP " + std::to_string(a.status);
}

inline ConfigEvent event_from_json(const json& j) {
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

// One agent's record: {"host", "slots", "since"} (kf-config-server's GET /v1/agents and the
// value of etcd's PREFIX/agents/HOST alike).
inline AgentOffer agent_offer_from(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("host") || !j["host"].is_string() ||
      j["host"].get<std::string>().empty()) {
    throw Error(make_error_code(errc::protocol_error), what + ": an agent without a host");
  }
  AgentOffer offer;
  offer.host = j["host"].get<std::string>();
  offer.since = j.value("since", std::string());
  if (j.contains("slots") && j["slots"].is_number_integer()) {
    const auto n = j["slots"].get<std::int64_t>();
    if (n < 0 || n > 1 << 20) {
      throw Error(make_error_code(errc::protocol_error),
                  what + ": agent " + offer.host + " offers " + std::to_string(n) + " slots");
    }
    offer.slots = static_cast<int>(n);
  }
  return offer;
}

inline std::vector<AgentOffer> agent_offers_from(const json& body, const std::string& what) {
  if (!body.is_object() || !body.contains("agents") || !body["agents"].is_array()) {
    throw Error(make_error_code(errc::protocol_error), what + ": no agents array");
  }
  std::vector<AgentOffer> offers;
  for (const auto& j : body["agents"]) offers.push_back(agent_offer_from(j, what));
  return offers;
}

inline Cluster cluster_from(const Answer& a, const std::string& what) {
  try {
    return Cluster::from_json(a.body);
  } catch (const std::exception& e) {
    throw Error(make_error_code(errc::protocol_error),
                what + ": the server sent a malformed cluster document: " + e.what());
  }
}

// The client's io_context, driven by the calling thread during each request.
class ConfigConnection {
 public:
  explicit ConfigConnection(std::function<std::chrono::system_clock::time_point()> now)
      : now_(std::move(now)) {}

  // Sends one request and maps transport failures and error statuses to kf::Error. Returns the
  // answer for 2xx and 409 (the caller handles the conflict).
  // A mutation (not GET) is signed with `control` when given (request_signature.hpp).
  // `authorization`: an Authorization header to send as it is (etcd's auth token).
  Answer call(const Endpoint& server, const Key* control, http::verb verb,
              const std::string& target, const json* body, std::chrono::milliseconds deadline,
              const std::string* authorization = nullptr);

  // POSTs `body` to `target` and hands each message of the streamed answer to `on_message`
  // until it returns true (then returns true) or `wait` has passed (then returns false). Throws
  // as call() when the service cannot be reached or answers an error status.
  bool stream(const Endpoint& server, const std::string& target, const json& body,
              std::chrono::milliseconds wait, const std::function<bool(const json&)>& on_message,
              const std::string* authorization = nullptr);

  void cancel() noexcept {
    cancelled_.store(true);
    ioc_.stop();  // thread-safe: the request's run loop returns at once
  }

  const std::function<std::chrono::system_clock::time_point()>& clock() const noexcept {
    return now_;
  }

  // Requests go over TLS with `tls` from now on (an etcds:// URL); null: plain TCP.
  void set_tls(std::shared_ptr<asio::ssl::context> tls) { tls_ = std::move(tls); }
  const std::shared_ptr<asio::ssl::context>& tls() const noexcept { return tls_; }

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
  std::shared_ptr<asio::ssl::context> tls_;  // etcds://: the client's TLS settings
};

/// The TLS settings of an etcds:// client: the member's certificate checked against `ca_file`
/// (empty: the system's authorities) and the host dialled; `cert_file` and `key_file` (PEM, both
/// or neither) the client's own certificate, for an etcd that asks for one. TLS 1.2 or later.
/// Throws: std::invalid_argument naming the file that cannot be loaded.
std::shared_ptr<asio::ssl::context> make_tls_context(const std::string& ca_file,
                                                     const std::string& cert_file,
                                                     const std::string& key_file);

}  // namespace kf::detail

namespace kf {

// The connection under the name config_client.hpp declares.
class ConfigClient::Connection : public detail::ConfigConnection {
 public:
  using ConfigConnection::ConfigConnection;
};

}  // namespace kf
