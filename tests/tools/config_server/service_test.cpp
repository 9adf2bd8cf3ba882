// SPDX-License-Identifier: Apache-2.0
// The config service without sockets: routing, every status code, compare-and-swap, the audit
// trail, and the state file (round trip, corrupt file, failed write). Unit suite: a fixed clock,
// files in a temporary directory.
#include "kf-config-server/lib/service.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <tuple>

#include <stdlib.h>
#include "kf/runtime/atomic_file.hpp"
#include "kf/runtime/request_signature.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kf-config-server/lib/job_metrics.hpp"
#include "kf-config-server/lib/listen_address.hpp"
#include "kf-config-server/lib/state.hpp"

namespace kf::config_server {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kToken = "s3cret-token";
constexpr std::int64_t kNowMs = 1'700'000'000'789;
// 2023-11-14T22:13:20.789Z
const auto kNow = std::chrono::system_clock::time_point(std::chrono::milliseconds(kNowMs));

// The Authorization value kf's clients send: signed with the job's control key, now.
std::string signed_for(const std::string& method, const std::string& target,
                       const std::string& body, std::int64_t at_ms = kNowMs,
                       const std::string& token = kToken) {
  return sign_request(derive_key(token, KeyUse::control), method, target, body, at_ms);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json two_workers(std::uint64_t version) {
  return {{"version", version},
          {"workers",
           {{{"host", "127.0.0.1"}, {"port", 10001}, {"slot", 0}},
            {{"host", "127.0.0.1"}, {"port", 10002}, {"slot", 1}}}},
          {"settings", {{"algorithm", "ring"}, {"batch_size", 64}}}};
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kf-config-server-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    state_file_ = dir_ / "state.json";
  }
  void TearDown() override { fs::remove_all(dir_); }

  ServiceOptions options() const {
    ServiceOptions o;
    o.state_file = state_file_;
    o.token = kToken;
    o.max_body_bytes = 4096;
    o.now = [] { return kNow; };
    return o;
  }

  static Response put(Service& s, const json& body, std::optional<std::string> auth = {}) {
    const std::string text = body.dump();
    return s.handle(
        {"PUT", "/v1/cluster", auth ? *auth : signed_for("PUT", "/v1/cluster", text), text});
  }
  static Response get(Service& s, const std::string& target) {
    return s.handle({"GET", target, "", ""});
  }
  static Response post_event(Service& s, const std::string& body,
                             std::optional<std::string> auth = {}) {
    return s.handle(
        {"POST", "/v1/events", auth ? *auth : signed_for("POST", "/v1/events", body), body});
  }

  // What the state holds on disk: the snapshot and the log.
  std::string on_disk() const {
    return read_file(state_file_) + "\n--- log\n" + read_file(log_file(state_file_));
  }

  fs::path dir_;
  fs::path state_file_;
};

TEST_F(ServiceTest, HealthzAnswersOk) {
  Service s(options());
  const auto r = get(s, "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body), (json{{"ok", true}}));
  EXPECT_EQ(r.content_type, "application/json");
}

TEST_F(ServiceTest, UnknownPathIs404) {
  Service s(options());
  const auto r = get(s, "/v2/cluster");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(json::parse(r.body).contains("error"));
  // A target that is not UTF-8 is echoed with replacement characters, not an exception.
  EXPECT_EQ(get(s, "/\xff\xfe").status, 404);
  EXPECT_EQ(get(s, "/v1/events?\xff=1").status, 400);
}

TEST_F(ServiceTest, WrongMethodIs405WithAllow) {
  Service s(options());
  EXPECT_EQ(s.handle({"DELETE", "/v1/cluster", signed_for("DELETE", "/v1/cluster", ""), ""}).allow,
            "GET, PUT");
  EXPECT_EQ(s.handle({"DELETE", "/v1/cluster", signed_for("DELETE", "/v1/cluster", ""), ""}).status,
            405);
  EXPECT_EQ(s.handle({"POST", "/v1/cluster", "", two_workers(0).dump()}).status, 405);
  EXPECT_EQ(s.handle({"PUT", "/v1/events", "", "{}"}).status, 405);
  EXPECT_EQ(s.handle({"POST", "/healthz", "", ""}).status, 405);
  EXPECT_EQ(s.version(), 0u);
}

TEST_F(ServiceTest, StartsAtVersionZeroWithNoWorkers) {
  Service s(options());
  const auto r = get(s, "/v1/cluster");
  ASSERT_EQ(r.status, 200);
  const auto doc = json::parse(r.body);
  EXPECT_EQ(doc["version"], 0);
  EXPECT_TRUE(doc["workers"].empty());
  EXPECT_TRUE(doc["settings"].is_object());
}

TEST_F(ServiceTest, PutWithCurrentVersionStoresNextVersion) {
  Service s(options());
  const auto r = put(s, two_workers(0));
  ASSERT_EQ(r.status, 200) << r.body;
  const auto doc = json::parse(r.body);
  EXPECT_EQ(doc["version"], 1);
  EXPECT_EQ(doc["workers"].size(), 2u);
  EXPECT_EQ(doc["settings"]["algorithm"], "ring");
  EXPECT_EQ(json::parse(get(s, "/v1/cluster").body), doc);
  EXPECT_EQ(put(s, two_workers(1)).status, 200);
  EXPECT_EQ(s.version(), 2u);
}

TEST_F(ServiceTest, PutWithStaleVersionIs409WithCurrentDocument) {
  Service s(options());
  ASSERT_EQ(put(s, two_workers(0)).status, 200);
  const std::string before = on_disk();
  for (std::uint64_t stale : {0u, 2u, 7u}) {
    const auto r = put(s, two_workers(stale));
    EXPECT_EQ(r.status, 409);
    const auto body = json::parse(r.body);
    EXPECT_EQ(body["error"], "stale version " + std::to_string(stale) + ", current is 1");
    EXPECT_EQ(body["current"]["version"], 1);
  }
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(on_disk(), before);
}

TEST_F(ServiceTest, MutationsWithoutTheTokenAre401) {
  Service s(options());
  for (const std::string auth :
       {"", "Bearer", "Bearer ", "Bearer wrong", "Bearer s3cret-toke", "Bearer s3cret-token2",
        "Basic s3cret-token", "s3cret-token", "bearer s3cret-token", "Bearer s3cret-token",
        "KF-HMAC-SHA256", "KF-HMAC-SHA256 ts=1,nonce=00,sig=00"}) {
    EXPECT_EQ(put(s, two_workers(0), auth).status, 401) << auth;
    EXPECT_EQ(post_event(s, R"({"type":"note"})", auth).status, 401) << auth;
  }
  EXPECT_EQ(s.version(), 0u);
  EXPECT_FALSE(fs::exists(state_file_) || fs::exists(log_file(state_file_)));
  // Reads need no token.
  EXPECT_EQ(get(s, "/v1/cluster").status, 200);
  EXPECT_EQ(get(s, "/v1/events").status, 200);
}

// A signature proves the token without sending it; it covers the method, target, time, nonce and
// body; it is accepted once, and only near the server's time.
// The service's clock in an answer (X-KF-Time) is bound to the request's nonce by a MAC under the
// control key: a client takes it only for its own request, and nobody without the token can
// make it sign in another time.
TEST_F(ServiceTest, TheServiceTimeIsToldOnlyToSignedRequestsAndBoundToTheirNonce) {
  Service s(options());
  const Key control = derive_key(kToken, KeyUse::control);
  const std::string auth = signed_for("PUT", "/v1/cluster", "{}", kNowMs - 3'600'000);
  std::string why;
  const auto sig = parse_request_signature(auth, why);
  ASSERT_TRUE(sig) << why;
  const std::string proof = s.time_proof(auth);
  EXPECT_EQ(read_service_time(control, proof, sig->nonce), kNowMs);
  EXPECT_FALSE(read_service_time(control, proof, std::string(32, '0'))) << "another nonce";
  EXPECT_FALSE(read_service_time(derive_key("other", KeyUse::control), proof, sig->nonce));
  std::string later = proof;
  later[0] = later[0] == '9' ? '8' : '9';  // another time, the same MAC
  EXPECT_FALSE(read_service_time(control, later, sig->nonce));
  for (const char* bad : {"", "123", "x,mac=00", "-5,mac=00", "123,mac="}) {
    EXPECT_FALSE(read_service_time(control, bad, sig->nonce)) << bad;
  }
  EXPECT_TRUE(s.time_proof("").empty());
  EXPECT_TRUE(s.time_proof("Bearer " + std::string(kToken)).empty());
}

TEST_F(ServiceTest, SignedMutationsAreCheckedAndNotReplayable) {
  Service s(options());
  const std::string body = two_workers(0).dump();
  const std::string good = signed_for("PUT", "/v1/cluster", body);
  const auto reason = [](const Response& r) {
    return json::parse(r.body)["error"].get<std::string>();
  };
  // Another token, another method, target or body: refused.
  for (const auto& [method, target, text, auth] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string>>{
           {"PUT", "/v1/cluster", body, signed_for("PUT", "/v1/cluster", body, kNowMs, "other")},
           {"PUT", "/v1/cluster", body, signed_for("POST", "/v1/cluster", body)},
           {"PUT", "/v1/cluster", body, signed_for("PUT", "/v1/events", body)},
           {"PUT", "/v1/cluster", body + " ", good}}) {
    const Response r = s.handle({method, target, auth, text});
    EXPECT_EQ(r.status, 401);
    EXPECT_NE(reason(r).find("signature does not match"), std::string::npos) << reason(r);
  }
  // Too far from the server's time either way.
  for (const std::int64_t off : {-61'000, 61'000}) {
    const Response r = s.handle(
        {"PUT", "/v1/cluster", signed_for("PUT", "/v1/cluster", body, kNowMs + off), body});
    EXPECT_EQ(r.status, 401);
    EXPECT_NE(reason(r).find("ms from the server's time"), std::string::npos) << reason(r);
  }
  EXPECT_EQ(s.version(), 0u);
  // Accepted once; the same request again is a replay.
  EXPECT_EQ(s.handle({"PUT", "/v1/cluster", good, body}).status, 200);
  const Response again = s.handle({"PUT", "/v1/cluster", good, body});
  EXPECT_EQ(again.status, 401);
  EXPECT_NE(reason(again).find("nonce was used before"), std::string::npos) << reason(again);
  EXPECT_EQ(s.version(), 1u);
  // Bearer is refused, saying why, unless the server allows it.
  const Response bearer = post_event(s, R"({"type":"note"})", std::string("Bearer ") + kToken);
  EXPECT_EQ(bearer.status, 401);
  EXPECT_NE(reason(bearer).find("--allow-bearer"), std::string::npos) << reason(bearer);
  ServiceOptions o = options();
  o.allow_bearer = true;
  o.state_file = dir_ / "other.json";
  Service lenient(o);
  EXPECT_EQ(post_event(lenient, R"({"type":"note"})", std::string("Bearer ") + kToken).status, 201);
  EXPECT_EQ(post_event(lenient, R"({"type":"note"})", std::string("Bearer x")).status, 401);
}

// The nonces a service accepted are not kept across a restart: a request signed before the
// service (re)started is refused with 503, to be signed again, rather than taken as new, so a
// mutation recorded before a restart cannot be replayed after it (nor an event stored twice).
TEST_F(ServiceTest, ARequestSignedBeforeARestartIsNotTakenAfterIt) {
  const std::string event = R"({"type":"note","detail":"once"})";
  const std::string auth = signed_for("POST", "/v1/events", event, kNowMs - 5'000);
  ServiceOptions before = options();
  before.now = [] { return kNow - std::chrono::seconds(10); };
  {
    Service s(before);
    EXPECT_EQ(post_event(s, event, auth).status, 201);
    EXPECT_EQ(post_event(s, event, auth).status, 401) << "a replay, while it remembers the nonce";
  }
  Service restarted(options());  // the same state file, started at kNow
  const Response replayed = post_event(restarted, event, auth);
  EXPECT_EQ(replayed.status, 503);
  EXPECT_NE(replayed.body.find("before this service started"), std::string::npos) << replayed.body;
  const json events = json::parse(get(restarted, "/v1/events").body)["events"];
  int notes = 0;
  for (const auto& e : events) notes += e["type"] == "note";
  EXPECT_EQ(notes, 1) << events.dump();
  // Signed again, now: taken.
  EXPECT_EQ(post_event(restarted, event).status, 201);
}

TEST_F(ServiceTest, BodyOverTheLimitIs413) {
  Service s(options());
  json doc = two_workers(0);
  doc["settings"]["padding"] = std::string(5000, 'x');
  EXPECT_EQ(put(s, doc).status, 413);
  EXPECT_EQ(post_event(s, std::string(5000, ' ') + R"({"type":"note"})").status, 413);
  EXPECT_EQ(s.version(), 0u);
}

class InvalidPutTest : public ServiceTest,
                       public ::testing::WithParamInterface<std::pair<const char*, std::string>> {};

TEST_P(InvalidPutTest, Is400WithAReasonAndChangesNothing) {
  Service s(options());
  ASSERT_EQ(put(s, two_workers(0)).status, 200);
  const std::string before = on_disk();
  const auto r = s.handle({"PUT", "/v1/cluster",
                           signed_for("PUT", "/v1/cluster", GetParam().second), GetParam().second});
  EXPECT_EQ(r.status, 400) << r.body;
  const auto body = json::parse(r.body);
  ASSERT_TRUE(body.contains("error"));
  EXPECT_NE(body["error"].get<std::string>().find(GetParam().first), std::string::npos)
      << body["error"];
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(on_disk(), before);
  EXPECT_EQ(json::parse(get(s, "/v1/events").body)["events"].size(), 1u);
}

std::string with(const std::string& key, const json& value) {
  json doc = two_workers(1);
  doc[key] = value;
  return doc.dump();
}

// A field nested 100 levels deep (a million would overflow the stack of whatever copied or
// printed it; the body limit of these tests is 4 KiB).
std::string deep_field() {
  std::string doc = two_workers(1).dump();
  doc.pop_back();  // the closing brace
  return doc + R"(,"x":)" + std::string(100, '[') + std::string(100, ']') + "}";
}

std::string without(const std::string& key) {
  json doc = two_workers(1);
  doc.erase(key);
  return doc.dump();
}

INSTANTIATE_TEST_SUITE_P(
    ServiceTest, InvalidPutTest,
    ::testing::Values(
        std::pair{"malformed JSON", std::string(R"({"version": 1, "workers": [)")},
        std::pair{"malformed JSON", std::string("")}, std::pair{"object", std::string("[1, 2]")},
        std::pair{"'version'", without("version")}, std::pair{"'workers'", without("workers")},
        std::pair{"'settings'", without("settings")},
        std::pair{"unknown field 'epoch'", with("epoch", 3)},
        std::pair{"version", with("version", "1")}, std::pair{"version", with("version", -1)},
        std::pair{"workers must not be empty", with("workers", json::array())},
        std::pair{"workers must be an array", with("workers", "127.0.0.1:1")},
        std::pair{"settings must be an object", with("settings", json::array())},
        std::pair{"duplicate worker 127.0.0.1:10001",
                  with("workers", {{{"host", "127.0.0.1"}, {"port", 10001}},
                                   {{"host", "127.0.0.1"}, {"port", 10001}, {"slot", 1}}})},
        std::pair{"port", with("workers", {{{"host", "127.0.0.1"}, {"port", 0}}})},
        std::pair{"port", with("workers", {{{"host", "127.0.0.1"}, {"port", 65536}}})},
        std::pair{"port", with("workers", {{{"host", "127.0.0.1"}, {"port", "80"}}})},
        std::pair{"host", with("workers", {{{"host", ""}, {"port", 80}}})},
        std::pair{"workers[0].host is a host with character 0x20",
                  with("workers", {{{"host", "h h"}, {"port", 80}}})},
        std::pair{"agents[0].host is a host with character 0x2f",
                  with("agents", {{{"host", "a/b"}, {"port", 9000}}})},
        std::pair{"unknown field 'rank'",
                  with("workers", {{{"host", "h"}, {"port", 80}, {"rank", 0}}})},
        std::pair{"slot", with("workers", {{{"host", "h"}, {"port", 80}, {"slot", -1}}})},
        std::pair{"agents", with("agents", "h:1")},
        std::pair{"nested deeper than 64 levels", deep_field()}));

TEST_F(ServiceTest, MistypedSettingIs400NamingTheKeyAndTheExpectedType) {
  Service s(options());
  json body = two_workers(0);
  body["settings"]["max_workers"] = "8";
  const auto r = put(s, body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"],
            "settings.max_workers: expected an integer >= 0, got \"8\"");
  body["settings"] = {{"lr", "fast"}, {"stop", 1}, {"min_workers", 2}};
  EXPECT_EQ(json::parse(put(s, body).body)["error"],
            "settings.lr: expected a finite number, got \"fast\"; "
            "settings.stop: expected true or false, got 1");
  EXPECT_EQ(s.version(), 0u);
  // Keys kf does not read are the writer's own and pass as they are.
  body["settings"] = {{"max_workers", 8}, {"note", "from a script"}};
  EXPECT_EQ(put(s, body).status, 200);
  EXPECT_EQ(s.version(), 1u);
}

TEST_F(ServiceTest, AcceptsAgents) {
  Service s(options());
  json doc = two_workers(0);
  doc["agents"] = {{{"host", "127.0.0.1"}, {"port", 9000}}};
  const auto r = put(s, doc);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["agents"][0]["port"], 9000);
}

TEST_F(ServiceTest, WatchWaitsOnlyWhileVersionIsNotPastAfter) {
  Service s(options());
  const Request watch0{"GET", "/v1/cluster?watch=1&after=0", "", ""};
  EXPECT_EQ(s.watch_after(watch0), 0u);
  EXPECT_EQ(s.watch_after({"GET", "/v1/cluster?watch=1&after=5", "", ""}), 5u);
  EXPECT_EQ(s.watch_after({"GET", "/v1/cluster", "", ""}), std::nullopt);
  EXPECT_EQ(s.watch_after({"GET", "/v1/cluster?watch=0", "", ""}), std::nullopt);
  EXPECT_EQ(s.watch_after({"GET", "/v1/cluster?watch=1&after=x", "", ""}), std::nullopt);
  EXPECT_EQ(s.watch_after({"GET", "/v1/events?watch=1&after=0", "", ""}), std::nullopt);
  // A timed-out watch answers with the unchanged document.
  auto r = s.handle(watch0);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["version"], 0);
  ASSERT_EQ(put(s, two_workers(0)).status, 200);
  EXPECT_EQ(s.watch_after(watch0), std::nullopt);
  r = s.handle(watch0);
  EXPECT_EQ(json::parse(r.body)["version"], 1);
}

TEST_F(ServiceTest, EventsComeAtMostLimitAtATimeSayingWhetherMoreFollow) {
  Service s(options());
  for (int i = 0; i < 5; ++i) ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);
  const auto page = json::parse(get(s, "/v1/events?after=1&limit=2").body);
  ASSERT_EQ(page["events"].size(), 2u);
  EXPECT_EQ(page["events"][0]["seq"], 2);
  EXPECT_EQ(page["events"][1]["seq"], 3);
  EXPECT_EQ(page["more"], true);
  const auto last = json::parse(get(s, "/v1/events?after=3&limit=2").body);
  ASSERT_EQ(last["events"].size(), 2u);
  EXPECT_EQ(last["more"], false);
  // Without a limit, up to kDefaultEventLimit (all 5 here), and "more" all the same.
  const auto all = json::parse(get(s, "/v1/events").body);
  EXPECT_EQ(all["events"].size(), 5u);
  EXPECT_EQ(all["more"], false);
  // A limit above the most is refused, saying the range.
  const auto r = get(s, "/v1/events?limit=10001");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"], "limit must be an integer from 1 to 10000");
}

