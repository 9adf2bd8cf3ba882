// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient's etcd backend (detail::EtcdBackend, config_client/etcd.hpp): the client's
// operations on the job's keys, through etcd's v3 JSON gateway.
#include "config_client/etcd.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "kf/common/json.hpp"
#include "kf/runtime/cluster_settings.hpp"

namespace kf::detail {

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

EtcdBackend::EtcdBackend(ServiceUrl url, const std::string& token, ConfigConnection& connection,
                         ConfigClientOptions options)
    : endpoints_(std::move(url.endpoints)),
      prefix_(url.prefix.empty() ? prefix_for_token(token) : url.prefix),
      cluster_key_(prefix_ + "/cluster"),
      events_prefix_(prefix_ + "/events/"),
      agents_prefix_(prefix_ + "/agents/"),
      connection_(connection),
      beside_(connection.clock()),
      options_(options),
      control_(derive_key(token, KeyUse::control)),
      user_(options.etcd_user),
      password_(options.etcd_password) {
  beside_.set_tls(connection.tls());
}

void EtcdBackend::authenticate(ConfigConnection& on) {
  const json request = {{"name", user_}, {"password", password_}};
  try {
    const json answer = on.call(endpoints_[current_], nullptr, http::verb::post,
                                "/v3/auth/authenticate", &request, options_.deadline)
                            .body;
    auth_token_ = answer.value("token", std::string());
  } catch (const Error& e) {
    if (e.code() == errc::service_unavailable || e.code() == errc::cancelled) throw;
    throw Error(make_error_code(errc::auth_failed),
                "etcd refused the user '" + user_ + "' (KF_ETCD_USER): " + e.what());
  }
  if (auth_token_.empty()) {
    throw Error(make_error_code(errc::protocol_error), "etcd authenticate: no token in the answer");
  }
}

template <class Request>
auto EtcdBackend::authorized(ConfigConnection& on, Request request) {
  if (!user_.empty() && auth_token_.empty()) authenticate(on);
  try {
    return request(auth());
  } catch (const Error& e) {
    if (!user_.empty() && e.code() == errc::auth_failed) {
      auth_token_.clear();
      authenticate(on);
      return request(auth());
    }
    if (user_.empty() &&
        std::string_view(e.what()).find("user name is empty") != std::string_view::npos) {
      throw Error(make_error_code(errc::auth_failed),
                  std::string(e.what()) +
                      " (this etcd has authentication on: give kf its user with KF_ETCD_USER and "
                      "KF_ETCD_PASSWORD_FILE)");
    }
    throw;
  }
}

Cluster EtcdBackend::put_cluster(const Cluster& next, const Cluster* from) {
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
                                       {"value", base64(sealed_document(control_, prefix_, *from))}}
                       : current->mod_revision == 0
                           ? json{{"key", base64(cluster_key_)},
                                  {"target", "CREATE"},
                                  {"result", "EQUAL"},
                                  {"create_revision", "0"}}
                           : json{{"key", base64(cluster_key_)},
                                  {"target", "MOD"},
                                  {"result", "EQUAL"},
                                  {"mod_revision", std::to_string(current->mod_revision)}};
  const std::string event_key = events_prefix_ + random_hex(8);
  const json txn = {
      {"compare", json::array({compare})},
      {"success", json::array({put_op(cluster_key_, sealed_document(control_, prefix_, stored)),
                               put_op(event_key, sealed_text(control_, event_key, event.dump()))})},
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

Cluster EtcdBackend::watch(std::uint64_t after_version, std::chrono::milliseconds timeout) {
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
      connection_.stream(
          endpoints_[current_], "/v3/watch", request, left,
          [&](const json& m) {
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
          },
          auth());
    } catch (const Error& e) {
      if (e.code() == errc::auth_failed && !user_.empty()) {
        auth_token_.clear();  // expired meanwhile: read() authenticates again
        continue;
      }
      if (e.code() != errc::service_unavailable) throw;
      next_endpoint();
      continue;  // read again, from another member
    }
    if (seen) return *seen;
    if (lost || unread) next_endpoint();
    if (Clock::now() >= end) return read().cluster;
  }
}

