// SPDX-License-Identifier: Apache-2.0
// plan_autoscale: every rule of autoscale's placement, without processes.
#include "kfrun/lib/autoscale.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kf::tools {
namespace {

// Ports 7000, 7001, ... on each host, skipping the taken ones.
std::vector<std::uint16_t> next_ports(const std::string&, int count,
                                      const std::vector<std::uint16_t>& taken) {
  std::vector<std::uint16_t> out;
  for (std::uint16_t p = 7000; static_cast<int>(out.size()) < count; ++p) {
    if (std::find(taken.begin(), taken.end(), p) == taken.end()) out.push_back(p);
  }
  return out;
}

Cluster with(std::vector<WorkerSpec> workers) {
  Cluster c;
  c.version = 3;
  c.workers = std::move(workers);
  return c;
}

AgentOffer offer(std::string host, int slots) { return AgentOffer{std::move(host), slots, ""}; }

AutoscaleSettings all() { return AutoscaleSettings{}; }

// "host:port/slot ..." of the workers, in rank order.
std::string shown(const std::vector<WorkerSpec>& workers) {
  std::string s;
  for (const auto& w : workers) {
    s += (s.empty() ? "" : " ") + w.endpoint.str() + "/" + std::to_string(w.slot);
  }
  return s;
}

TEST(PlanAutoscale, AllOfferedFillsEverySlotOnTheJobsHostsFirst) {
  const Cluster c = with({{{"10.0.0.2", 7000}, 0}});
  const auto plan =
      plan_autoscale(c, {offer("10.0.0.1", 2), offer("10.0.0.2", 3)}, all(), {}, next_ports);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->placed), "10.0.0.2:7001/1 10.0.0.2:7002/2 10.0.0.1:7000/0 10.0.0.1:7001/1");
  EXPECT_TRUE(plan->released.empty());
  EXPECT_EQ(plan->next.size(), 5u);
  EXPECT_EQ(plan->next.version, c.version);
  EXPECT_EQ(plan->cause,
            "autoscale: target all offered, 5 slots offered on 2 hosts: 1 -> 5 workers");
  // Nothing to do once there.
  EXPECT_FALSE(plan_autoscale(plan->next, {offer("10.0.0.1", 2), offer("10.0.0.2", 3)}, all(), {},
                              next_ports));
}

TEST(PlanAutoscale, ATargetIsKeptWithinMinMaxAndWhatIsOffered) {
  const Cluster c = with({{{"h1", 7000}, 0}});
  AutoscaleSettings a;
  a.target = 3;
  EXPECT_EQ(plan_autoscale(c, {offer("h1", 2), offer("h2", 4)}, a, {}, next_ports)->next.size(),
            3u);
  a.target = 10;
  a.max = 10;
  EXPECT_EQ(plan_autoscale(c, {offer("h1", 2), offer("h2", 4)}, a, {}, next_ports)->next.size(),
            6u);  // all that is offered
  AutoscaleSettings capped;
  capped.max = 4;
  EXPECT_EQ(
      plan_autoscale(c, {offer("h1", 2), offer("h2", 4)}, capped, {}, next_ports)->next.size(), 4u);
}

TEST(PlanAutoscale, PerHostCapsEachHostAndReleasesTheNewestAboveIt) {
  AutoscaleSettings a;
  a.per_host = 2;
  const Cluster c =
      with({{{"h1", 7000}, 0}, {{"h1", 7001}, 1}, {{"h2", 7000}, 0}, {{"h1", 7002}, 2}});
  const auto plan = plan_autoscale(c, {offer("h1", 4), offer("h2", 4)}, a, {}, next_ports);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->released), "h1:7002/2");
  EXPECT_EQ(shown(plan->placed), "h2:7001/1");
  EXPECT_EQ(shown(plan->next.workers), "h1:7000/0 h1:7001/1 h2:7000/0 h2:7001/1");
}

TEST(PlanAutoscale, ALowerTargetReleasesTheNewestWorkers) {
  AutoscaleSettings a;
  a.target = 2;
  const Cluster c = with({{{"h1", 7000}, 0}, {{"h2", 7000}, 0}, {{"h1", 7001}, 1}});
  const auto plan = plan_autoscale(c, {offer("h1", 2), offer("h2", 2)}, a, {}, next_ports);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->released), "h1:7001/1");
  EXPECT_TRUE(plan->placed.empty());
  EXPECT_EQ(plan->cause, "autoscale: target 2, 4 slots offered on 2 hosts: 3 -> 2 workers");
}

