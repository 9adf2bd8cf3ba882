// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent_rules.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kf::tools {
namespace {

using namespace std::chrono_literals;

Cluster two_hosts() {
  Cluster c;
  c.version = 4;
  c.workers = {{{"10.0.0.1", 5000}, 0}, {{"10.0.0.2", 5000}, 0}, {{"10.0.0.1", 5001}, 1}};
  return c;
}

ConfigEvent event(std::uint64_t seq, std::string type, std::string worker, std::string detail,
                  std::optional<std::uint64_t> version) {
  ConfigEvent e;
  e.seq = seq;
  e.type = std::move(type);
  e.worker = std::move(worker);
  e.detail = std::move(detail);
  e.version = version;
  return e;
}

TEST(OwnedRanks, AreTheRanksOnTheHostInRankOrder) {
  EXPECT_EQ(owned_ranks(two_hosts(), "10.0.0.1"), (std::vector<int>{0, 2}));
  EXPECT_EQ(owned_ranks(two_hosts(), "10.0.0.2"), (std::vector<int>{1}));
  EXPECT_TRUE(owned_ranks(two_hosts(), "10.0.0.3").empty());
}

TEST(InitialCluster, ReplacesVersionZeroWithSlotsInOrder) {
  const Cluster c = initial_cluster("127.0.0.1", {7001, 7002}, "tree");
  EXPECT_EQ(c.version, 0u);
  ASSERT_EQ(c.size(), 2);
  EXPECT_EQ(c.workers[1], (WorkerSpec{{"127.0.0.1", 7002}, 1}));
  EXPECT_EQ(c.settings, (nlohmann::json{{"algorithm", "tree"}}));
  EXPECT_EQ(c.validate(), "");
}

TEST(MarkedFinished, NeedsTheBooleanTrue) {
  Cluster c = two_hosts();
  EXPECT_FALSE(marked_finished(c));
  c.settings["finished"] = false;
  EXPECT_FALSE(marked_finished(c));
  c.settings["finished"] = "yes";
  EXPECT_FALSE(marked_finished(c));
  c.settings["finished"] = true;
  EXPECT_TRUE(marked_finished(c));
}

TEST(Suspend, MarksTheJobAndResumingPutsTheResumersWorkersInPlaceOfTheOld) {
  Cluster c = two_hosts();
  c.settings = {{"lr", 0.1}};
  c.spares = {{{"10.0.0.3", 5000}, 0}};
  EXPECT_FALSE(marked_suspended(c));
  const Cluster s = suspended_cluster(c);
  EXPECT_TRUE(marked_suspended(s));
  EXPECT_EQ(s.workers, c.workers) << "a job keeps its workers listed while suspended";
  EXPECT_EQ(s.settings["lr"], 0.1);
  Cluster odd = c;
  odd.settings["suspended"] = "yes";
  EXPECT_FALSE(marked_suspended(odd));

  const Cluster r = resumed_cluster(s, "10.0.0.7", {6000, 6001});
  EXPECT_FALSE(marked_suspended(r));
  EXPECT_EQ(r.version, 4u) << "the resume is a compare-and-swap on the suspended version";
  ASSERT_EQ(r.size(), 2);
  EXPECT_EQ(r.workers[0], (WorkerSpec{{"10.0.0.7", 6000}, 0}));
  EXPECT_EQ(r.workers[1], (WorkerSpec{{"10.0.0.7", 6001}, 1}));
  EXPECT_TRUE(r.spares.empty());
  EXPECT_EQ(r.settings, (nlohmann::json{{"lr", 0.1}}));
  EXPECT_EQ(r.validate(), "");
}

TEST(WithoutWorker, DropsOnlyThatWorkerAndKeepsTheVersion) {
  const Cluster c = without_worker(two_hosts(), "10.0.0.2:5000");
  EXPECT_EQ(c.version, 4u);
  ASSERT_EQ(c.size(), 2);
  EXPECT_FALSE(is_member(c, "10.0.0.2:5000"));
  EXPECT_TRUE(is_member(c, "10.0.0.1:5001"));
  EXPECT_EQ(without_worker(two_hosts(), "10.0.0.9:1").size(), 3);
}

TEST(ParseNotice, ReadsTheSecondsOfKfMemberRevoke) {
  EXPECT_EQ(parse_notice("kf-member revoke, notice 30s"), 30s);
  EXPECT_EQ(parse_notice("notice 0s"), 0s);
  EXPECT_EQ(parse_notice("kf-member revoke, no notice"), std::nullopt);
  EXPECT_EQ(parse_notice("notice 5"), std::nullopt);
  EXPECT_EQ(parse_notice("notice xs"), std::nullopt);
  EXPECT_EQ(parse_notice(""), std::nullopt);
}

TEST(FindDeparture, TakesTheNewestEventNamingTheWorkerAfterTheVersion) {
  const std::string w = "10.0.0.1:5000";
  const std::vector<ConfigEvent> events{
      event(1, "killed", w, "kf-member kill", 2),  // an earlier life of the endpoint
      event(2, "added", w, "kf-member add", 3),
      event(3, "revoked", "10.0.0.2:5000", "notice 9s", 5),  // another worker
      event(4, "revoked", w, "kf-member revoke, notice 7s", 5),
  };
  EXPECT_EQ(find_departure(events, w, 1)->kind, Departure::Kind::revoked);
  const auto d = find_departure(events, w, 4);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, Departure::Kind::revoked);
  EXPECT_EQ(d->notice, 7s);
  EXPECT_EQ(find_departure(events, w, 5), std::nullopt);
  EXPECT_EQ(find_departure(events, "10.0.0.1:5001", 0), std::nullopt);
}

TEST(FindDeparture, TellsKillsAndRemovalsAndAcceptsEventsWithoutVersion) {
  EXPECT_EQ(find_departure({event(1, "killed", "h:1", "", 9)}, "h:1", 8)->kind,
            Departure::Kind::killed);
  EXPECT_EQ(find_departure({event(1, "removed", "h:1", "", std::nullopt)}, "h:1", 8)->kind,
            Departure::Kind::removed);
  EXPECT_EQ(find_departure({event(1, "failed", "h:1", "", 9)}, "h:1", 8), std::nullopt);
}

TEST(GraceFor, IsZeroForAKillTheNoticeForARevokeAndTheDefaultOtherwise) {
  EXPECT_EQ(grace_for({Departure::Kind::killed, std::nullopt}, 5000ms), 0ms);
  EXPECT_EQ(grace_for({Departure::Kind::revoked, 2s}, 5000ms), 2000ms);
  EXPECT_EQ(grace_for({Departure::Kind::revoked, std::nullopt}, 5000ms), 5000ms);
  EXPECT_EQ(grace_for({Departure::Kind::removed, std::nullopt}, 5000ms), 5000ms);
  EXPECT_EQ(grace_for({}, 5000ms), 5000ms);
}

TEST(JobIdForToken, IsStablePerTokenAndDoesNotContainIt) {
  const std::string a = job_id_for_token("secret-a");
  EXPECT_EQ(a, job_id_for_token("secret-a"));
  EXPECT_NE(a, job_id_for_token("secret-b"));
  EXPECT_EQ(a.size(), 3u + 16u);
  EXPECT_TRUE(a.starts_with("kf-"));
  EXPECT_EQ(a.find("secret"), std::string::npos);
}

}  // namespace
}  // namespace kf::tools