ConfigEvent EtcdBackend::post_event(const std::string& type, const std::string& worker,
                                    const std::string& detail,
                                    std::optional<std::uint64_t> version) {
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
  const json txn = {
      {"compare", json::array({json{{"key", base64(key)},
                                    {"target", "CREATE"},
                                    {"result", "EQUAL"},
                                    {"create_revision", "0"}}})},
      {"success", json::array({put_op(key, sealed_text(control_, key, event.dump()))})},
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

std::vector<ConfigEvent> EtcdBackend::get_events(std::uint64_t after_seq) {
  // A page of 1000 at a time (etcd says "more" when the range held more), so that no answer
  // carries a whole long history.
  constexpr int kPage = 1000;
  std::vector<ConfigEvent> events;
  std::uint64_t after = after_seq;
  for (;;) {
    const json request = {
        {"key", base64(events_prefix_)},  {"range_end", base64(prefix_end(events_prefix_))},
        {"sort_order", "ASCEND"},         {"sort_target", "CREATE"},
        {"limit", std::to_string(kPage)}, {"min_create_revision", std::to_string(after + 1)}};
    const json answer = call("/v3/kv/range", request);
    const json kvs = answer.value("kvs", json::array());
    std::uint64_t last = after;  // the page's last event, taken or not
    for (const auto& kv : kvs) {
      last = std::max(last, int_field(kv, "create_revision"));
      const std::string key = unbase64(kv.value("key", std::string()), "etcd events");
      const std::string value = unbase64(kv.value("value", std::string()), "etcd events");
      // An event not sealed by a process of the job (written by someone without the token) is
      // no part of the job's record: it is passed over.
      std::string why;
      const auto text = unsealed_text(control_, key, value, why);
      if (!text) continue;
      const json j = parse_json_or_discard(*text);
      if (!j.is_object()) {
        throw Error(make_error_code(errc::protocol_error), "etcd events: an event is not JSON");
      }
      ConfigEvent e = event_from_json(j);
      e.seq = int_field(kv, "create_revision");
      events.push_back(std::move(e));
    }
    if (!answer.value("more", false)) return events;
    if (kvs.empty() || last <= after) {
      throw Error(make_error_code(errc::protocol_error),
                  "etcd events: \"more\" follow, but the page does not move on");
    }
    after = last;
  }
}

void EtcdBackend::announce_agent(const std::string& host, std::chrono::seconds ttl, int slots) {
  agent_host_ = host;
  agent_ttl_ = ttl;
  agent_slots_ = slots;
  const json granted = call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}});
  lease_ = int_field(granted, "ID");
  if (lease_ == 0) {
    throw Error(make_error_code(errc::protocol_error), "etcd lease grant: no lease ID");
  }
  const json record = {{"host", host}, {"slots", slots}, {"since", now_rfc3339()}};
  json put = {{"key", base64(agents_prefix_ + host)},
              {"value", base64(sealed_text(control_, agents_prefix_ + host, record.dump()))},
              {"lease", std::to_string(lease_)}};
  call("/v3/kv/put", put);
}

void EtcdBackend::keep_agent_alive() {
  if (lease_ == 0) return;
  std::uint64_t ttl = 0;
  const json request = {{"ID", std::to_string(lease_)}};
  authorized(connection_, [&](const std::string* a) {
    return connection_.stream(
        endpoints_[current_], "/v3/lease/keepalive", request, options_.deadline,
        [&](const json& m) {
          ttl = int_field(m.value("result", json::object()), "TTL");
          return true;
        },
        a);
  });
  // A lease that had expired (the agent was away for longer than its TTL) renews to nothing.
  if (ttl == 0) announce_agent(agent_host_, agent_ttl_, agent_slots_);
}

void EtcdBackend::retire_agent() {
  if (lease_ == 0) return;
  call("/v3/lease/revoke", {{"ID", std::to_string(lease_)}});
  lease_ = 0;
}