TEST(PlanAutoscale, HostsToAvoidAndHostsWithoutAnOfferGetNothingNew) {
  // h3 has a worker but no live agent (restarting, say): kept and counted, never added to.
  const Cluster c = with({{{"h1", 7000}, 0}, {{"h3", 7000}, 0}});
  const auto plan = plan_autoscale(c, {offer("h1", 2), offer("h2", 2)}, all(), {"h2"}, next_ports);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->placed), "h1:7001/1");
  EXPECT_EQ(shown(plan->next.workers), "h1:7000/0 h3:7000/0 h1:7001/1");
  EXPECT_NE(plan->cause.find("avoiding h2 (lost workers just now)"), std::string::npos);
}

TEST(PlanAutoscale, SlotNumbersAreTheLowestFreeBelowTheHostsSlots) {
  // Slot 1 is free on h1 (its worker left); slot 5 (added by hand) is beyond the 3 slots.
  const Cluster c = with({{{"h1", 7000}, 0}, {{"h1", 7005}, 5}});
  const auto plan = plan_autoscale(c, {offer("h1", 3)}, all(), {}, next_ports);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->placed), "h1:7001/1");
  EXPECT_EQ(plan->next.size(), 3u);
}

TEST(PlanAutoscale, NoOffersChangeNothingAndTheLastWorkerStays) {
  const Cluster c = with({{{"h1", 7000}, 0}});
  EXPECT_FALSE(plan_autoscale(c, {}, all(), {}, next_ports));
  AutoscaleSettings a;
  a.per_host = 1;
  EXPECT_FALSE(plan_autoscale(c, {offer("h1", 1)}, a, {}, next_ports));
}

}  // namespace
}  // namespace kf::tools

namespace kf::tools {
namespace {

TEST(PlanSpares, SparesGoToTheHostsWithFewestWorkersOnFreeSlots) {
  const Cluster c = with({{{"h1", 7000}, 0}, {{"h1", 7001}, 1}, {{"h2", 7000}, 0}});
  std::int64_t short_by = -1;
  const auto plan = plan_spares(c, {offer("h1", 4), offer("h2", 2), offer("h3", 1)}, 2, {},
                                next_ports, &short_by);
  ASSERT_TRUE(plan);
  EXPECT_EQ(shown(plan->placed), "h3:7000/0 h2:7001/1");
  EXPECT_EQ(plan->next.workers, c.workers);
  EXPECT_EQ(shown(plan->next.spares), "h3:7000/0 h2:7001/1");
  EXPECT_EQ(short_by, 0);
  EXPECT_EQ(plan->cause, "spares: keeping 2 hot spares: 0 -> 2");
  // Kept: nothing to do.
  EXPECT_FALSE(
      plan_spares(plan->next, {offer("h1", 4), offer("h2", 2), offer("h3", 1)}, 2, {}, next_ports));
  // Workers placed by autoscale do not take the spares' slots.
  const auto more = plan_autoscale(plan->next, {offer("h1", 4), offer("h2", 2), offer("h3", 1)},
                                   all(), {}, next_ports);
  ASSERT_TRUE(more);
  EXPECT_EQ(shown(more->placed), "h1:7002/2 h1:7003/3");
  EXPECT_EQ(more->next.spares, plan->next.spares);
}

TEST(PlanSpares, FewerReleasesTheNewestAndTooFewSlotsAreCounted) {
  Cluster c = with({{{"h1", 7000}, 0}});
  c.spares = {{{"h2", 7000}, 0}, {{"h2", 7001}, 1}};
  const auto fewer = plan_spares(c, {offer("h2", 2)}, 1, {}, next_ports);
  ASSERT_TRUE(fewer);
  EXPECT_EQ(shown(fewer->released), "h2:7001/1");
  EXPECT_EQ(shown(fewer->next.spares), "h2:7000/0");
  // Three wanted, one free slot offered (h1's second); h3 is avoided.
  std::int64_t short_by = 0;
  const auto more = plan_spares(c, {offer("h1", 2), offer("h2", 2), offer("h3", 4)}, 4, {"h3"},
                                next_ports, &short_by);
  ASSERT_TRUE(more);
  EXPECT_EQ(shown(more->placed), "h1:7001/1");
  EXPECT_EQ(short_by, 1);
  EXPECT_EQ(more->cause, "spares: keeping 4 hot spares: 2 -> 3 (no free slot for 1 more)");
  // Spares on a host that offers nothing stay.
  EXPECT_FALSE(plan_spares(c, {}, 2, {}, next_ports));
}

}  // namespace
}  // namespace kf::tools
