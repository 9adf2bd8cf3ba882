// SPDX-License-Identifier: Apache-2.0
// kf-member's library and kf::ConfigClient's URL parsing. add_workers test-binds candidate ports
// on 127.0.0.1; a change whose event cannot be recorded talks to a canned service there.
#include "kf-member/lib/commands.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>
#include <string>

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

}  // namespace