// A job's long history: 100,000 events load, come in pages, and one more is appended to the
// log without the snapshot, which holds the history, being written again.
TEST_F(ServiceTest, AHistoryOf100000EventsLoadsComesInPagesAndGrowsByAnAppend) {
  State big;
  big.cluster = Cluster::from_json(two_workers(3));
  for (std::uint64_t seq = 1; seq <= 100'000; ++seq) {
    big.events.push_back({{"seq", seq},
                          {"time", "2023-11-14T22:13:20.789Z"},
                          {"type", seq % 2 ? "added" : "removed"},
                          {"worker", "127.0.0.1:" + std::to_string(10000 + seq % 50000)},
                          {"detail", "history"}});
  }
  big.next_seq = 100'001;
  save_state(state_file_, big);
  const std::string snapshot = read_file(state_file_);
  Service s(options());
  EXPECT_EQ(s.state().events.size(), 100'000u);
  const auto first = json::parse(get(s, "/v1/events?after=0&limit=1000").body);
  ASSERT_EQ(first["events"].size(), 1000u);
  EXPECT_EQ(first["events"][999]["seq"], 1000);
  EXPECT_EQ(first["more"], true);
  const auto last = json::parse(get(s, "/v1/events?after=99500&limit=1000").body);
  ASSERT_EQ(last["events"].size(), 500u);
  EXPECT_EQ(last["more"], false);
  // Without a limit: the first 1000, never the whole history in one answer.
  const auto unbounded = json::parse(get(s, "/v1/events").body);
  ASSERT_EQ(unbounded["events"].size(), 1000u);
  EXPECT_EQ(unbounded["more"], true);
  ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);
  EXPECT_EQ(read_file(state_file_), snapshot) << "the history was written again";
  const std::string log = read_file(log_file(state_file_));
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  const State again = load_state(state_file_);
  EXPECT_EQ(again.events.size(), 100'001u);
  EXPECT_EQ(again.events.back()["seq"], 100'001);
}

TEST_F(ServiceTest, BadQueriesAre400) {
  Service s(options());
  for (const char* target :
       {"/v1/cluster?watch=1&after=x", "/v1/cluster?watch=yes", "/v1/cluster?after=1",
        "/v1/cluster?watch=1&after=-1", "/v1/cluster?foo=1", "/v1/cluster?watch=1&watch=1",
        "/v1/events?after=x", "/v1/events?limit=0", "/v1/events?limit=x", "/v1/events?since=3"}) {
    EXPECT_EQ(get(s, target).status, 400) << target;
  }
  EXPECT_EQ(
      s.handle({"PUT", "/v1/cluster?x=1",
                signed_for("PUT", "/v1/cluster?x=1", two_workers(0).dump()), two_workers(0).dump()})
          .status,
      400);
  EXPECT_EQ(s.version(), 0u);
}

TEST_F(ServiceTest, PostedEventIsStampedAndListed) {
  Service s(options());
  const auto r = post_event(
      s, R"({"type":"revoked","worker":"127.0.0.1:10002","detail":"spot notice","version":3})");
  ASSERT_EQ(r.status, 201) << r.body;
  const auto e = json::parse(r.body);
  EXPECT_EQ(e["seq"], 1);
  EXPECT_EQ(e["time"], "2023-11-14T22:13:20.789Z");
  EXPECT_EQ(e["type"], "revoked");
  EXPECT_EQ(e["worker"], "127.0.0.1:10002");
  EXPECT_EQ(e["detail"], "spot notice");
  EXPECT_EQ(e["version"], 3);
  const auto list = json::parse(get(s, "/v1/events").body);
  ASSERT_EQ(list["events"].size(), 1u);
  EXPECT_EQ(list["events"][0], e);
  EXPECT_EQ(s.version(), 0u);  // events do not change the cluster
}

TEST_F(ServiceTest, EveryChangeIsInTheAuditTrail) {
  Service s(options());
  ASSERT_EQ(put(s, two_workers(0)).status, 200);
  ASSERT_EQ(post_event(s, R"({"type":"joined","worker":"127.0.0.1:10001"})").status, 201);
  ASSERT_EQ(put(s, two_workers(1)).status, 200);
  const auto events = json::parse(get(s, "/v1/events").body)["events"];
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["type"], "cluster_changed");
  EXPECT_EQ(events[0]["version"], 1);
  EXPECT_EQ(events[1]["type"], "joined");
  EXPECT_EQ(events[2]["type"], "cluster_changed");
  EXPECT_EQ(events[2]["version"], 2);
  for (std::size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i]["seq"], i + 1);
  const auto after = json::parse(get(s, "/v1/events?after=2").body)["events"];
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0]["seq"], 3);
  EXPECT_TRUE(json::parse(get(s, "/v1/events?after=3").body)["events"].empty());
}

