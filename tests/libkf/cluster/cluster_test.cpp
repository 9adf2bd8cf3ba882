// SPDX-License-Identifier: Apache-2.0
// The cluster model: JSON round trip, rank lookup, and from_json's rejections, each with a
// message that names the offending field.
#include "kf/cluster/cluster.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace kf {
namespace {

Cluster three_workers() {
  Cluster c;
  c.version = 7;
  c.workers = {{{"10.0.0.1", 4000}, 0}, {{"10.0.0.1", 4001}, 1}, {{"10.0.0.2", 4000}, 0}};
  c.agents = {{"10.0.0.1", 3900}, {"10.0.0.2", 3900}};
  c.settings = {{"algorithm", "ring"}, {"timeout_ms", 5000}};
  return c;
}

nlohmann::json valid_json() {
  return nlohmann::json::parse(R"({
    "version": 3,
    "workers": [{"host": "a", "port": 1000, "slot": 0}, {"host": "b", "port": 1000}],
    "agents": [{"host": "a", "port": 900}],
    "settings": {"algorithm": "auto"}
  })");
}

// from_json(j) must throw std::invalid_argument whose message contains every one of `words`.
void expect_rejected(const nlohmann::json& j, std::initializer_list<std::string> words) {
  try {
    (void)Cluster::from_json(j);
    ADD_FAILURE() << "accepted " << j.dump();
  } catch (const std::invalid_argument& e) {
    for (const auto& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message '" << e.what() << "' does not name '" << w << "' for " << j.dump();
    }
  }
}

TEST(Cluster, JsonRoundTripPreservesEverything) {
  const Cluster c = three_workers();
  const Cluster back = Cluster::from_json(c.to_json());
  EXPECT_EQ(back.version, c.version);
  EXPECT_EQ(back.workers, c.workers);
  EXPECT_EQ(back.agents, c.agents);
  EXPECT_EQ(back.settings, c.settings);
  EXPECT_EQ(back.to_json(), c.to_json());
  // Through text as well, as KF_CLUSTER carries it.
  EXPECT_EQ(Cluster::from_json(nlohmann::json::parse(c.to_json().dump())).to_json(), c.to_json());
}

// A document read back from its text writes the same bytes again: the etcd client compares a
// stored document with the one a worker runs by its bytes (ConfigClient::put_cluster's `from`).
TEST(Cluster, TextReadBackWritesTheSameBytes) {
  Cluster c = three_workers();
  c.settings["lr"] = 0.1;
  c.settings["momentum"] = 1.0;
  c.settings["tiny"] = 1e-300;
  c.settings["count"] = -3;
  c.settings["big"] = std::uint64_t{18446744073709551615u};
  c.settings["nested"] = {{"b", {1, 2.5, "x"}}, {"a", nullptr}, {"u", "\u00e9\n\t"}};
  const std::string text = c.to_json().dump();
  const Cluster back = Cluster::from_json(nlohmann::json::parse(text));
  EXPECT_EQ(back.to_json().dump(), text);
}

TEST(Cluster, ParsesMinimalAndFullDocuments) {
  const Cluster full = Cluster::from_json(valid_json());
  EXPECT_EQ(full.version, 3u);
  ASSERT_EQ(full.size(), 2);
  EXPECT_EQ(full.workers[1].endpoint, (Endpoint{"b", 1000}));
  EXPECT_EQ(full.workers[1].slot, 0);
  EXPECT_EQ(full.settings["algorithm"], "auto");
  const Cluster minimal = Cluster::from_json(nlohmann::json::parse(R"({"workers": []})"));
  EXPECT_EQ(minimal.version, 0u);
  EXPECT_EQ(minimal.size(), 0);
  EXPECT_TRUE(minimal.agents.empty());
  EXPECT_TRUE(minimal.settings.is_object());
  // The largest version survives the trip.
  Cluster big;
  big.version = UINT64_MAX;
  EXPECT_EQ(Cluster::from_json(big.to_json()).version, UINT64_MAX);
}

