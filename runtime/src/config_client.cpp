// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient: its URLs, and each operation, as a request of kf-config-server's HTTP API
// (docs/config-server.md) or, for an etcd:// URL, on the etcd backend (config_client/etcd.cpp).
// The requests themselves are the connection's (config_client/connection.cpp).
#include "kf/runtime/config_client.hpp"

#include <array>
#include <charconv>
#include <memory>
#include <stdexcept>
#include <utility>

#include <boost/beast/http/verb.hpp>
#include <nlohmann/json.hpp>

#include "config_client/connection.hpp"
#include "config_client/etcd.hpp"
#include "kf/common/host.hpp"

namespace kf {

using detail::agent_offers_from;
using detail::Answer;
using detail::cluster_from;
using detail::event_from_json;
using detail::reason_of;

bool is_client_event_type(std::string_view type) noexcept {
  static constexpr std::array<std::string_view, 22> kTypes{
      "added",   "removed",  "joined",    "left",     "failed",    "revoked",
      "killed",  "resized",  "started",   "exited",   "restarted", "adopted",
      "notice",  "draining", "placed",    "released", "promoted",  "suspended",
      "resumed", "slow",     "recovered", "note"};
  for (const auto t : kTypes) {
    if (t == type) return true;
  }
  return false;
}

namespace {

namespace http = boost::beast::http;

// Events asked for per request (kf-config-server answers at most 1000 without a limit).
constexpr std::uint64_t kEventPage = 1000;
using nlohmann::json;

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

ServiceUrl ConfigClient::parse_service_url(std::string_view url) {
  constexpr std::string_view kEtcd = "etcd://", kEtcds = "etcds://";
  const bool tls = url.starts_with(kEtcds);
  if (!url.starts_with(kEtcd) && !tls) {
    if (!url.starts_with("http://")) {
      throw std::invalid_argument("config service URL '" + std::string(url) +
                                  "' starts with neither http://, etcd:// nor etcds:// (expected "
                                  "http://HOST:PORT or etcd://HOST:PORT[,HOST:PORT...][/PREFIX])");
    }
    return ServiceUrl{ServiceUrl::Kind::http, {parse_url(url)}, {}, false};
  }
  ServiceUrl out;
  out.kind = ServiceUrl::Kind::etcd;
  out.tls = tls;
  std::string_view rest = url.substr(tls ? kEtcds.size() : kEtcd.size());
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
    if (options_.etcd_user.empty() && options_.etcd_password.empty()) {
      detail::etcd_credentials_from_environment(options_.etcd_user, options_.etcd_password);
    }
    if (parsed.tls) {
      if (options_.etcd_ca_file.empty() && options_.etcd_cert_file.empty() &&
          options_.etcd_key_file.empty()) {
        const auto env = [](const char* name) {
          const char* v = std::getenv(name);
          return std::string(v != nullptr ? v : "");
        };
        options_.etcd_ca_file = env("KF_ETCD_CA_FILE");
        options_.etcd_cert_file = env("KF_ETCD_CERT_FILE");
        options_.etcd_key_file = env("KF_ETCD_KEY_FILE");
      }
      connection_->set_tls(detail::make_tls_context(options_.etcd_ca_file, options_.etcd_cert_file,
                                                    options_.etcd_key_file));
    }
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

bool ConfigClient::post_summary(const std::string& json_object) {
  if (etcd_) return false;
  const json body = json::parse(json_object);
  return reading("post summary", [&] {
    connection_->call(server_, &control_key_, http::verb::post, "/v1/summary", &body,
                      options_.deadline);
    return true;
  });
}

std::string ConfigClient::get_summaries() {
  if (etcd_) return "[]";
  return reading("GET summaries", [&] {
    const Answer a = connection_->call(server_, &control_key_, http::verb::get, "/v1/summary",
                                       nullptr, options_.deadline);
    if (!a.body.is_object() || !a.body.contains("summaries") || !a.body["summaries"].is_array()) {
      throw Error(make_error_code(errc::protocol_error), "GET /v1/summary: no summaries array");
    }
    return a.body["summaries"].dump();
  });
}

void ConfigClient::announce_agent(const std::string& host, std::chrono::seconds ttl, int slots) {
  return reading("announce agent", [&] {
    if (etcd_) return etcd_->announce_agent(host, ttl, slots);
    const json body = {
        {"host", host}, {"slots", slots}, {"ttl_ms", std::chrono::milliseconds(ttl).count()}};
    connection_->call(server_, &control_key_, http::verb::put, "/v1/agents", &body,
                      options_.deadline);
    agent_host_ = host;
    agent_ttl_ = ttl;
    agent_slots_ = slots;
  });
}

void ConfigClient::keep_agent_alive() {
  if (etcd_) {
    return reading("keep agent alive", [&] { etcd_->keep_agent_alive(); });
  }
  // kf-config-server: a renewal is the same PUT; it lists the agent again when its lease ran out.
  if (!agent_host_.empty()) announce_agent(agent_host_, agent_ttl_, agent_slots_);
}

void ConfigClient::retire_agent() {
  return reading("retire agent", [&] {
    if (etcd_) return etcd_->retire_agent();
    if (agent_host_.empty()) return;
    const json body = {{"host", agent_host_}, {"ttl_ms", 0}};
    connection_->call(server_, &control_key_, http::verb::put, "/v1/agents", &body,
                      options_.deadline);
    agent_host_.clear();
  });
}

std::vector<AgentOffer> ConfigClient::live_agents() {
  return reading("live agents", [&]() -> std::vector<AgentOffer> {
    if (etcd_) return etcd_->live_agents();
    const Answer a = connection_->call(server_, &control_key_, http::verb::get, "/v1/agents",
                                       nullptr, options_.deadline);
    return agent_offers_from(a.body, "GET /v1/agents");
  });
}

std::vector<ConfigEvent> ConfigClient::get_events(std::uint64_t after_seq) {
  return reading("GET events", [&] {
    if (etcd_) return etcd_->get_events(after_seq);
    // A page at a time, until the service says no more follow (it answers at most 1000 events
    // a request).
    std::vector<ConfigEvent> events;
    std::uint64_t after = after_seq;
    for (;;) {
      const std::string target =
          "/v1/events?after=" + std::to_string(after) + "&limit=" + std::to_string(kEventPage);
      const Answer a = connection_->call(server_, &control_key_, http::verb::get, target, nullptr,
                                         options_.deadline);
      if (!a.body.is_object() || !a.body.contains("events") || !a.body["events"].is_array()) {
        throw Error(make_error_code(errc::protocol_error), "GET " + target + ": no events array");
      }
      for (const auto& j : a.body["events"]) events.push_back(event_from_json(j));
      const bool more = a.body.value("more", false);
      if (!more) return events;
      if (a.body["events"].empty() || events.back().seq <= after) {
        throw Error(make_error_code(errc::protocol_error),
                    "GET " + target + ": \"more\" follow, but the page does not move on");
      }
      after = events.back().seq;
    }
  });
}

}  // namespace kf