std::vector<AgentOffer> EtcdBackend::live_agents() {
  const json answer = call("/v3/kv/range", {{"key", base64(agents_prefix_)},
                                            {"range_end", base64(prefix_end(agents_prefix_))}});
  std::vector<AgentOffer> offers;
  for (const auto& kv : answer.value("kvs", json::array())) {
    const std::string key = unbase64(kv.value("key", std::string()), "etcd agents");
    if (!key.starts_with(agents_prefix_)) {
      throw Error(make_error_code(errc::protocol_error),
                  "etcd agents: the answer holds a key outside " + agents_prefix_);
    }
    // The key names the host; the value tells its slots. An offer not sealed by a process of the
    // job (written by someone without the token) is passed over.
    std::string why;
    const auto text = unsealed_text(control_, key,
                                    unbase64(kv.value("value", std::string()), "etcd agents"), why);
    if (!text) continue;
    const json j = parse_json_or_discard(*text);
    AgentOffer offer;
    if (j.is_object()) offer = agent_offer_from(j, "etcd agents");
    offer.host = key.substr(agents_prefix_.size());
    offers.push_back(std::move(offer));
  }
  return offers;
}

json EtcdBackend::put_op(const std::string& key, const std::string& value) {
  return json{{"request_put", {{"key", base64(key)}, {"value", base64(value)}}}};
}

// A document is taken only sealed under this job's key (sealed_document) and never older than
// one taken before. Anything else was written by someone without the token (or is an old one
// written again): it is not taken, and the client goes on as though etcd had not answered, so
// that the job trains on and takes the next document the job's own processes write.
Cluster EtcdBackend::parse_document(const json& kv, const std::string& what) const {
  const std::string value = unbase64(kv.value("value", std::string()), what);
  const std::string where = what + " " + cluster_key_;
  std::string why;
  const auto text = unsealed_text(control_, cluster_key_, value, why);
  if (!text) {
    throw Error(make_error_code(errc::service_unavailable),
                where + ": the document is " + why + ": not taken");
  }
  Cluster c = cluster_from(Answer{200, parse_json_or_discard(*text)}, where);
  if (c.version < highest_) {
    throw Error(make_error_code(errc::service_unavailable),
                where + ": the document went back from version " + std::to_string(highest_) +
                    " to " + std::to_string(c.version) + " (an old one written again): not taken");
  }
  highest_ = c.version;
  return c;
}

EtcdBackend::Stored EtcdBackend::from_range(const json& answer, const std::string& what) const {
  Stored s;
  s.revision = int_field(answer.value("header", json::object()), "revision");
  const json kvs = answer.value("kvs", json::array());
  if (kvs.empty()) return s;
  s.cluster = parse_document(kvs[0], what);
  s.mod_revision = int_field(kvs[0], "mod_revision");
  return s;
}

EtcdBackend::Stored EtcdBackend::read() {
  last_ = from_range(call("/v3/kv/range", {{"key", base64(cluster_key_)}}), "etcd");
  return *last_;
}

EtcdBackend::Stored EtcdBackend::read_beside() {
  const json range = {{"key", base64(cluster_key_)}};
  last_ = from_range(authorized(beside_,
                                [&](const std::string* a) {
                                  return beside_
                                      .call(endpoints_[current_], nullptr, http::verb::post,
                                            "/v3/kv/range", &range, options_.deadline, a)
                                      .body;
                                }),
                     "etcd");
  return *last_;
}

json EtcdBackend::call(const std::string& target, const json& body) {
  std::string reasons;
  for (std::size_t tried = 0; tried < endpoints_.size(); ++tried) {
    try {
      return authorized(connection_, [&](const std::string* a) {
        return connection_
            .call(endpoints_[current_], nullptr, http::verb::post, target, &body, options_.deadline,
                  a)
            .body;
      });
    } catch (const Error& e) {
      if (e.code() != errc::service_unavailable) throw;
      reasons += (reasons.empty() ? "" : "; ") + std::string(e.what());
      next_endpoint();
    }
  }
  throw Error(make_error_code(errc::service_unavailable), "no etcd member answered: " + reasons);
}

}  // namespace kf::detail
