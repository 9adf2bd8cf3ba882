// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient's backend for an etcd:// URL (detail::EtcdBackend; etcd.cpp), which
// ConfigClient names ConfigClient::Etcd: the operations of kf-config-server, with the same
// answers, on an etcd v3 cluster through its JSON gateway (docs/config-server.md, "etcd").
// Private to the runtime. Thread-safety: as ConfigClient's.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_client/connection.hpp"
#include "kf/cluster/cluster.hpp"
#include "kf/common/keys.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::detail {

/// KF_ETCD_USER into `user` and the first line of the file KF_ETCD_PASSWORD_FILE into
/// `password`, when set. Throws: std::invalid_argument naming the variable when one is set
/// without the other, or the file cannot be read.
void etcd_credentials_from_environment(std::string& user, std::string& password);

/// PREFIX for a job token (an etcd:// URL without a path): "/kf/" and 16 hex digits of a SHA-256
/// of the token.
std::string prefix_for_token(const std::string& token);

/// The value kf stores at etcd key `key` (the document, an event, an agent's offer), sealed:
/// {"document": TEXT, "mac": HEX64}, TEXT the JSON text and the MAC an HMAC-SHA256 under the
/// job's control key of "kf etcd value", the key and TEXT, one per line. Only a holder of the
/// token can make one that readers take, and only for that key.
std::string sealed_text(const Key& control, const std::string& key, const std::string& text);
/// The cluster document sealed for `prefix`/cluster.
std::string sealed_document(const Key& control, const std::string& prefix, const Cluster& c);
/// The TEXT of a value sealed_text made for `key` under `control`, or nullopt (with `why`) when
/// it is not one.
std::optional<std::string> unsealed_text(const Key& control, const std::string& key,
                                         const std::string& value, std::string& why);

// The job's keys under PREFIX: PREFIX/cluster holds the document (sealed_document) and
// PREFIX/events/ID one event each, its seq being the etcd revision that created it. Changes are
// transactions that compare the key's mod_revision (compare-and-swap) and write the document
// together with its cluster_changed event; a watch streams the document's next change. The members
// are tried in turn (call()).
class EtcdBackend {
 public:
  EtcdBackend(ServiceUrl url, const std::string& token, ConfigConnection& connection,
              ConfigClientOptions options);

  void cancel() noexcept { beside_.cancel(); }

  Cluster get_cluster() { return read().cluster; }
  Cluster put_cluster(const Cluster& next, const Cluster* from);
  Cluster watch(std::uint64_t after_version, std::chrono::milliseconds timeout);
  ConfigEvent post_event(const std::string& type, const std::string& worker,
                         const std::string& detail, std::optional<std::uint64_t> version);
  std::vector<ConfigEvent> get_events(std::uint64_t after_seq);

  void announce_agent(const std::string& host, std::chrono::seconds ttl, int slots);
  void keep_agent_alive();
  void retire_agent();
  std::vector<AgentOffer> live_agents();

 private:
  struct Stored {
    Cluster cluster;
    std::uint64_t mod_revision = 0;  // 0: no document yet
    std::uint64_t revision = 0;      // of the store when it was read
  };

  static json put_op(const std::string& key, const std::string& value);
  Cluster parse_document(const json& kv, const std::string& what) const;
  Stored from_range(const json& answer, const std::string& what) const;
  Stored read();
  // read() from the current member on a connection of its own, for a watch whose stream holds
  // this client's.
  Stored read_beside();
  void next_endpoint() { current_ = (current_ + 1) % endpoints_.size(); }
  // POSTs to the current member; a member that cannot be reached (or has no quorum: etcd then
  // answers 5xx) is left for the next, each tried once.
  json call(const std::string& target, const json& body);
  // `request(authorization)` with etcd's auth token when a user is set: taken first if there
  // is none yet, and once more if etcd no longer knows it (401: it expired, or the member
  // restarted). Without a user, an etcd whose authentication is on is said to need one.
  template <class Request>
  auto authorized(ConfigConnection& on, Request request);
  // /v3/auth/authenticate as the user, on the current member. Throws: Error(auth_failed) when
  // etcd refuses the user or its password.
  void authenticate(ConfigConnection& on);
  const std::string* auth() const { return auth_token_.empty() ? nullptr : &auth_token_; }

  std::vector<Endpoint> endpoints_;
  std::size_t current_ = 0;
  std::string prefix_;
  std::string cluster_key_;
  std::string events_prefix_;
  std::string agents_prefix_;
  ConfigConnection& connection_;
  ConfigConnection beside_;  // for a read while a watch's stream holds connection_ (read_beside)
  ConfigClientOptions options_;
  Key control_;             // derive_key(token, KeyUse::control): seals the documents
  std::string user_;        // etcd's user (options.etcd_user), empty without authentication
  std::string password_;    // its password
  std::string auth_token_;  // what /v3/auth/authenticate gave, empty before
  // The highest version of a document taken: an older one read later (a sealed document written
  // again by someone who recorded it) is not taken.
  mutable std::uint64_t highest_ = 0;
  std::optional<Stored> last_;  // the document as this client last read or wrote it
  std::uint64_t lease_ = 0;     // announce_agent's
  std::string agent_host_;
  std::chrono::seconds agent_ttl_{0};
  int agent_slots_ = 0;
};

}  // namespace kf::detail

namespace kf {

// The backend under the name config_client.hpp declares.
class ConfigClient::Etcd : public detail::EtcdBackend {
 public:
  using EtcdBackend::EtcdBackend;
};

}  // namespace kf
