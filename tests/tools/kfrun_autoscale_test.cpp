// SPDX-License-Identifier: Apache-2.0
// Autoscale end to end (docs/autoscale.md): agents list the slots they offer, and a job whose
// settings hold `autoscale` places workers on them and gives them up by itself, with a `placed`
// or `released` event per worker, the cooldown and the per-host cap respected; an agent that
// gets a notice stops offering at once, and nothing is placed on its host again. Three agents on
// 127.0.0.1, 127.0.0.2 and 127.0.0.3 (other loopback addresses stand for other machines) share an
// external kf-config-server; the workers are the harness's shell scripts, so what is checked is
// the placement, not training (the multiproc and cluster suites train through such changes).
#include <signal.h>
#include <time.h>

#include <ctime>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "tools/kfrun_watch_harness.hpp"

namespace kf::test::watch {
namespace {

// Milliseconds since the epoch of an event's RFC 3339 time ("2026-11-29T07:30:08.815Z").
std::int64_t event_ms(const std::string& time) {
  std::tm tm{};
  std::istringstream in(time);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  int ms = 0;
  if (in.peek() == '.') {
    in.get();
    in >> ms;
  }
  return static_cast<std::int64_t>(::timegm(&tm)) * 1000 + ms;
}

class KfrunAutoscale : public KfrunWatch {
 protected:
  void TearDown() override {
    others_.clear();
    KfrunWatch::TearDown();
  }

  void start_service() {
    std::ofstream(dir_ / "token") << "autoscale-e2e-token\n";
    fs::permissions(dir_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    server_ = std::make_unique<kf::test::ServerProcess>(dir_);
    ASSERT_FALSE(server_->url().empty());
    url_ = server_->url();
    token_file_ = (dir_ / "token").string();
  }

  // Another agent on `host` offering `slots`, with no workers of its own to begin with.
  KfrunProcess& start_agent(const std::string& host, int slots,
                            std::vector<std::string> options = {}) {
    std::vector<std::string> args{"--watch",
                                  "--config-server",
                                  url_,
                                  "--job-token-file",
                                  token_file_,
                                  "--slots",
                                  std::to_string(slots),
                                  "--host",
                                  host};
    args.insert(args.end(), options.begin(), options.end());
    for (const std::string& a :
         {std::string("--"), std::string("/bin/sh"), std::string("-c"), worker_script(dir_)}) {
      args.push_back(a);
    }
    others_.push_back(std::make_unique<KfrunProcess>(args));
    return *others_.back();
  }

  // Reads every agent's output while waiting for `condition`.
  bool eventually(const std::function<bool()>& condition, std::chrono::seconds within = kWait) {
    return agent_->eventually(
        [&] {
          for (auto& o : others_) o->pump(std::chrono::milliseconds(1));
          return condition();
        },
        Clock::now() + within);
  }

  std::vector<kf::ConfigEvent> events(const std::string& type) {
    std::vector<kf::ConfigEvent> out;
    for (auto& e : client().get_events()) {
      if (e.type == type) out.push_back(std::move(e));
    }
    return out;
  }

  // The events of `type` once there are `count` of them (the autoscaler posts them one by one
  // after its write): what there is after kWait otherwise.
  std::vector<kf::ConfigEvent> wait_events(const std::string& type, std::size_t count) {
    std::vector<kf::ConfigEvent> found;
    eventually([&] {
      found = events(type);
      return found.size() >= count;
    });
    return found;
  }

  // "HOST/SLOT ..." of the document's workers, sorted.
  std::string placement() {
    std::vector<std::string> items;
    for (const auto& w : client().get_cluster().workers) {
      items.push_back(w.endpoint.host + "/" + std::to_string(w.slot));
    }
    std::sort(items.begin(), items.end());
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "" : " ") + i;
    return s;
  }

  std::unique_ptr<kf::test::ServerProcess> server_;
  std::vector<std::unique_ptr<KfrunProcess>> others_;
};

TEST_F(KfrunAutoscale, OfferedSlotsAreTakenWithinTheCapAndGivenUpByTheJobItself) {
  start_service();
  start({"--watch", "--config-server", url_, "--job-token-file", token_file_, "--slots", "2", "-np",
         "1"});
  ASSERT_TRUE(agent_->wait_for_workers(1)) << agent_->output();

  // Autoscale on: the first agent's second slot is taken at once (no change before it).
  auto r = member(R"(set autoscale='{"cooldown_s": 3, "per_host": 2}')");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually([&] { return placement() == "127.0.0.1/0 127.0.0.1/1"; }))
      << placement() << "\n"
      << agent_->output();
  ASSERT_TRUE(agent_->wait_for_workers(2)) << agent_->output();
  const auto first = wait_events("placed", 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].detail,
            "autoscale: target all offered, 2 slots offered on 1 host (per_host 2): 1 -> 2 "
            "workers");

