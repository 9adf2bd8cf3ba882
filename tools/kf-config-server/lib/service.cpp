// SPDX-License-Identifier: Apache-2.0
#include "kf-config-server/lib/service.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <stdexcept>
#include <utility>

#include "kf-config-server/lib/dashboard.hpp"

#include "kf/common/fd.hpp"
#include "kf/common/json.hpp"
#include "kf/common/log.hpp"
#include "kf/runtime/cluster_settings.hpp"
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/request_signature.hpp"

namespace kf::config_server {

namespace {

using nlohmann::json;

// Replaces invalid UTF-8 (a raw request target echoed in an error) instead of throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Response error(int status, const std::string& reason) {
  return Response{status, dump(json{{"error", reason}}), "application/json", {}};
}

Response ok(int status, const json& body) {
  return Response{status, dump(body), "application/json", {}};
}

Response method_not_allowed(const std::string& allow) {
  Response r = error(405, "method not allowed; use " + allow);
  r.allow = allow;
  return r;
}

// Parses a non-negative decimal integer; nullopt when `text` is anything else.
std::optional<std::uint64_t> parse_u64(const std::string& text) {
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

// Checks the query of GET /v1/cluster. Returns the error reason, or "" when valid, and sets
// `after` when a watch asks for one.
std::string check_cluster_query(const std::string& query, bool& watch, std::uint64_t& after) {
  std::map<std::string, std::string> params;
  try {
    params = parse_query(query);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  watch = false;
  after = 0;
  for (const auto& [k, v] : params) {
    if (k == "watch") {
      if (v != "0" && v != "1") return "watch must be 0 or 1";
      watch = v == "1";
    } else if (k == "after") {
      const auto n = parse_u64(v);
      if (!n) return "after must be a non-negative integer";
      after = *n;
    } else {
      return "unknown query parameter '" + k + "'";
    }
  }
  if (params.contains("after") && !watch) return "after needs watch=1";
  return {};
}

// Checks the body of a PUT beyond what Cluster::from_json checks. Returns the reason or "".
std::string check_put_body(const json& j) {
  if (!j.is_object()) return "body must be a JSON object";
  for (const char* field : {"version", "workers", "settings"}) {
    if (!j.contains(field)) return std::string("missing field '") + field + "'";
  }
  if (j["workers"].is_array() && j["workers"].empty()) return "workers must not be empty";
  return {};
}

// Checks the body of POST /v1/events. Returns the reason or "".
std::string check_event_body(const json& j) {
  if (!j.is_object()) return "body must be a JSON object";
  for (const auto& [k, v] : j.items()) {
    if (k != "type" && k != "worker" && k != "detail" && k != "version") {
      return "unknown field '" + k + "'";
    }
  }
  if (!j.contains("type") || !j["type"].is_string()) return "type must be a string";
  if (!is_client_event_type(j["type"].get<std::string>())) {
    return "unknown event type '" + j["type"].get<std::string>() + "'";
  }
  if (j.contains("worker")) {
    if (!j["worker"].is_string()) return "worker must be a string host:port";
    try {
      Endpoint::parse(j["worker"].get<std::string>());
    } catch (const std::invalid_argument& e) {
      return std::string("worker: ") + e.what();
    }
  }
  if (j.contains("detail") && !j["detail"].is_string()) return "detail must be a string";
  if (j.contains("version") && !j["version"].is_number_unsigned()) {
    return "version must be a non-negative integer";
  }
  return {};
}

}  // namespace

std::map<std::string, std::string> parse_query(const std::string& query) {
  std::map<std::string, std::string> params;
  std::size_t start = 0;
  while (start < query.size()) {
    auto end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string item = query.substr(start, end - start);
    if (!item.empty()) {
      const auto eq = item.find('=');
      const std::string key = item.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (!params.emplace(key, value).second) {
        throw std::invalid_argument("query parameter '" + key + "' is repeated");
      }
    }
    start = end + 1;
  }
  return params;
}

namespace {

// The charting library's text, or nothing when there is no such file, it is not a regular file
// (a directory, say) or it cannot be read whole: the dashboard then shows its tables only. A
// read error would otherwise surface as the standard library's exception and stop the server.
std::string read_chart_js(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  return read_whole_file(path.string()).value_or(std::string());
}

}  // namespace

Service::Service(ServiceOptions options)
    : options_(std::move(options)),
      control_key_(derive_key(options_.token, KeyUse::control)),
      started_ms_(
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.now().time_since_epoch())
              .count()),
      state_(load_state(options_.state_file)) {
  // A log that ends in a record cut short: a fresh snapshot, so that the next record does not
  // land behind the fragment.
  if (state_.torn) {
    save_state(options_.state_file, state_);
    state_.torn = false;
    state_.logged = 0;
  }
  for (const auto& e : state_.events) metrics_.count(e);
  chart_js_ = read_chart_js(options_.chart_js);
}

Response Service::handle(const Request& request) {
  const auto q = request.target.find('?');
  const std::string path = request.target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : request.target.substr(q + 1);
  const auto& m = request.method;
  const bool mutation = m == "PUT" || m == "POST";
  if (path == "/healthz") {
    if (m != "GET") return method_not_allowed("GET");
    return ok(200, json{{"ok", true}});
  }
  // The dashboard (read-only: it reads what any reader may, the GETs below).
  if (path == "/" || path == "/chart.js") {
    if (m != "GET") return method_not_allowed("GET");
    if (path == "/")
      return Response{200, std::string(dashboard_page()), "text/html; charset=utf-8", {}};
    if (chart_js_.empty()) {  // the page then says so, without an error in the browser
      return Response{200,
                      "// No charting library at " + options_.chart_js.string() +
                          " (apt install libjs-chart.js): the dashboard shows no charts.",
                      "application/javascript",
                      {}};
    }
    return Response{200, chart_js_, "application/javascript", {}};
  }
  // The job's own series (job_metrics.hpp), for Prometheus: read-only like the dashboard.
  if (path == "/metrics") {
    if (m != "GET") return method_not_allowed("GET");
    if (!query.empty()) return error(400, "unexpected query string");
    const auto agents = agents_.live(options_.now());
    return Response{200,
                    metrics_.render(state_.cluster, state_.base_lr, agents["agents"].size()),
                    "text/plain; version=0.0.4; charset=utf-8",
                    {}};
  }
  if (path == "/v1/summary") {
    if (m != "GET" && m != "POST") return method_not_allowed("GET, POST");
    if (m == "GET") return get_summaries(query);
    if (const std::string why = signed_before_start(request.authorization); !why.empty()) {
      return error(503, why);
    }
    if (const std::string why = unauthorized(request); !why.empty()) return error(401, why);
    if (!query.empty()) return error(400, "unexpected query string");
    return post_summary(request.body);
  }
  if (path != "/v1/cluster" && path != "/v1/events" && path != "/v1/agents") {
    return error(404, "no such resource " + path);
  }
  const bool is_cluster = path == "/v1/cluster";
  const std::string write_method = is_cluster || path == "/v1/agents" ? "PUT" : "POST";
  if (m != "GET" && m != write_method) return method_not_allowed("GET, " + write_method);
  if (mutation) {
    if (const std::string why = signed_before_start(request.authorization); !why.empty()) {
      return error(503, why);
    }
    if (const std::string why = unauthorized(request); !why.empty()) return error(401, why);
    if (request.body.size() > options_.max_body_bytes) {
      return error(413, "body is over " + std::to_string(options_.max_body_bytes) + " bytes");
    }
    if (!query.empty()) return error(400, "unexpected query string");
  }
  if (is_cluster) return m == "GET" ? get_cluster(query) : put_cluster(request.body);
  if (path == "/v1/agents") {
    if (m == "PUT") return put_agent(request.body);
    if (!query.empty()) return error(400, "unexpected query string");
    return ok(200, agents_.live(options_.now()));
  }
  return m == "GET" ? get_events(query) : post_event(request.body);
}

std::optional<std::uint64_t> Service::watch_after(const Request& request) const {
  if (request.method != "GET") return std::nullopt;
  const auto q = request.target.find('?');
  if (q == std::string::npos || request.target.substr(0, q) != "/v1/cluster") return std::nullopt;
  bool watch = false;
  std::uint64_t after = 0;
  if (!check_cluster_query(request.target.substr(q + 1), watch, after).empty() || !watch) {
    return std::nullopt;
  }
  if (version() > after) return std::nullopt;
  return after;
}

Response Service::get_cluster(const std::string& query) const {
  bool watch = false;
  std::uint64_t after = 0;
  if (auto why = check_cluster_query(query, watch, after); !why.empty()) return error(400, why);
  // Every read and long-poll of one version gets the same bytes, made once (every change makes
  // a new version).
  if (served_version_ != state_.cluster.version || served_body_.empty()) {
    served_body_ = dump(state_.cluster.to_json());
    served_version_ = state_.cluster.version;
  }
  return Response{200, served_body_, "application/json", {}};
}

Response Service::put_cluster(const std::string& body) {
  const json j = parse_json_or_discard(body);
  if (j.is_discarded()) return error(400, "malformed JSON (or nested deeper than 64 levels)");
  if (auto why = check_put_body(j); !why.empty()) return error(400, why);
  Cluster proposed;
  try {
    proposed = Cluster::from_json(j);
  } catch (const std::invalid_argument& e) {
    return error(400, e.what());
  }
  // A setting kf reads must have its type: stored, a mistyped one would reach every worker.
  if (const auto parsed = parse_cluster_settings(j["settings"]); !parsed.errors.empty()) {
    std::string why;
    for (const auto& e : parsed.errors) why += (why.empty() ? "" : "; ") + e;
    return error(400, why);
  }
  const std::uint64_t current = state_.cluster.version;
  if (proposed.version != current) {
    Response r = ok(409, json{{"error", "stale version " + std::to_string(proposed.version) +
                                            ", current is " + std::to_string(current)},
                              {"current", state_.cluster.to_json()}});
    return r;
  }
  proposed.version = current + 1;
  Cluster previous = std::exchange(state_.cluster, std::move(proposed));
  const auto previous_base_lr = state_.base_lr;
  state_.note_base_lr();
  try {
    append_event(json{{"type", "cluster_changed"},
                      {"version", state_.cluster.version},
                      {"detail", std::to_string(state_.cluster.size()) +
                                     (state_.cluster.size() == 1 ? " worker" : " workers")}},
                 /*with_cluster=*/true);
  } catch (const std::runtime_error& e) {
    state_.cluster = std::move(previous);
    state_.base_lr = previous_base_lr;
    KF_LOG(err, "config-server", "{}", e.what());
    return error(500, e.what());
  }
  KF_LOG(info, "config-server", "cluster version {}: {} workers", state_.cluster.version,
         state_.cluster.size());
  return ok(200, state_.cluster.to_json());
}

Response Service::get_events(const std::string& query) const {
  std::map<std::string, std::string> params;
  try {
    params = parse_query(query);
  } catch (const std::invalid_argument& e) {
    return error(400, e.what());
  }
  std::uint64_t after = 0;
  std::uint64_t limit = kDefaultEventLimit;
  for (const auto& [k, v] : params) {
    const auto n = parse_u64(v);
    if (k == "after") {
      if (!n) return error(400, "after must be a non-negative integer");
      after = *n;
    } else if (k == "limit") {
      if (!n || *n == 0 || *n > kMaxEventLimit) {
        return error(400, "limit must be an integer from 1 to " + std::to_string(kMaxEventLimit));
      }
      limit = *n;
    } else {
      return error(400, "unknown query parameter '" + k + "'");
    }
  }
  // Events are kept in seq order: the page starts after a binary search, so that paging through
  // a long history costs each page its own events, not the whole history.
  const auto first =
      std::partition_point(state_.events.begin(), state_.events.end(),
                           [&](const json& e) { return e["seq"].get<std::uint64_t>() <= after; });
  const auto left = static_cast<std::uint64_t>(state_.events.end() - first);
  const auto count = std::min(left, limit);
  json events = json::array();
  for (auto it = first; it != first + static_cast<std::ptrdiff_t>(count); ++it)
    events.push_back(*it);
  return ok(200, json{{"events", std::move(events)}, {"more", left > count}});
}

Response Service::post_event(const std::string& body) {
  const json j = parse_json_or_discard(body);
  if (j.is_discarded()) return error(400, "malformed JSON (or nested deeper than 64 levels)");
  if (auto why = check_event_body(j); !why.empty()) return error(400, why);
  try {
    const json event = append_event(j);
    KF_LOG(info, "config-server", "event {}", event.dump());
    return ok(201, event);
  } catch (const std::runtime_error& e) {
    KF_LOG(err, "config-server", "{}", e.what());
    return error(500, e.what());
  }
}

Response Service::put_agent(const std::string& body) {
  const json j = parse_json_or_discard(body);
  if (j.is_discarded()) return error(400, "malformed JSON (or nested deeper than 64 levels)");
  if (auto why = agents_.put(j, options_.now()); !why.empty()) return error(400, why);
  return ok(200, json{{"ok", true}});
}

std::string Service::unauthorized_before_body(const std::string& auth) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.starts_with(kBearer)) {
    if (!options_.allow_bearer) {
      return "Authorization: Bearer is refused (it sends the job token); sign the request "
             "(KF-HMAC-SHA256, as kf's clients do), or start the server with --allow-bearer";
    }
    if (options_.token.empty() ||
        !equal_in_constant_time(std::string_view(auth).substr(kBearer.size()), options_.token)) {
      return "invalid bearer token";
    }
    return {};
  }
  std::string why;
  const auto sig = parse_request_signature(auth, why);
  if (!sig) {
    return "missing or invalid Authorization: sign the request with the job token "
           "(KF-HMAC-SHA256 ts=...,nonce=...,sig=...): " +
           why;
  }
  const auto off = std::chrono::duration_cast<std::chrono::milliseconds>(
      options_.now() -
      std::chrono::system_clock::time_point(std::chrono::milliseconds(sig->unix_ms)));
  if (off > options_.signature_window || -off > options_.signature_window) {
    return "the request was signed " + std::to_string(off.count()) +
           " ms from the server's time, more than the " +
           std::to_string(options_.signature_window.count()) +
           " ms allowed (a replay, or clocks out of step)";
  }
  if (seen_nonces_.contains(sig->nonce)) return "the request's nonce was used before (a replay)";
  return {};
}