TEST_F(ServiceTest, InvalidEventsAre400AndChangeNothing) {
  Service s(options());
  for (const char* body :
       {"", "{", "[]", "{}", R"({"type":""})", R"({"type":"cluster_changed"})",
        R"({"type":"exploded"})", R"({"type":3})", R"({"type":"note","extra":1})",
        R"({"type":"note","worker":"nohost"})", R"({"type":"note","worker":"h:0"})",
        R"({"type":"note","worker":7})", R"({"type":"note","detail":{}})",
        R"({"type":"note","version":-1})", R"({"type":"note","version":"1"})"}) {
    const auto r = post_event(s, body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_TRUE(json::parse(r.body).contains("error")) << body;
  }
  EXPECT_TRUE(json::parse(get(s, "/v1/events").body)["events"].empty());
  EXPECT_FALSE(fs::exists(state_file_) || fs::exists(log_file(state_file_)));
}

TEST_F(ServiceTest, AcceptsEveryDocumentedClientEventType) {
  Service s(options());
  for (const char* type : {"added", "removed", "joined", "left", "failed", "revoked", "killed",
                           "resized", "started", "exited", "restarted", "note"}) {
    EXPECT_EQ(post_event(s, json{{"type", type}}.dump()).status, 201) << type;
  }
}

TEST_F(ServiceTest, RestartedServiceServesTheSameState) {
  std::string cluster;
  std::string events;
  {
    Service s(options());
    ASSERT_EQ(put(s, two_workers(0)).status, 200);
    ASSERT_EQ(post_event(s, R"({"type":"failed","worker":"127.0.0.1:10002"})").status, 201);
    ASSERT_EQ(put(s, two_workers(1)).status, 200);
    cluster = get(s, "/v1/cluster").body;
    events = get(s, "/v1/events").body;
  }
  for (const auto& f : fs::directory_iterator(state_file_.parent_path())) {
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
  }
  Service s(options());
  EXPECT_EQ(s.version(), 2u);
  EXPECT_EQ(get(s, "/v1/cluster").body, cluster);
  EXPECT_EQ(get(s, "/v1/events").body, events);
  const auto e = json::parse(post_event(s, R"({"type":"note"})").body);
  EXPECT_EQ(e["seq"], 4);  // sequence numbers continue
  EXPECT_EQ(put(s, two_workers(1)).status, 409);
  EXPECT_EQ(put(s, two_workers(2)).status, 200);
}

// A change appends one line to the log and rewrites nothing; every snapshot_every records a
// snapshot takes the log's records over and empties it. The state reloads the same throughout.
TEST_F(ServiceTest, ChangesAreAppendedToALogThatSnapshotsTakeOver) {
  ServiceOptions o = options();
  o.snapshot_every = 3;
  const auto lines = [&] {
    const std::string log = read_file(log_file(state_file_));
    return std::count(log.begin(), log.end(), '\n');
  };
  const auto reloads_the_same = [&](const Service& s) {
    EXPECT_EQ(load_state(state_file_).to_json(), s.state().to_json());
  };
  Service s(o);
  ASSERT_EQ(put(s, two_workers(0)).status, 200);
  ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);
  EXPECT_FALSE(fs::exists(state_file_)) << "no snapshot yet";
  EXPECT_EQ(lines(), 2);
  reloads_the_same(s);
  ASSERT_EQ(put(s, two_workers(1)).status, 200);  // the third record: a snapshot
  EXPECT_TRUE(fs::exists(state_file_));
  EXPECT_EQ(lines(), 0);
  reloads_the_same(s);
  const std::string snapshot = read_file(state_file_);
  ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);
  EXPECT_EQ(read_file(state_file_), snapshot) << "a change rewrote the snapshot";
  EXPECT_EQ(lines(), 1);
  reloads_the_same(s);
  Service again(o);
  EXPECT_EQ(again.version(), 2u);
  EXPECT_EQ(json::parse(get(again, "/v1/events").body)["events"].size(), 4u);
}