TEST(Cluster, RankOfIsTheWorkerIndex) {
  const Cluster c = three_workers();
  EXPECT_EQ(c.rank_of({"10.0.0.1", 4000}), 0);
  EXPECT_EQ(c.rank_of({"10.0.0.1", 4001}), 1);
  EXPECT_EQ(c.rank_of({"10.0.0.2", 4000}), 2);
  EXPECT_EQ(c.rank_of({"10.0.0.2", 4001}), std::nullopt);
  EXPECT_EQ(c.rank_of({"10.0.0.3", 4000}), std::nullopt);
  EXPECT_EQ(c.rank_of({"10.0.0.1", 3900}), std::nullopt);  // an agent is not a worker
  EXPECT_EQ(Cluster{}.rank_of({"10.0.0.1", 4000}), std::nullopt);
}

TEST(Cluster, RejectsDuplicateWorkers) {
  auto j = valid_json();
  j["workers"][1] = {{"host", "a"}, {"port", 1000}, {"slot", 1}};
  expect_rejected(j, {"duplicate", "worker", "a:1000"});
}

// Spares: kept through the trip, not ranked, and absent from a document that has none (so that
// documents written before spares existed read and write the same bytes).
TEST(Cluster, SparesRoundTripAndAreNoMembers) {
  Cluster c = three_workers();
  EXPECT_FALSE(c.to_json().contains("spares"));
  c.spares = {{{"10.0.0.3", 4000}, 0}, {{"10.0.0.3", 4001}, 1}};
  const Cluster back = Cluster::from_json(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.spares, c.spares);
  EXPECT_EQ(back.size(), 3);
  EXPECT_EQ(back.rank_of({"10.0.0.3", 4001}), std::nullopt);
  EXPECT_TRUE(back.is_spare({"10.0.0.3", 4001}));
  EXPECT_FALSE(back.is_spare({"10.0.0.1", 4000}));
}

TEST(Cluster, PromotedSparesBecomeTheLastWorkers) {
  Cluster c = three_workers();
  c.spares = {{{"10.0.0.2", 4001}, 1}, {{"10.0.0.3", 4000}, 0}, {{"10.0.0.3", 4001}, 1}};
  // Spares on a host that goes away are skipped.
  auto promoted = promote_spares(c, 1, {"10.0.0.2"});
  ASSERT_EQ(promoted.size(), 1u);
  EXPECT_EQ(promoted[0].endpoint, (Endpoint{"10.0.0.3", 4000}));
  EXPECT_EQ(c.rank_of({"10.0.0.3", 4000}), 3);
  EXPECT_FALSE(c.is_spare({"10.0.0.3", 4000}));
  EXPECT_EQ(c.validate(), "");
  // Fewer spares than asked for: all that can go.
  promoted = promote_spares(c, 5);
  EXPECT_EQ(promoted.size(), 2u);
  EXPECT_EQ(c.size(), 6);
  EXPECT_TRUE(c.spares.empty());
  EXPECT_TRUE(promote_spares(c, 1).empty());
}

TEST(Cluster, RejectsASpareThatIsAlsoAWorkerOrMalformed) {
  auto j = valid_json();
  j["spares"] = nlohmann::json::array({{{"host", "b"}, {"port", 1000}}});
  expect_rejected(j, {"duplicate", "spare", "b:1000"});
  j["spares"] = nlohmann::json::array({{{"host", "c"}, {"port", 1000}, {"slot", -1}}});
  expect_rejected(j, {"spares[0].slot"});
  j["spares"] = nlohmann::json::array({{{"host", "c"}, {"port", 0}}});
  expect_rejected(j, {"spares[0].port"});
  j["spares"] = "c:1000";
  expect_rejected(j, {"cluster.spares", "array"});
}

TEST(Cluster, RejectsPortsOutOfRangeOrOfTheWrongType) {
  for (const auto& port : {nlohmann::json(0), nlohmann::json(70000), nlohmann::json(-1),
                           nlohmann::json("1000"), nlohmann::json(1000.5)}) {
    auto j = valid_json();
    j["workers"][1]["port"] = port;
    expect_rejected(j, {"workers[1].port"});
  }
  auto j = valid_json();
  j["workers"][0].erase("port");
  expect_rejected(j, {"workers[0].port"});
  j = valid_json();
  j["agents"][0]["port"] = 0;
  expect_rejected(j, {"agents[0].port"});
}