  // A second host offers 3 slots: 2 of them are taken (per_host), after the cooldown.
  KfrunProcess& second = start_agent("127.0.0.2", 3);
  ASSERT_TRUE(eventually([&] { return placement().find("127.0.0.2/1") != std::string::npos; }))
      << placement() << "\n"
      << agent_->output() << second.output();
  EXPECT_EQ(placement(), "127.0.0.1/0 127.0.0.1/1 127.0.0.2/0 127.0.0.2/1");
  ASSERT_TRUE(second.wait_for_workers(2)) << second.output();
  const auto placed = wait_events("placed", 3);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_GE(event_ms(placed[1].time) - event_ms(first[0].time), 3000)
      << placed[1].time << " vs " << first[0].time;
  for (std::size_t i = 1; i < placed.size(); ++i) {
    EXPECT_TRUE(placed[i].worker.starts_with("127.0.0.2:")) << placed[i].worker;
    EXPECT_EQ(placed[i].detail,
              "autoscale: target all offered, 4 slots offered on 2 hosts (per_host 2): 2 -> 4 "
              "workers");
  }
  r = member("list");
  EXPECT_TRUE(contains(r.output, "agents alive: 127.0.0.1 127.0.0.2\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "slots in use: 127.0.0.1 2/2, 127.0.0.2 2/3 (5 offered)"))
      << r.output;

  // A notice on the second host: its workers leave, it offers nothing from then on. A third host
  // then gets the next placement, and the second none.
  ASSERT_EQ(::kill(second.pid(), SIGTERM), 0);
  ASSERT_TRUE(second.wait_for_text("its 2 workers leave the job")) << second.output();
  for (const auto& [self, w] : second.workers()) release(self, 0);
  EXPECT_EQ(second.wait_exit(Clock::now() + kWait), 0) << second.output();
  KfrunProcess& third = start_agent("127.0.0.3", 1);
  ASSERT_TRUE(eventually([&] { return placement().find("127.0.0.3/0") != std::string::npos; }))
      << placement() << "\n"
      << agent_->output() << third.output();
  EXPECT_EQ(placement(), "127.0.0.1/0 127.0.0.1/1 127.0.0.3/0");
  EXPECT_EQ(wait_events("placed", 4).size(), 4u);

  // A lower target is acted on at once: the newest workers are released.
  r = member(R"(set autoscale='{"cooldown_s": 3, "per_host": 2, "target": 1}')");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(eventually([&] { return client().get_cluster().size() == 1; })) << placement() << "\n"
                                                                              << agent_->output();
  const auto released = wait_events("released", 2);
  ASSERT_EQ(released.size(), 2u);
  EXPECT_TRUE(released[0].worker.starts_with("127.0.0.3:")) << released[0].worker;
  EXPECT_TRUE(contains(released[0].detail, "target 1")) << released[0].detail;
  EXPECT_EQ(placement(), "127.0.0.1/0");
}

TEST_F(KfrunAutoscale, ABadAutoscaleSettingIsRefusedSayingWhatIsWrong) {
  start_service();
  start({"--watch", "--config-server", url_, "--job-token-file", token_file_, "--slots", "1", "-np",
         "1"});
  ASSERT_TRUE(agent_->wait_for_workers(1)) << agent_->output();
  for (const auto& [value, why] : {
           std::pair{std::string(R"('{"min": 3, "max": 2}')"), "min 3 is greater than max 2"},
           std::pair{std::string(R"('{"cooldown_s": -1}')"), "cooldown_s: expected a number"},
           std::pair{std::string("all"), "expected a JSON object"},
       }) {
    const auto r = member("set autoscale=" + value);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, why)) << r.output;
  }
  // The document as a writer other than kf-member would send it: refused by the service.
  auto c = client();
  kf::Cluster doc = c.get_cluster();
  doc.settings["autoscale"] = {{"per_host", 0}};
  try {
    c.put_cluster(doc);
    ADD_FAILURE() << "the service took a bad autoscale";
  } catch (const kf::Error& e) {
    EXPECT_TRUE(contains(e.what(), "settings.autoscale: per_host: expected an integer >= 1"))
        << e.what();
  }
  EXPECT_FALSE(c.get_cluster().settings.contains("autoscale"));
  // And "off" removes it.
  ASSERT_EQ(member(R"(set autoscale='{"target": 1}')").exit_code, 0);
  EXPECT_TRUE(c.get_cluster().settings.contains("autoscale"));
  ASSERT_EQ(member("set autoscale=off").exit_code, 0);
  EXPECT_FALSE(c.get_cluster().settings.contains("autoscale"));
}

}  // namespace
}  // namespace kf::test::watch
