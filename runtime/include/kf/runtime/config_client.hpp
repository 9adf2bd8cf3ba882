// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient: a blocking HTTP/1.1 client of the config service (docs/config-server.md): read,
// long-poll and compare-and-swap the cluster document, post and read events. The service is
// kf-config-server ("http://HOST:PORT") or an etcd v3 cluster ("etcd://HOST:PORT,...", through
// etcd's JSON gateway; docs/config-server.md, "etcd"), with the same operations and answers.
// Each request opens its own connection and has a deadline; the calling thread drives the
// client's one io_context, which lives as long as the client. Asio and Beast stay in the .cpp.
// Thread-safety: one object may not be used from two threads at once, except cancel(), which any
// thread may call at any time (distinct objects may be used from distinct threads).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/common/error.hpp"
#include "kf/common/keys.hpp"

namespace kf {

/// Thrown by ConfigClient::put_cluster when the version moved on (HTTP 409); code() is
/// errc::conflict and current() is the document the server holds now.
class ConflictError : public Error {
 public:
  ConflictError(const std::string& what, Cluster current)
      : Error(make_error_code(errc::conflict), what), current_(std::move(current)) {}
  const Cluster& current() const noexcept { return current_; }

 private:
  Cluster current_;
};

/// One entry of the service's audit trail.
struct ConfigEvent {
  std::uint64_t seq = 0;
  std::string time;    ///< RFC 3339 UTC, set by the server
  std::string type;    ///< added, removed, revoked, killed, resized, cluster_changed, ...
  std::string worker;  ///< "host:port" or empty
  std::string detail;
  std::optional<std::uint64_t> version;
};

/// An agent listed as alive (ConfigClient::live_agents) and the slots it offers.
struct AgentOffer {
  std::string host;
  int slots = 0;      ///< the agent's --slots: the most workers it runs at once
  std::string since;  ///< RFC 3339 UTC: when its lease began
  bool operator==(const AgentOffer&) const = default;
};

/// The event types a client may post (docs/config-server.md describes each); the service itself
/// writes "cluster_changed".
bool is_client_event_type(std::string_view type) noexcept;

/// A parsed config service URL.
struct ServiceUrl {
  enum class Kind { http, etcd };
  Kind kind = Kind::http;
  std::vector<Endpoint> endpoints;  ///< http: one; etcd: the members, in the order given
  /// etcd: the key prefix of the job's keys ("/kf/..."); empty: derived from the job token.
  std::string prefix;
  /// etcds://: the members are reached over TLS.
  bool tls = false;
};

struct ConfigClientOptions {
  /// Deadline of each request: connect, send and read the answer. A long-poll waits up to the
  /// timeout given to watch() instead.
  std::chrono::milliseconds deadline{5000};
  /// This process's clock (a shifted one in tests; empty: the system clock). kf-config-server
  /// checks that a mutation was signed within a minute of its own clock, and tells its clock in
  /// the answer to each signed request, under a MAC bound to its nonce (request_signature.hpp):
  /// the client signs in the service's time once it has heard it, and a mutation refused
  /// because this clock is off (or jumped) is signed again in the service's time and sent once
  /// more.
  std::function<std::chrono::system_clock::time_point()> now;
  /// An etcd whose authentication is on: the user kf's requests are made as, and its password
  /// (etcd's /v3/auth/authenticate gives the token each request then carries). Both empty: from
  /// KF_ETCD_USER and the first line of the file KF_ETCD_PASSWORD_FILE, when set.
  std::string etcd_user;
  std::string etcd_password;
  /// etcds://: the authority that signed the members' certificates (PEM; empty: the system's),
  /// and this client's certificate and key for an etcd that asks for one (PEM, both or
  /// neither). All empty: from KF_ETCD_CA_FILE, KF_ETCD_CERT_FILE and KF_ETCD_KEY_FILE.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
};

class ConfigClient {
 public:
  /// `url` is "http://HOST:PORT" (optionally with a trailing "/"; IPv6 as "[::1]") or
  /// "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" ("etcds://" over TLS); `token` is the job token,
  /// from which the key that signs mutations (kf-config-server; the token itself is never sent) and
  /// the job's key prefix (etcd, without PREFIX) are derived. Throws: std::invalid_argument naming
  /// the URL when it is not of either form, or naming KF_ETCD_USER or KF_ETCD_PASSWORD_FILE when
  /// one is set without the other or the file cannot be read.
  ConfigClient(std::string_view url, std::string token, ConfigClientOptions options = {});
  ~ConfigClient();
  ConfigClient(ConfigClient&&) noexcept;
  ConfigClient& operator=(ConfigClient&&) noexcept;