std::string Service::signed_before_start(const std::string& authorization) const {
  std::string why;
  const auto sig = parse_request_signature(authorization, why);
  if (!sig || sig->unix_ms >= started_ms_) return {};
  const auto off = std::chrono::duration_cast<std::chrono::milliseconds>(
      options_.now() -
      std::chrono::system_clock::time_point(std::chrono::milliseconds(sig->unix_ms)));
  if (off > options_.signature_window) return {};  // refused for its time alone (401)
  return "the request was signed " + std::to_string(started_ms_ - sig->unix_ms) +
         " ms before this service started: the nonces it saw before are not known to it; sign "
         "the request again";
}

std::string Service::time_proof(std::string_view authorization) const {
  std::string why;
  const auto sig = parse_request_signature(authorization, why);
  if (!sig) return {};
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.now().time_since_epoch())
          .count();
  return service_time_proof(control_key_, ms, sig->nonce);
}

std::string Service::nonce_of(std::string_view authorization, std::string_view nonce_header) {
  std::string why;
  if (const auto sig = parse_request_signature(authorization, why)) return sig->nonce;
  return is_nonce(nonce_header) ? std::string(nonce_header) : std::string();
}

std::string Service::answer_mac(std::string_view method, std::string_view target,
                                std::string_view nonce, unsigned status,
                                std::string_view body) const {
  return kf::answer_mac(control_key_, method, target, nonce, status, body);
}

