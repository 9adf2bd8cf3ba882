// SPDX-License-Identifier: Apache-2.0
// The config service without its transport: routing, authentication, validation, the
// compare-and-swap on the cluster document and the audit trail of events. The HTTP server
// (http_server.hpp) turns each HTTP request into a Request, calls Service::handle() and writes
// the Response back; long-polls wait outside (see watch_after()).
// Ownership: a Service owns its State and writes it to the state file after every change.
// Thread-safety: none; the server calls it from its I/O thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kf-config-server/lib/agents.hpp"
#include "kf-config-server/lib/job_metrics.hpp"
#include "kf-config-server/lib/state.hpp"
#include "kf/common/keys.hpp"

namespace kf::config_server {

/// One HTTP request, as far as the service cares.
struct Request {
  std::string method;         ///< "GET", "PUT", ...
  std::string target;         ///< path and query: "/v1/cluster?watch=1&after=3"
  std::string authorization;  ///< the Authorization header, empty when absent
  std::string body;
};

/// One HTTP response: a status and a JSON body (errors are {"error": "reason"}).
struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::string allow;  ///< the Allow header of a 405, empty otherwise
};

/// GET /v1/events answers at most this many events without a `limit`, and accepts a `limit` up
/// to kMaxEventLimit: one answer never serialises a whole long history on the I/O thread.
inline constexpr std::uint64_t kDefaultEventLimit = 1000;
inline constexpr std::uint64_t kMaxEventLimit = 10'000;

/// The job's summaries (POST /v1/summary, rank 0's agreed values every second or so, for the
/// dashboard): the newest kMaxSummaries are kept, in memory only, each at most
/// kMaxSummaryBytes; a flood of posts costs no more memory than that.
inline constexpr std::size_t kMaxSummaries = 600;
inline constexpr std::size_t kMaxSummaryBytes = 16 * 1024;

struct ServiceOptions {
  std::filesystem::path state_file;
  /// The job token: mutations must be signed with the control key derived from it
  /// (kf/runtime/request_signature.hpp).
  std::string token;
  /// Also accept "Authorization: Bearer TOKEN", which sends the token itself (for curl by hand
  /// on a trusted network; kf's own clients always sign).
  bool allow_bearer = false;
  /// How far a signed request's time may be from the server's clock (either way); its nonce is
  /// remembered for twice as long, so a replay is refused until the time check refuses it too.
  std::chrono::milliseconds signature_window{60'000};
  std::size_t max_body_bytes = std::size_t{1} << 20;  ///< larger bodies get 413
  /// A snapshot of the state after this many records in its log (state.hpp).
  std::size_t snapshot_every = kSnapshotEvery;
  /// The dashboard's charting library (Chart.js 3, a UMD build), served at /chart.js when the
  /// file is there: Debian's libjs-chart.js by default. Read once, when the service starts.
  std::filesystem::path chart_js = "/usr/share/javascript/chart.js/chart.min.js";
  /// The clock events are stamped with (a fixed clock in tests).
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
};

class Service {
 public:
  /// Loads the state file, or starts from version 0 with no workers and no events when it does
  /// not exist. Throws: std::runtime_error naming the file and what is wrong with it (unreadable,
  /// not JSON, not a valid state).
  explicit Service(ServiceOptions options);

  /// Answers one request. Writes the state file before answering a successful mutation; when
  /// that write fails the answer is 500 and nothing changes. Never throws for a bad request.
  Response handle(const Request& request);

  /// For a long-poll (GET /v1/cluster?watch=1&after=V) that should wait because the current
  /// version is not yet past V: V. Otherwise nullopt (handle() answers at once). The server waits
  /// until version() changes or its watch timeout passes, then calls handle(), which answers
  /// with the current document.
  std::optional<std::uint64_t> watch_after(const Request& request) const;

  /// What can be told of a mutation's credentials from its Authorization header alone, before
  /// its body is read: why it will be refused (no header, another scheme, a malformed
  /// signature, a time outside the window, a nonce seen before, a wrong bearer token), or "".
  /// The signature itself, which covers the body, is checked by handle().
  std::string unauthorized_before_body(const std::string& authorization) const;

  /// Why a signed request is refused with 503 (to be signed again), or "": it was signed before
  /// this service started, within the signature window. The nonces of requests accepted before
  /// a restart are not kept, so such a request might be a replay of one; a client that sent it
  /// in good faith signs it again, in the time this answer tells it.
  std::string signed_before_start(const std::string& authorization) const;

  std::uint64_t version() const noexcept { return state_.cluster.version; }
  /// The X-KF-Time value for the answer to a request whose Authorization is `authorization`: the
  /// service's clock, under a MAC bound to the request's nonce (request_signature.hpp); empty
  /// when the request is not signed in kf's scheme.
  std::string time_proof(std::string_view authorization) const;
  /// The nonce an answer is bound to: a signed request's (in `authorization`), else the
  /// request's X-KF-Nonce header `nonce_header` when it is one; "" when the request has none.
  static std::string nonce_of(std::string_view authorization, std::string_view nonce_header);
  /// The X-KF-Answer value of an answer with `status` and `body` (as sent) to the request
  /// `method` `target` with `nonce` (request_signature.hpp).
  std::string answer_mac(std::string_view method, std::string_view target, std::string_view nonce,
                         unsigned status, std::string_view body) const;
  const State& state() const noexcept { return state_; }

 private:
  Response get_cluster(const std::string& query) const;
  Response put_cluster(const std::string& body);
  Response get_events(const std::string& query) const;
  Response post_event(const std::string& body);
  Response put_agent(const std::string& body);
  Response post_summary(const std::string& body);
  Response get_summaries(const std::string& query) const;
  /// Why a mutation is not authorized, or "" when it is (a valid, fresh, unseen signature, or
  /// the bearer token where allowed). Remembers the nonce of an accepted signature.
  std::string unauthorized(const Request& request);
  /// Appends `event` (stamped with seq and time), with the cluster document when
  /// `with_cluster`, to the state's log (append_record) and then to the state; a snapshot every
  /// kSnapshotEvery records. On failure nothing changes. Throws: std::runtime_error from
  /// append_record().
  nlohmann::json append_event(nlohmann::json event, bool with_cluster = false);

  ServiceOptions options_;
  Key control_key_;          // derive_key(options_.token, KeyUse::control)
  std::int64_t started_ms_;  // options_.now() when this service started, Unix milliseconds
  // Nonces of accepted signatures, until they are older than twice the signature window.
  std::map<std::string, std::chrono::system_clock::time_point> seen_nonces_;
  State state_;
  // The document as last served, and its version: serialised once per version.
  mutable std::uint64_t served_version_ = 0;
  mutable std::string served_body_;
  JobMetrics metrics_;  // counted from every event, those loaded with the state included
  AgentTable agents_;   // in memory only: agents renew their leases every few seconds
  // The newest summaries, each stamped with seq and time (in memory only).
  std::deque<nlohmann::json> summaries_;
  std::uint64_t summary_seq_ = 0;
  std::string chart_js_;  // options_.chart_js's content, or empty
};

/// Splits "a=1&b=2" into pairs; the values are not percent-decoded (kf never needs it).
/// Throws: std::invalid_argument for a repeated key.
std::map<std::string, std::string> parse_query(const std::string& query);

}  // namespace kf::config_server