  /// Cuts short the request in flight, if any, and every later one: they throw kf::Error with
  /// errc::cancelled. Thread-safe; for stopping a thread that waits in a long-poll.
  void cancel() noexcept;

  /// The host and port of a "http://HOST:PORT" URL (brackets of an IPv6 host removed). Throws:
  /// std::invalid_argument naming the URL.
  static Endpoint parse_url(std::string_view url);

  /// Parses either kind of URL (see the constructor). Throws: std::invalid_argument naming the
  /// URL and what is wrong with it.
  static ServiceUrl parse_service_url(std::string_view url);

  /// The service (etcd: the first member given).
  const Endpoint& server() const noexcept { return server_; }

  // Throws (all requests): kf::Error with errc::service_unavailable when the server cannot be
  // reached, breaks the connection or misses the deadline (or answers 5xx); errc::auth_failed on
  // 401; errc::invalid_argument on 400 or 413; errc::protocol_error for an unexpected answer;
  // errc::cancelled after cancel(). The message holds the server's reason.

  /// GET /v1/cluster.
  Cluster get_cluster();

  /// PUT /v1/cluster: stores `next` (whose version must be the current one) as version + 1 and
  /// returns the stored document. Throws: ConflictError (errc::conflict) on 409, carrying the
  /// current document; see above. `from`, if given, is the document `next` was edited from, as
  /// the caller holds it: with etcd, a client that has not read the document then compares the
  /// stored one with it inside the write instead of reading first (kf-config-server compares
  /// versions either way).
  Cluster put_cluster(const Cluster& next, const Cluster* from = nullptr);

  /// Long-polls until the version is greater than `after_version` or `timeout` has passed (then it
  /// reads the document once more, within the ordinary deadline); returns the current document,
  /// whose version is <= after_version only on timeout.
  Cluster watch(std::uint64_t after_version, std::chrono::milliseconds timeout);

  /// POST /v1/events; `worker` and `detail` are left out when empty. Returns the stored event.
  ConfigEvent post_event(const std::string& type, const std::string& worker,
                         const std::string& detail, std::optional<std::uint64_t> version);

  /// POST /v1/summary: `json_object` (a JSON object with a "step"), the job's summary for the
  /// dashboard. Returns false, sending nothing, with etcd (which keeps no summaries).
  bool post_summary(const std::string& json_object);
  /// GET /v1/summary: the job's summaries the service keeps (its newest ones), as the JSON text
  /// of their array, oldest first; "[]" with etcd.
  std::string get_summaries();

  /// GET /v1/events?after=SEQ: the events with seq > `after_seq`, oldest first.
  std::vector<ConfigEvent> get_events(std::uint64_t after_seq = 0);

  // ---- agent liveness and offered slots ----

  /// Lists `host`'s agent as alive, offering `slots`, under a lease of `ttl` (etcd: a lease on
  /// key PREFIX/agents/HOST; kf-config-server: PUT /v1/agents, kept in its memory), for as long
  /// as keep_agent_alive() renews it within each ttl.
  void announce_agent(const std::string& host, std::chrono::seconds ttl, int slots);
  /// Renews the lease of announce_agent(); announces again when it had expired.
  void keep_agent_alive();
  /// Ends the lease at once: the host is no longer listed.
  void retire_agent();
  /// The agents alive now, by host.
  std::vector<AgentOffer> live_agents();

 private:
  class Connection;  // the io_context and the cancellation flag
  class Etcd;        // the etcd backend, when the URL is etcd://

  Endpoint server_;
  std::string token_;
  Key control_key_;  // derive_key(token_, KeyUse::control): signs the mutations
  ConfigClientOptions options_;
  std::unique_ptr<Connection> connection_;
  std::unique_ptr<Etcd> etcd_;
  // kf-config-server: what announce_agent() listed, for keep_agent_alive() and retire_agent().
  std::string agent_host_;
  std::chrono::seconds agent_ttl_{0};
  int agent_slots_ = 0;
};

}  // namespace kf