std::string Service::unauthorized(const Request& request) {
  if (auto why = unauthorized_before_body(request.authorization); !why.empty()) return why;
  if (request.authorization.starts_with("Bearer ")) return {};
  std::string why;
  const auto sig = parse_request_signature(request.authorization, why);
  if (!signature_matches(control_key_, *sig, request.method, request.target, request.body)) {
    return "the request's signature does not match (another job token, or an altered request)";
  }
  const auto now = options_.now();
  std::erase_if(seen_nonces_,
                [&](const auto& e) { return now - e.second > 2 * options_.signature_window; });
  const auto at = std::chrono::system_clock::time_point(std::chrono::milliseconds(sig->unix_ms));
  if (!seen_nonces_.emplace(sig->nonce, at).second) {
    return "the request's nonce was used before (a replay)";
  }
  return {};
}

nlohmann::json Service::append_event(nlohmann::json event, bool with_cluster) {
  json stamped = {{"seq", state_.next_seq}, {"time", format_rfc3339_ms(options_.now())}};
  stamped.update(event);
  append_record(options_.state_file, stamped, with_cluster ? &state_.cluster : nullptr);
  state_.events.push_back(stamped);
  metrics_.count(stamped);
  ++state_.next_seq;
  if (++state_.logged >= options_.snapshot_every) {
    try {
      save_state(options_.state_file, state_);
      state_.logged = 0;
    } catch (const std::runtime_error& e) {
      // The records are safe in the log; the next change tries again.
      KF_LOG(warn, "config-server", "{}", e.what());
    }
  }
  return stamped;
}

