// SPDX-License-Identifier: Apache-2.0
// kf-member's library and kf::ConfigClient's URL parsing. add_workers test-binds candidate ports
// on 127.0.0.1; a change whose event cannot be recorded talks to a canned service there.
#include "kf-member/lib/commands.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kf/runtime/config_client.hpp"
#include "support/canned_http.hpp"

namespace {

kf::Cluster three_workers() {
  kf::Cluster c;
  c.version = 7;
  c.workers = {{{"127.0.0.1", 10001}, 0}, {{"127.0.0.1", 10002}, 1}, {{"10.0.0.2", 10001}, 0}};
  return c;
}

TEST(ConfigClientUrl, AcceptsHttpHostPort) {
  EXPECT_EQ(kf::ConfigClient::parse_url("http://127.0.0.1:7070"),
            (kf::Endpoint{"127.0.0.1", 7070}));
  EXPECT_EQ(kf::ConfigClient::parse_url("http://localhost:1/"), (kf::Endpoint{"localhost", 1}));
  EXPECT_EQ(kf::ConfigClient::parse_url("http://[::1]:65535"), (kf::Endpoint{"::1", 65535}));
}

TEST(ConfigClientUrl, RejectsAnythingElseNamingTheUrl) {
  for (const char* url :
       {"", "127.0.0.1:7070", "https://127.0.0.1:7070", "http://127.0.0.1", "http://:7070",
        "http://127.0.0.1:0", "http://127.0.0.1:65536", "http://127.0.0.1:70x",
        "http://127.0.0.1:7070/v1", "http://u@h:1", "http://[::1]", "http://::1:7070",
        "http://h:1?x=1", "http://[a\r\nX: y]:1", "http://[[::1]:1", "http://h h:1",
        "http://h\x01:1", "etcd://h:1,a\nb:2"}) {
    try {
      kf::ConfigClient client(url, "token");
      ADD_FAILURE() << "accepted '" << url << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + std::string(url) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(KfMemberFindWorker, TakesARankOrHostPort) {
  const auto c = three_workers();
  EXPECT_EQ(kf::member::find_worker(c, "0"), 0);
  EXPECT_EQ(kf::member::find_worker(c, "2"), 2);
  EXPECT_EQ(kf::member::find_worker(c, "127.0.0.1:10002"), 1);
  EXPECT_EQ(kf::member::find_worker(c, "10.0.0.2:10001"), 2);
  // An IPv6 worker by its address as kf prints it, or in brackets.
  auto v6 = c;
  v6.workers[1].endpoint = kf::Endpoint{"fd00::2", 10001};
  EXPECT_EQ(kf::member::find_worker(v6, "fd00::2:10001"), 1);
  EXPECT_EQ(kf::member::find_worker(v6, "[fd00::2]:10001"), 1);
}

TEST(KfMemberFindWorker, RejectsUnknownWorkers) {
  const auto c = three_workers();
  for (const char* spec : {"3", "-1", "127.0.0.1:9", "10.0.0.3:10001", "x", "", "1.5"}) {
    EXPECT_THROW(kf::member::find_worker(c, spec), kf::member::UnknownWorker) << spec;
  }
}

TEST(KfMemberFormat, PrintsVersionAndOneLinePerWorker) {
  EXPECT_EQ(kf::member::format_cluster(three_workers()),
            "version 7: 3 workers\n"
            "0 127.0.0.1:10001 slot 0\n"
            "1 127.0.0.1:10002 slot 1\n"
            "2 10.0.0.2:10001 slot 0\n");
  EXPECT_EQ(kf::member::format_cluster(kf::Cluster{}), "version 0: 0 workers\n");
}

TEST(KfMemberAddWorkers, PicksFreshPortsAndContinuesSlots) {
  auto c = three_workers();
  kf::member::AddOptions options;
  options.count_workers = 2;
  options.ports = kf::tools::PortRange{10001, 10999};  // 10001 and 10002 are taken in `c`
  const auto added = kf::member::add_workers(c, options);
  ASSERT_EQ(added.size(), 2u);
  EXPECT_EQ(c.size(), 5);
  EXPECT_EQ(c.validate(), "");
  for (const auto& w : added) {
    EXPECT_EQ(w.endpoint.host, "127.0.0.1");
    EXPECT_GE(w.endpoint.port, 10003);
    EXPECT_LE(w.endpoint.port, 10999);
  }
  EXPECT_EQ(added[0].slot + added[1].slot, 2 + 3);
}

}  // namespace

namespace {

// A value nested deeper than kf parses JSON (kf::parse_json) is text, and a setting that must
// be a number refuses it naming the key.
TEST(MemberAssignments, DeeplyNestedValuesAreText) {
  const std::string deep(100'000, '[');
  try {
    kf::member::parse_assignments({"lr=" + deep});
    ADD_FAILURE() << "a nested lr was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
  const nlohmann::json v = kf::member::parse_assignments({"lr=0.05", "mode=sma:period=4"});
  EXPECT_EQ(v["lr"], 0.05);
  EXPECT_EQ(v["mode"], "sma:period=4");
}

TEST(MemberBounds, MinAndMaxWorkersFromTheSettings) {
  kf::Cluster c = three_workers();
  EXPECT_NO_THROW(kf::member::check_bounds(c)) << "no bounds set";
  c.settings["max_workers"] = 3;
  c.settings["min_workers"] = 3;
  EXPECT_NO_THROW(kf::member::check_bounds(c));
  c.settings["max_workers"] = 2;
  try {
    kf::member::check_bounds(c);
    ADD_FAILURE() << "3 workers passed max_workers = 2";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("settings.max_workers = 2"), std::string::npos)
        << e.what();
  }
  c.settings["max_workers"] = 8;
  c.settings["min_workers"] = 4;
  try {
    kf::member::check_bounds(c);
    ADD_FAILURE() << "3 workers passed min_workers = 4";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("settings.min_workers = 4"), std::string::npos)
        << e.what();
  }
  c.settings["min_workers"] = "two";
  EXPECT_THROW(kf::member::check_bounds(c), std::invalid_argument);
}

// `kf-member set stop=true` against a job with the builtin service: the job ends at once and takes
// its service along, so the event after the stored change finds nobody. The change took effect:
// the command reports it and says the event was not recorded, it does not fail.
TEST(MemberMutate, AnEventThatCannotBeRecordedAfterTheChangeIsANote) {
  kf::test::CannedHttpServer server;
  kf::Cluster stored = three_workers();
  stored.version = 8;
  stored.settings["stop"] = true;
  // GET and PUT are answered; the event's POST then gets 503, as long as the client retries.
  server.sign_as("token");
  server.set_answers({kf::test::CannedHttpServer::answer(200, three_workers().to_json().dump()),
                      kf::test::CannedHttpServer::answer(200, stored.to_json().dump())});
  kf::ConfigClientOptions options;
  options.deadline = std::chrono::milliseconds(500);
  kf::ConfigClient client(server.url("http"), "token", options);
  std::ostringstream out;
  kf::member::CommandContext ctx{client, out};
  kf::Cluster result;
  ASSERT_NO_THROW(
      result = kf::member::mutate(ctx, [](kf::Cluster& c) {
        c.settings["stop"] = true;
        return kf::member::Edit{"settings stop=true", {{"note", "", "kf-member set stop=true"}}};
      }));
  EXPECT_EQ(result.version, 8u);
  EXPECT_NE(out.str().find("v7 -> v8: settings stop=true"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("v8: the change took effect; its 'note' event was not recorded"),
            std::string::npos)
      << out.str();
}

// kf-member trace: events become instants on the membership track, each summary a step span
// ending at its time, and the last change's phases spans laid back to back ending at the event
// that told of that version; times in microseconds since the epoch.
TEST(Trace, PutsEventsStepsAndPhasesOnTheirTracks) {
  std::vector<kf::ConfigEvent> events;
  events.push_back({1, "2026-11-29T00:00:01.000Z", "added", "127.0.0.1:1", "kf-member resize", 2});
  events.push_back({2, "2026-11-29T00:00:02.000Z", "resized", "", "v1 -> v2 ...", 2});
  events.push_back({3, "not a time", "note", "", "", std::nullopt});
  const auto summaries = nlohmann::json::parse(R"([
    {"seq": 1, "time": "2026-11-29T00:00:03.000Z", "step": 40, "step_time_seconds": 0.5,
     "workers": 3, "version": 2, "samples_per_second": 100.0,
     "last_change": {"version": 2, "kind": "resize", "detect_ms": 1, "agree_ms": 2,
                     "connect_ms": 3, "sync_ms": 4, "resume_ms": 5}},
    {"seq": 2, "time": "2026-11-29T00:00:04.000Z", "step": 41, "step_time_seconds": 0.25,
     "last_change": {"version": 2, "kind": "resize"}}])");
  const nlohmann::json trace = kf::member::make_trace(events, summaries);
  const auto& all = trace.at("traceEvents");
  const std::int64_t t0 = 1'795'910'400'000'000;  // 2026-11-29T00:00:00Z in microseconds
  std::vector<nlohmann::json> instants, steps, phases;
  for (const auto& e : all) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
    if (e["ph"] == "M") continue;
    ASSERT_TRUE(e.contains("ts") && e.contains("tid")) << e.dump();
    (e["tid"] == 1 ? instants : e["tid"] == 3 ? steps : phases).push_back(e);
  }
  ASSERT_EQ(instants.size(), 2u) << "an event without a time is left out";
  EXPECT_EQ(instants[0]["name"], "added");
  EXPECT_EQ(instants[0]["ts"], t0 + 1'000'000);
  EXPECT_EQ(instants[0]["args"]["detail"], "kf-member resize");
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0]["name"], "step 40");
  EXPECT_EQ(steps[0]["ts"], t0 + 3'000'000 - 500'000);
  EXPECT_EQ(steps[0]["dur"], 500'000);
  ASSERT_EQ(phases.size(), 5u) << "version 2's phases, once";
  EXPECT_EQ(phases[0]["name"], "detect");
  EXPECT_EQ(phases[0]["ts"], t0 + 2'000'000 - 15'000);
  EXPECT_EQ(phases[4]["name"], "resume");
  EXPECT_EQ(phases[4]["ts"].get<std::int64_t>() + phases[4]["dur"].get<std::int64_t>(),
            t0 + 2'000'000);
}

}  // namespace