// A crash in the middle of an append leaves a line cut short: never answered, so dropped; the
// service restarts from a fresh snapshot so that its next record does not follow the fragment.
TEST_F(ServiceTest, ALogCutShortByACrashLosesOnlyTheUnansweredRecord) {
  {
    Service s(options());
    ASSERT_EQ(put(s, two_workers(0)).status, 200);
    ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);
  }
  std::ofstream(log_file(state_file_), std::ios::app) << R"({"event":{"seq":3,"ty)";
  Service s(options());
  EXPECT_EQ(s.version(), 1u);
  EXPECT_EQ(json::parse(get(s, "/v1/events").body)["events"].size(), 2u);
  EXPECT_EQ(read_file(log_file(state_file_)), "");
  ASSERT_EQ(post_event(s, R"({"type":"note","detail":"after"})").status, 201);
  const State back = load_state(state_file_);
  ASSERT_EQ(back.events.size(), 3u);
  EXPECT_EQ(back.events.back()["detail"], "after");
  EXPECT_EQ(back.events.back()["seq"], 3);
}

// A crash between a snapshot and emptying the log leaves records the snapshot holds: skipped.
// A record missing, or a broken line before the last, is corruption, named with its line.
TEST_F(ServiceTest, TheLogsRecordsMustFollowTheSnapshot) {
  ServiceOptions o = options();
  o.snapshot_every = 2;
  std::string old_records;
  {
    Service s(o);
    ASSERT_EQ(put(s, two_workers(0)).status, 200);
    old_records = read_file(log_file(state_file_));
    ASSERT_EQ(post_event(s, R"({"type":"note"})").status, 201);  // the snapshot
  }
  const json before = load_state(state_file_).to_json();
  std::ofstream(log_file(state_file_)) << old_records;
  EXPECT_EQ(load_state(state_file_).to_json(), before);

  const auto error_of = [&](const std::string& log) {
    std::ofstream(log_file(state_file_)) << log;
    try {
      load_state(state_file_);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string logname = "state file " + log_file(state_file_).string() + ": corrupt: ";
  EXPECT_EQ(error_of(R"({"event":{"seq":5,"type":"note"}})"
                     "\n"),
            logname + "line 1 has event 5 where 3 comes next (a record is missing)");
  EXPECT_EQ(error_of("not a record\n"
                     R"({"event":{"seq":3,"type":"note"}})"
                     "\n"),
            logname + "line 1 is not a record");
  EXPECT_EQ(error_of(R"({"event":{"seq":3,"type":"note"},"cluster":{"version":"x"}})"
                     "\n")
                .rfind(logname + "line 1: ", 0),
            0u);
  // A record the log gave already, again: corruption, not skipped.
  EXPECT_EQ(error_of(R"({"event":{"seq":3,"type":"note"}})"
                     "\n"
                     R"({"event":{"seq":3,"type":"note"}})"
                     "\n"),
            logname + "line 2 repeats event 3 (4 comes next)");
}

// A snapshot whose directory could not be synced may come back as the old one after a crash:
// the log of the changes since is kept then, so that nothing answered is lost either way.
TEST_F(ServiceTest, ASnapshotWhoseDirectorySyncFailedKeepsTheLog) {
  ServiceOptions o = options();
  o.snapshot_every = 3;
  std::optional<std::string> old_snapshot;  // none: no snapshot yet
  {
    Service s(o);
    ASSERT_EQ(put(s, two_workers(0)).status, 200);
    if (fs::exists(state_file_)) old_snapshot = read_file(state_file_);
    ASSERT_EQ(post_event(s, R"({"type":"note","detail":"one"})").status, 201);
    set_directory_sync_for_testing([](int) {
      errno = EIO;
      return -1;
    });
    // The third change since the snapshot: a new snapshot, whose directory sync fails.
    const auto answered = post_event(s, R"({"type":"note","detail":"two"})");
    set_directory_sync_for_testing(nullptr);
    ASSERT_EQ(answered.status, 201);
  }
  const json latest = load_state(state_file_).to_json();
  // The crash brought back the old snapshot (or none): the kept log still holds every change.
  if (old_snapshot) {
    std::ofstream(state_file_) << *old_snapshot;
  } else {
    fs::remove(state_file_);
  }
  EXPECT_EQ(load_state(state_file_).to_json(), latest);
  EXPECT_EQ(latest["events"].size(), 3u) << latest.dump();
}

TEST_F(ServiceTest, CorruptStateFileThrowsNamingTheFile) {
  for (const std::string text :
       {"not json", "{\"format\": 1}", "[]", "{\"format\": 2, \"cluster\": {\"workers\": []}}",
        R"({"format":1,"cluster":{"version":1,"workers":[]},"events":[{"seq":2,"type":"x"},)"
        R"({"seq":1,"type":"y"}],"next_seq":3})",
        R"({"format":1,"cluster":{"version":1,"workers":[]},"events":[],"next_seq":0})"}) {
    std::ofstream(state_file_) << text;
    try {
      Service s(options());
      ADD_FAILURE() << "loaded " << text;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(state_file_.string()), std::string::npos) << what;
      EXPECT_NE(what.find("corrupt"), std::string::npos) << what;
    }
  }
}

TEST_F(ServiceTest, StateFileThatIsADirectoryThrows) {
  fs::create_directory(state_file_);
  try {
    Service s(options());
    ADD_FAILURE() << "loaded a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(state_file_.string()), std::string::npos) << e.what();
  }
}

TEST_F(ServiceTest, FailedStateWriteIs500AndChangesNothing) {
  auto o = options();
  o.state_file = dir_ / "missing-dir" / "state.json";
  Service s(o);
  const auto r = put(s, two_workers(0));
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(json::parse(r.body)["error"].get<std::string>().find("missing-dir"), std::string::npos);
  EXPECT_EQ(s.version(), 0u);
  EXPECT_EQ(post_event(s, R"({"type":"note"})").status, 500);
  EXPECT_TRUE(json::parse(get(s, "/v1/events").body)["events"].empty());
  EXPECT_TRUE(s.state().events.empty());
  EXPECT_EQ(s.state().next_seq, 1u);
}

TEST(FormatRfc3339Ms, IsUtcWithMilliseconds) {
  EXPECT_EQ(format_rfc3339_ms(kNow), "2023-11-14T22:13:20.789Z");
  EXPECT_EQ(format_rfc3339_ms(std::chrono::system_clock::time_point{}), "1970-01-01T00:00:00.000Z");
}

TEST(ListenAddress, ParsesHostAndPortZero) {
  const auto a = ListenAddress::parse("127.0.0.1:0");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 0);
  EXPECT_EQ(ListenAddress::parse("[::1]:8080").host, "::1");
  EXPECT_EQ(ListenAddress::parse("localhost:65535").port, 65535);
  EXPECT_EQ(ListenAddress::parse("[fe80::1%eth0]:1").host, "fe80::1%eth0");
  for (const char* bad : {"", "127.0.0.1", ":80", "h:", "h:65536", "h:x", "h:-1", "[]:80"}) {
    EXPECT_THROW(ListenAddress::parse(bad), std::invalid_argument) << bad;
  }
  // Brackets inside the host, or characters no host has: found by the small_parsers fuzzer,
  // whose "[[\x12]]:0" came back from printing as another host.
  for (const char* bad : {"[[\x12]]:0", "[[::1]]:80", "a]:80", "[a:80", "h h:80", "h/x:80"}) {
    try {
      (void)ListenAddress::parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("has a host with character"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ParseQuery, SplitsPairsAndRejectsRepeats) {
  const auto q = parse_query("watch=1&after=3&&flag");
  EXPECT_EQ(q.at("watch"), "1");
  EXPECT_EQ(q.at("after"), "3");
  EXPECT_EQ(q.at("flag"), "");
  EXPECT_THROW(parse_query("a=1&a=2"), std::invalid_argument);
}

// Agents' leases: PUT /v1/agents (signed) lists an agent with its slots until its TTL runs out
// on the service's clock; a renewal keeps its `since`; ttl_ms 0 retires it; GET lists the live
// ones by host. Nothing of it is in the state file.
TEST_F(ServiceTest, AgentsAreListedWithTheirSlotsWhileTheirLeaseLasts) {
  auto at = kNow;
  ServiceOptions o = options();
  o.now = [&at] { return at; };
  Service s(o);
  const auto put_agent = [&](const json& body) {
    const std::string text = body.dump();
    const auto at_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
    return s.handle({"PUT", "/v1/agents", signed_for("PUT", "/v1/agents", text, at_ms), text});
  };
  const auto listed = [&] {
    const auto r = get(s, "/v1/agents");
    EXPECT_EQ(r.status, 200);
    std::string out;
    const json doc = json::parse(r.body);
    for (const auto& a : doc["agents"]) {
      out += a["host"].get<std::string>() + "=" + std::to_string(a["slots"].get<int>()) + " ";
    }
    return out;
  };
  EXPECT_EQ(listed(), "");
  EXPECT_EQ(put_agent({{"host", "10.0.0.2"}, {"slots", 4}, {"ttl_ms", 10000}}).status, 200);
  EXPECT_EQ(put_agent({{"host", "10.0.0.1"}, {"slots", 1}, {"ttl_ms", 3000}}).status, 200);
  EXPECT_EQ(listed(), "10.0.0.1=1 10.0.0.2=4 ");
  const std::string since = json::parse(get(s, "/v1/agents").body)["agents"][1]["since"];
  EXPECT_EQ(since, "2023-11-14T22:13:20.789Z");

  at += std::chrono::seconds(2);  // a renewal with other slots keeps `since`
  EXPECT_EQ(put_agent({{"host", "10.0.0.2"}, {"slots", 2}, {"ttl_ms", 10000}}).status, 200);
  EXPECT_EQ(json::parse(get(s, "/v1/agents").body)["agents"][1]["since"], since);
  // ... and moves `renewed`, the heartbeat the dashboard shows.
  EXPECT_EQ(json::parse(get(s, "/v1/agents").body)["agents"][1]["renewed"],
            "2023-11-14T22:13:22.789Z");
  at += std::chrono::seconds(2);  // 10.0.0.1's lease ran out
  EXPECT_EQ(listed(), "10.0.0.2=2 ");
  EXPECT_EQ(put_agent({{"host", "10.0.0.2"}, {"ttl_ms", 0}}).status, 200);  // retired
  EXPECT_EQ(listed(), "");
  EXPECT_EQ(put_agent({{"host", "10.0.0.9"}, {"ttl_ms", 0}}).status, 200);  // not listed: fine
  EXPECT_FALSE(fs::exists(state_file_)) << "leases are not saved";
}

TEST_F(ServiceTest, ABadAgentLeaseIsRefusedSayingWhatIsWrong) {
  Service s(options());
  const auto put_agent = [&](const std::string& text, std::optional<std::string> auth = {}) {
    return s.handle(
        {"PUT", "/v1/agents", auth ? *auth : signed_for("PUT", "/v1/agents", text), text});
  };
  const auto reason = [](const Response& r) {
    return json::parse(r.body)["error"].get<std::string>();
  };
  for (const auto& [body, why] : {
           std::pair{std::string(R"({"host":"h","slots":2})"), "ttl_ms must be 0"},
           std::pair{std::string(R"({"host":"h","slots":0,"ttl_ms":1000})"), "slots must be"},
           std::pair{std::string(R"({"host":"h","slots":5000,"ttl_ms":1000})"), "slots must be"},
           std::pair{std::string(R"({"host":"h","slots":"2","ttl_ms":1000})"), "slots must be"},
           std::pair{std::string(R"({"host":"h","slots":2,"ttl_ms":50})"), "ttl_ms must be"},
           std::pair{std::string(R"({"host":"a/b","slots":2,"ttl_ms":1000})"), "character"},
           std::pair{std::string(R"({"host":"","slots":2,"ttl_ms":1000})"), "empty"},
           std::pair{std::string(R"({"slots":2,"ttl_ms":1000})"), "host must be a string"},
           std::pair{std::string(R"({"host":"h","slots":2,"ttl_ms":1000,"x":1})"),
                     "unknown field 'x'"},
           std::pair{std::string(R"([1])"), "JSON object"},
           std::pair{std::string(R"({"host":)"), "malformed JSON"},
       }) {
    const auto r = put_agent(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(reason(r).find(why), std::string::npos) << body << ": " << reason(r);
  }
  EXPECT_EQ(put_agent(R"({"host":"h","slots":2,"ttl_ms":1000})", "").status, 401);
  EXPECT_EQ(
      put_agent(R"({"host":"h","slots":2,"ttl_ms":1000})", signed_for("PUT", "/v1/agents", "{}"))
          .status,
      401);
  EXPECT_EQ(s.handle({"POST", "/v1/agents", "", "{}"}).status, 405);
  EXPECT_EQ(get(s, "/v1/agents?x=1").status, 400);
  EXPECT_EQ(json::parse(get(s, "/v1/agents").body)["agents"], json::array());
}

// The job's summaries (POST /v1/summary, for the dashboard): signed, an object with a step, at
// most kMaxSummaryBytes; each stamped with seq and time; GET ?after=SEQ gives the newer ones.
TEST_F(ServiceTest, SummariesAreSignedObjectsWithAStepKeptInOrder) {
  Service s(options());
  const auto post = [&](const std::string& body, std::optional<std::string> auth = {}) {
    return s.handle(
        {"POST", "/v1/summary", auth ? *auth : signed_for("POST", "/v1/summary", body), body});
  };
  EXPECT_EQ(post(R"({"step": 3, "workers": 2})").status, 201);
  EXPECT_EQ(post(R"({"step": 4, "workers": 3})").status, 201);
  const json all = json::parse(get(s, "/v1/summary").body)["summaries"];
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0]["step"], 3);
  EXPECT_EQ(all[0]["seq"], 1);
  EXPECT_EQ(all[0]["time"], "2023-11-14T22:13:20.789Z");
  EXPECT_EQ(all[1]["workers"], 3);
  EXPECT_EQ(json::parse(get(s, "/v1/summary?after=1").body)["summaries"].size(), 1u);
  EXPECT_EQ(json::parse(get(s, "/v1/summary?after=2").body)["summaries"].size(), 0u);
  // Refused, naming why; nothing kept.
  EXPECT_EQ(post(R"({"step": 5})", "").status, 401);
  EXPECT_EQ(post(R"({"step": 5})", signed_for("POST", "/v1/summary", "{}")).status, 401);
  for (const char* bad : {"{", "[1]", R"({"workers": 2})", R"({"step": -1})", R"({"step": "7"})"}) {
    const auto r = post(bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_TRUE(json::parse(r.body).contains("error")) << bad;
  }
  EXPECT_EQ(get(s, "/v1/summary?after=x").status, 400);
  EXPECT_EQ(get(s, "/v1/summary?since=1").status, 400);
  EXPECT_EQ(s.handle({"PUT", "/v1/summary", "", "{}"}).status, 405);
  EXPECT_EQ(json::parse(get(s, "/v1/summary").body)["summaries"].size(), 2u);
}

// A flood of summaries costs bounded memory: the newest kMaxSummaries stay, a summary over
// kMaxSummaryBytes is refused with 413, and none of it touches the state file.
TEST_F(ServiceTest, AFloodOfSummariesIsCapped) {
  Service s(options());
  const std::string before = on_disk();
  const std::size_t posts = kMaxSummaries + 100;
  for (std::size_t i = 0; i < posts; ++i) {
    const std::string body = json{{"step", i}}.dump();
    ASSERT_EQ(
        s.handle({"POST", "/v1/summary", signed_for("POST", "/v1/summary", body), body}).status,
        201);
  }
  const json kept = json::parse(get(s, "/v1/summary").body)["summaries"];
  ASSERT_EQ(kept.size(), kMaxSummaries);
  EXPECT_EQ(kept.front()["step"], 100);
  EXPECT_EQ(kept.back()["seq"], posts);
  const std::string big = json{{"step", 1}, {"pad", std::string(kMaxSummaryBytes, 'x')}}.dump();
  const auto r = s.handle({"POST", "/v1/summary", signed_for("POST", "/v1/summary", big), big});
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(json::parse(get(s, "/v1/summary").body)["summaries"].size(), kMaxSummaries);
  EXPECT_EQ(on_disk(), before) << "summaries are kept in memory only";
}

// The dashboard: the page at /, and the charting library at /chart.js when the service has it
// (else a script that only says so, so that the page loads without an error).
TEST_F(ServiceTest, ServesTheDashboardAndItsChartingLibrary) {
  ServiceOptions o = options();
  o.chart_js = dir_ / "chart.min.js";
  std::ofstream(o.chart_js) << "var Chart = function () {};";
  Service s(o);
  const auto page = get(s, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<title>kf job</title>"), std::string::npos);
  EXPECT_NE(page.body.find("/v1/summary"), std::string::npos);
  const auto chart = get(s, "/chart.js");
  EXPECT_EQ(chart.status, 200);
  EXPECT_EQ(chart.content_type, "application/javascript");
  EXPECT_EQ(chart.body, "var Chart = function () {};");
  EXPECT_EQ(s.handle({"POST", "/", signed_for("POST", "/", ""), ""}).status, 405);

  o.chart_js = dir_ / "absent.js";
  Service without(o);
  const auto stub = get(without, "/chart.js");
  EXPECT_EQ(stub.status, 200);
  EXPECT_NE(stub.body.find("libjs-chart.js"), std::string::npos) << stub.body;

  // A directory where the file should be: the same (reading it would fail with EISDIR).
  o.chart_js = dir_;
  Service on_a_directory(o);
  EXPECT_NE(get(on_a_directory, "/chart.js").body.find("libjs-chart.js"), std::string::npos);
}

// Membership changes by kind, counted in the order of the events: a loss reported by its agent
// and its peers counts once, a revocation is a preemption while its host is under notice (a
// "notice" or "draining" naming it) and until a worker joins there again.
TEST(JobMetrics, CountsMembershipChangesByKindInTheEventsOrder) {
  JobMetrics m;
  const auto event = [&](const char* type, const char* worker, const char* detail = "") {
    json e = {{"type", type}, {"detail", detail}};
    if (*worker != '\0') e["worker"] = worker;
    m.count(e);
  };
  event("joined", "10.0.0.1:7001");
  event("joined", "10.0.0.2:7001");
  event("failed", "10.0.0.2:7001", "exit signal 9");                               // its agent
  event("failed", "10.0.0.2:7001", "connection reset; removed by 10.0.0.1:7001");  // a peer
  EXPECT_EQ(m.membership("fail"), 1u);
  event("joined", "10.0.0.2:7001");  // restarted in its place
  event("failed", "10.0.0.2:7001", "exit signal 9");
  EXPECT_EQ(m.membership("fail"), 2u);
  EXPECT_EQ(m.membership("join"), 3u);

  event("revoked", "10.0.0.1:7002", "kf-member revoke, no notice");
  event("notice", "", "host 10.0.0.3: kf-member notice, notice 30s");
  event("draining", "", "host 10.0.0.3: kf-member notice, its workers leave the job, notice 30s");
  event("revoked", "10.0.0.3:7001", "agent of 10.0.0.3, kf-member notice, notice 30s");
  event("revoked", "10.0.0.3:7002", "agent of 10.0.0.3, kf-member notice, notice 30s");
  event("revoked", "10.0.0.1:7003", "kf-member revoke, notice 10s");  // another host
  event("left", "10.0.0.3:7001", "left at commit 12");
  EXPECT_EQ(m.membership("preempt"), 2u);
  EXPECT_EQ(m.membership("revoke"), 2u);
  EXPECT_EQ(m.membership("leave"), 1u);
  event("joined", "10.0.0.3:7005");  // the host is back: its notice is over
  event("revoked", "10.0.0.3:7005", "kf-member revoke, no notice");
  EXPECT_EQ(m.membership("revoke"), 3u);
  EXPECT_EQ(m.membership("preempt"), 2u);

  EXPECT_EQ(m.events("joined"), 4u);
  EXPECT_EQ(m.events("failed"), 3u);
  EXPECT_EQ(m.events("revoked"), 5u);
  EXPECT_EQ(m.events("notice"), 1u);
  EXPECT_EQ(m.events("exploded"), 0u);
  EXPECT_EQ(m.membership("resize"), 0u);  // not a kind
  EXPECT_EQ(host_of_detail("host [::1]: x"), "[::1]");
  EXPECT_EQ(host_of_detail("host h:"), std::nullopt);
  EXPECT_EQ(host_of_detail("host : x"), std::nullopt);
  EXPECT_EQ(host_of_detail("agent of h: x"), std::nullopt);
}

// GET /metrics: the job's own series in the Prometheus text format, counted from the state
// file's events after a restart too, with the learning rate's scale against the first lr the
// settings had.
TEST_F(ServiceTest, ServesTheJobsSeriesForPrometheus) {
  const auto with_lr = [](std::uint64_t version, double lr) {
    json c = two_workers(version);
    c["settings"]["lr"] = lr;
    return c;
  };
  const auto sample = [](const std::string& page, const std::string& series) {
    const auto at = page.find("\n" + series + " ");
    if (at == std::string::npos) return std::string("absent");
    const auto from = at + series.size() + 2;
    return page.substr(from, page.find('\n', from) - from);
  };
  {
    Service s(options());
    const auto empty = get(s, "/metrics");
    EXPECT_EQ(empty.status, 200);
    EXPECT_EQ(empty.content_type, "text/plain; version=0.0.4; charset=utf-8");
    EXPECT_EQ(sample(empty.body, "kf_config_version"), "0");
    EXPECT_EQ(sample(empty.body, "kf_config_learning_rate_scale"), "absent");
    EXPECT_EQ(sample(empty.body, "kf_config_membership_events_total{kind=\"join\"}"), "0");
    ASSERT_EQ(put(s, two_workers(0)).status, 200);  // no lr yet
    ASSERT_EQ(put(s, with_lr(1, 0.1)).status, 200);
    ASSERT_EQ(post_event(s, R"({"type":"joined","worker":"127.0.0.1:10002"})").status, 201);
    ASSERT_EQ(post_event(s, R"({"type":"failed","worker":"127.0.0.1:10002"})").status, 201);
    ASSERT_EQ(post_event(s, R"({"type":"failed","worker":"127.0.0.1:10002"})").status, 201);
    ASSERT_EQ(put(s, with_lr(2, 0.4)).status, 200);
  }
  Service s(options());
  const std::string page = get(s, "/metrics").body;
  EXPECT_EQ(sample(page, "kf_config_version"), "3") << page;
  EXPECT_EQ(sample(page, "kf_config_workers"), "2");
  EXPECT_EQ(sample(page, "kf_config_learning_rate"), "0.4");
  EXPECT_EQ(sample(page, "kf_config_learning_rate_scale"), "4");
  EXPECT_EQ(sample(page, "kf_config_membership_events_total{kind=\"join\"}"), "1");
  EXPECT_EQ(sample(page, "kf_config_membership_events_total{kind=\"fail\"}"), "1");
  EXPECT_EQ(sample(page, "kf_config_membership_events_total{kind=\"preempt\"}"), "0");
  EXPECT_EQ(sample(page, "kf_config_events_total{type=\"failed\"}"), "2");
  EXPECT_EQ(sample(page, "kf_config_events_total{type=\"cluster_changed\"}"), "3");
  EXPECT_NE(page.find("# TYPE kf_config_events_total counter\n"), std::string::npos);
  EXPECT_NE(page.find("kf_build_info{version=\""), std::string::npos);
  EXPECT_EQ(s.handle({"POST", "/metrics", signed_for("POST", "/metrics", ""), ""}).status, 405);
  EXPECT_EQ(get(s, "/metrics?x=1").status, 400);

  // promtool, where Debian's prometheus package is installed, finds nothing to complain of.
  if (std::system("command -v promtool > /dev/null") != 0) {
    std::printf("promtool not found: the page was not linted (apt install prometheus)\n");
    return;
  }
  std::ofstream(dir_ / "page.prom") << page;
  const std::string check = "promtool check metrics < " + (dir_ / "page.prom").string();
  EXPECT_EQ(std::system(check.c_str()), 0) << page;
}
}  // namespace
}  // namespace kf::config_server