// POST /v1/summary: one JSON object of at most kMaxSummaryBytes with a "step" (rank 0's agreed
// values); stamped with seq and time and kept among the newest kMaxSummaries.
Response Service::post_summary(const std::string& body) {
  if (body.size() > kMaxSummaryBytes) {
    return error(413, "a summary is over " + std::to_string(kMaxSummaryBytes) + " bytes");
  }
  json j = parse_json_or_discard(body);
  if (j.is_discarded()) return error(400, "malformed JSON (or nested deeper than 64 levels)");
  if (!j.is_object()) return error(400, "a summary must be a JSON object");
  const auto step = j.find("step");
  if (step == j.end() || !step->is_number_integer() || step->get<std::int64_t>() < 0) {
    return error(400, "a summary needs \"step\": a non-negative integer");
  }
  j["seq"] = ++summary_seq_;
  j["time"] = format_rfc3339_ms(options_.now());
  summaries_.push_back(std::move(j));
  while (summaries_.size() > kMaxSummaries) summaries_.pop_front();
  return ok(201, json{{"seq", summary_seq_}});
}

// GET /v1/summary[?after=SEQ]: {"summaries": [...]} oldest first, those with seq > SEQ.
Response Service::get_summaries(const std::string& query) const {
  std::uint64_t after = 0;
  try {
    for (const auto& [k, v] : parse_query(query)) {
      if (k != "after") return error(400, "unknown query parameter '" + k + "'");
      const auto n = parse_u64(v);
      if (!n) return error(400, "after must be a non-negative integer");
      after = *n;
    }
  } catch (const std::invalid_argument& e) {
    return error(400, e.what());
  }
  json out = json::array();
  for (const json& s : summaries_) {
    if (s["seq"].get<std::uint64_t>() > after) out.push_back(s);
  }
  return ok(200, json{{"summaries", std::move(out)}});
}

}  // namespace kf::config_server