TEST(Cluster, RejectsEmptyOrMissingHost) {
  auto j = valid_json();
  j["workers"][0]["host"] = "";
  expect_rejected(j, {"workers[0].host"});
  j = valid_json();
  j["workers"][1].erase("host");
  expect_rejected(j, {"workers[1].host"});
  j = valid_json();
  j["workers"][1]["host"] = 5;
  expect_rejected(j, {"workers[1].host"});
}

TEST(Cluster, RejectsUnknownFields) {
  auto j = valid_json();
  j["wrokers"] = nlohmann::json::array();
  expect_rejected(j, {"unknown", "wrokers"});
  j = valid_json();
  j["workers"][0]["rank"] = 0;
  expect_rejected(j, {"workers[0]", "unknown", "rank"});
}

TEST(Cluster, RejectsMissingOrMistypedWorkers) {
  auto j = valid_json();
  j.erase("workers");
  expect_rejected(j, {"workers"});
  j = valid_json();
  j["workers"] = {{"host", "a"}};
  expect_rejected(j, {"workers"});
  j = valid_json();
  j["workers"][0] = "a:1000";
  expect_rejected(j, {"workers[0]"});
}

TEST(Cluster, RejectsNegativeOrNonIntegerVersion) {
  for (const auto& v : {nlohmann::json(-1), nlohmann::json(1.5), nlohmann::json("3")}) {
    auto j = valid_json();
    j["version"] = v;
    expect_rejected(j, {"version"});
  }
}

TEST(Cluster, RejectsOtherMistypedFields) {
  auto j = valid_json();
  j["workers"][0]["slot"] = -1;
  expect_rejected(j, {"workers[0].slot"});
  j = valid_json();
  j["agents"] = "a:900";
  expect_rejected(j, {"agents"});
  j = valid_json();
  j["settings"] = nlohmann::json::array();
  expect_rejected(j, {"settings"});
  expect_rejected(nlohmann::json::array(), {"cluster"});
}

TEST(Cluster, ValidateReportsTheFirstProblem) {
  Cluster c = three_workers();
  EXPECT_EQ(c.validate(), "");
  c.workers[2].endpoint.port = 0;
  EXPECT_NE(c.validate().find("workers[2].port"), std::string::npos);
  c = three_workers();
  c.workers[1].endpoint.host.clear();
  EXPECT_NE(c.validate().find("workers[1].host"), std::string::npos);
  c = three_workers();
  c.workers[2].endpoint = c.workers[0].endpoint;
  EXPECT_NE(c.validate().find("duplicate"), std::string::npos);
  for (const char* bad : {"h h", "a/b", "[::1]", "h\n", "h\x01"}) {
    c = three_workers();
    c.workers[1].endpoint.host = bad;
    EXPECT_NE(c.validate().find("workers[1].host is a host with character"), std::string::npos)
        << bad;
    c = three_workers();
    c.agents = {Endpoint{"10.0.0.1", 900}, Endpoint{bad, 900}};
    EXPECT_NE(c.validate().find("agents[1].host is a host with character"), std::string::npos)
        << bad;
  }
  c = three_workers();
  c.workers[0].endpoint.host = "::1";
  c.agents = {Endpoint{"fe80::1%eth0", 900}, Endpoint{"node-7.example_net", 901}};
  EXPECT_EQ(c.validate(), "");
  c.agents[1].port = 0;
  EXPECT_NE(c.validate().find("agents[1].port"), std::string::npos);
}

TEST(Endpoint, ParsesHostAndPort) {
  EXPECT_EQ(Endpoint::parse("10.0.0.1:4000"), (Endpoint{"10.0.0.1", 4000}));
  EXPECT_EQ(Endpoint::parse("[::1]:65535"), (Endpoint{"::1", 65535}));
  EXPECT_EQ(Endpoint::parse("::1:65535"), (Endpoint{"::1", 65535}));
  EXPECT_EQ(Endpoint::parse(Endpoint{"fe80::1%eth0", 7}.str()), (Endpoint{"fe80::1%eth0", 7}));
  EXPECT_EQ((Endpoint{"h", 1}).str(), "h:1");
  for (const char* bad : {"host", ":80", "h:0", "h:70000", "h:", "h:8x", "h:-1", "[]:80",
                          "[[h]]:80", "h h:80", "a/b:80", "[a]b:80"}) {
    EXPECT_THROW(Endpoint::parse(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace kf
