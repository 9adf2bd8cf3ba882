// SPDX-License-Identifier: Apache-2.0
// kf-member end to end: starts the real kf-config-server ($CONFIG_SERVER_EXE) on port 0, reads its
// "listening on HOST:PORT" line, then runs the kf-member executable ($KF_MEMBER) against it:
// list/add/revoke/resize, two adds racing for the same version (both must land), watch, and the
// exit codes of a bad token, a server that is down, an unknown worker and bad arguments. The events
// the commands record are read back with kf::ConfigClient, which is also tested here directly
// (compare-and-swap conflict carrying the current document).
#include "kf/runtime/config_client.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kf-member/lib/commands.hpp"

#include "support/config_server_process.hpp"
#include "support/process.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "member-e2e-token";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

using kf::test::Ran;
using kf::test::run_shell;

using kf::test::ServerProcess;

// The "vA -> vB" transitions printed by kf-member.
std::vector<std::pair<int, int>> transitions(const std::string& output) {
  static const std::regex re(R"(v(\d+) -> v(\d+):)");
  std::vector<std::pair<int, int>> found;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re);
       it != std::sregex_iterator(); ++it) {
    found.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  }
  return found;
}

int count_type(const std::vector<kf::ConfigEvent>& events, const std::string& type) {
  int n = 0;
  for (const auto& e : events) n += e.type == type ? 1 : 0;
  return n;
}

class KfMemberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(env_or_empty("CONFIG_SERVER_EXE").empty()) << "CONFIG_SERVER_EXE is not set";
    ASSERT_FALSE(env_or_empty("KF_MEMBER").empty()) << "KF_MEMBER is not set";
    std::string pattern = (fs::temp_directory_path() / "kf-member-e2e-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "token") << kToken << "\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(
        dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    std::ofstream(dir_ / "bad-token") << "not-the-token\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(dir_ / "bad-token", std::filesystem::perms::owner_read |
                                                         std::filesystem::perms::owner_write);
    server_ = std::make_unique<ServerProcess>(dir_);
    ASSERT_FALSE(server_->url().empty()) << "kf-config-server did not start";
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  std::string command(const std::string& args, const std::string& token = "token") const {
    return "timeout 60 " + env_or_empty("KF_MEMBER") + " --server " + server_->url() +
           " --token-file " + (dir_ / token).string() + " " + args;
  }
  Ran member(const std::string& args, const std::string& token = "token") const {
    return run_shell(command(args, token));
  }
  kf::ConfigClient client() const { return kf::ConfigClient(server_->url(), kToken); }

  fs::path dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(KfMemberTest, ListsAddsRevokesAndResizes) {
  Ran r = member("list");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "version 0: 0 workers\nagents alive: none\n");

  r = member("add --count 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v0 -> v1: added 127.0.0.1:"), std::string::npos) << r.output;

  r = member("list");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(^version 1: 2 workers\n0 127\.0\.0\.1:\d+ slot 0\n1 127\.0\.0\.1:\d+ slot 1\n)"
                 R"(agents alive: none\n$)")))
      << r.output;
  const kf::Cluster v1 = client().get_cluster();
  ASSERT_EQ(v1.size(), 2);

  r = member("revoke 0 --notice 30");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v1 -> v2: revoked " + v1.workers[0].endpoint.str()), std::string::npos)
      << r.output;

  r = member("resize 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v2 -> v3: resized 1 -> 3 workers"), std::string::npos) << r.output;
  const kf::Cluster v3 = client().get_cluster();
  EXPECT_EQ(v3.version, 3u);
  ASSERT_EQ(v3.size(), 3);
  EXPECT_EQ(v3.workers[0], v1.workers[1]);
  EXPECT_EQ(v3.validate(), "");

  r = member("resize 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v3 -> v4: resized 3 -> 1 workers, removed"), std::string::npos);
  r = member("kill " + v1.workers[1].endpoint.str());
  EXPECT_EQ(r.exit_code, 1) << r.output;  // the last worker: the service refuses an empty cluster
  EXPECT_NE(r.output.find("workers must not be empty"), std::string::npos) << r.output;

  const auto events = client().get_events();
  EXPECT_EQ(count_type(events, "added"), 4);
  EXPECT_EQ(count_type(events, "removed"), 2);
  EXPECT_EQ(count_type(events, "resized"), 2);
  ASSERT_EQ(count_type(events, "revoked"), 1);
  for (const auto& e : events) {
    if (e.type != "revoked") continue;
    EXPECT_EQ(e.worker, v1.workers[0].endpoint.str());
    EXPECT_NE(e.detail.find("notice 30s"), std::string::npos) << e.detail;
    EXPECT_EQ(e.version, 2u);
  }
}

TEST_F(KfMemberTest, KillRemovesTheWorkerAndRecordsAnEvent) {
  ASSERT_EQ(member("add --count 3").exit_code, 0);
  const Ran r = member("kill 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v1 -> v2: killed"), std::string::npos) << r.output;
  EXPECT_EQ(client().get_cluster().size(), 2);
  EXPECT_EQ(count_type(client().get_events(), "killed"), 1);
}

TEST_F(KfMemberTest, SetChangesSettingsByCompareAndSwapAndRecordsANote) {
  ASSERT_EQ(member("add --count 2").exit_code, 0);
  Ran r = member("set mode=sma:period=4 compression=topk:0.01 lr=0.05 balance=true");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("v1 -> v2: settings "), std::string::npos) << r.output;
  const kf::Cluster c = client().get_cluster();
  EXPECT_EQ(c.settings.at("mode"), "sma:period=4");
  EXPECT_EQ(c.settings.at("compression"), "topk:0.01");
  EXPECT_EQ(c.settings.at("lr"), 0.05) << "a number stays a number";
  EXPECT_EQ(c.settings.at("balance"), true) << "a boolean stays a boolean";
  EXPECT_EQ(c.size(), 2) << "the workers are left as they are";
  EXPECT_EQ(count_type(client().get_events(), "note"), 1);
  r = member("set lr=0.05");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no change"), std::string::npos) << r.output;
  for (const std::string bad : {"set mode=sma:period=0", "set compression=zip", "set lr",
                                "set color=blue", "set lr=1 lr=2", "set balance=yes", "set"}) {
    r = member(bad);
    EXPECT_EQ(r.exit_code, 2) << "'" << bad << "': " << r.output;
  }
  r = member("set mode=sma:period=0");
  EXPECT_NE(r.output.find("settings.mode"), std::string::npos) << r.output;
  EXPECT_EQ(client().get_cluster().version, c.version) << "nothing written on a bad value";
}

TEST_F(KfMemberTest, RacingAddsBothLand) {
  ASSERT_EQ(member("add").exit_code, 0);
  int conflicts = 0;  // how often the race produced a 409 (timing-dependent, not asserted)
  for (int round = 0; round < 3; ++round) {
    const kf::Cluster before = client().get_cluster();
    const auto seq_before = client().get_events().back().seq;
    const auto a = dir_ / "a.out";
    const auto b = dir_ / "b.out";
    // Both processes start at once and read the same version: one of them gets a 409.
    std::string both_commands;
    for (const auto& out : {a, b}) {
      // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&&.
      both_commands.append("(").append(command("add"));
      both_commands.append(" > " + out.string() + " 2>&1; echo rc=$?) & ");
    }
    const Ran both = run_shell(both_commands + "wait");
    EXPECT_EQ(both.output, "rc=0\nrc=0\n");
    std::set<int> new_versions;
    for (const auto& file : {a, b}) {
      std::ifstream in(file);
      const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      conflicts += out.find(": conflict, v") != std::string::npos ? 1 : 0;
      const auto t = transitions(out);
      ASSERT_EQ(t.size(), 1u) << out;
      EXPECT_LT(t[0].first, t[0].second);
      EXPECT_GE(t[0].first, static_cast<int>(before.version));
      new_versions.insert(t[0].second);
    }
    EXPECT_EQ(new_versions, (std::set<int>{static_cast<int>(before.version) + 1,
                                           static_cast<int>(before.version) + 2}));
    const kf::Cluster after = client().get_cluster();
    EXPECT_EQ(after.size(), before.size() + 2);
    EXPECT_EQ(after.version, before.version + 2);
    EXPECT_EQ(after.validate(), "");
    EXPECT_EQ(count_type(client().get_events(seq_before), "added"), 2);
  }
  std::cout << "racing adds: " << conflicts << " of 3 rounds saw a conflict and retried\n";
}

TEST_F(KfMemberTest, MutateReappliesTheEditAfterAConflict) {
  ASSERT_EQ(member("add").exit_code, 0);
  auto c = client();
  std::ostringstream out;
  kf::member::CommandContext ctx{c, out};
  int calls = 0;
  const kf::Cluster stored = kf::member::mutate(ctx, [&](kf::Cluster& next) {
    if (++calls == 1) {
      // Another writer moves the version on between our read and our PUT: a certain 409.
      EXPECT_EQ(member("add").exit_code, 0);
    }
    next.settings["touched"] = calls;
    return kf::member::Edit{"touched settings", {{"note", "", "retry test"}}};
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(stored.version, 3u);
  EXPECT_EQ(stored.size(), 2);  // the other writer's worker survived the re-applied edit
  EXPECT_EQ(out.str(), "v1: conflict, v2 is current; re-applying\nv2 -> v3: touched settings\n");
  const auto events = c.get_events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, "note");
  EXPECT_EQ(events.back().version, 3u);
}

TEST_F(KfMemberTest, ConfigClientConflictCarriesTheCurrentCluster) {
  auto c = client();
  kf::Cluster next;
  next.workers.push_back({{"127.0.0.1", 10001}, 0});
  const kf::Cluster stored = c.put_cluster(next);
  EXPECT_EQ(stored.version, 1u);
  next.workers.push_back({{"127.0.0.1", 10002}, 1});
  try {
    c.put_cluster(next);  // still names version 0
    FAIL() << "expected a conflict";
  } catch (const kf::ConflictError& e) {
    EXPECT_EQ(e.code(), kf::errc::conflict);
    EXPECT_EQ(e.current().to_json(), stored.to_json());
  }
  EXPECT_EQ(c.watch(0, 1s).version, 1u);
  const auto start = Clock::now();
  EXPECT_EQ(c.watch(1, 300ms).version,
            1u);  // nothing changes: returns after the timeout
  EXPECT_LT(Clock::now() - start, 3s);
}

TEST_F(KfMemberTest, BadTokenExits1) {
  const Ran r = member("add", "bad-token");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("the job token differs from the config service's"), std::string::npos)
      << r.output;
  EXPECT_EQ(client().get_cluster().version, 0u);
  try {
    kf::ConfigClient(server_->url(), "wrong").post_event("note", "", "x", std::nullopt);
    FAIL() << "expected auth_failed";
  } catch (const kf::Error& e) {
    EXPECT_EQ(e.code(), kf::errc::auth_failed);
  }
}

TEST_F(KfMemberTest, ServerDownExits1) {
  const std::string url = server_->url();
  server_->terminate();
  const Ran r = run_shell("timeout 60 " + env_or_empty("KF_MEMBER") + " --server " + url +
                          " --timeout-ms 2000 list");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot reach"), std::string::npos) << r.output;
  try {
    kf::ConfigClient(url, kToken).get_cluster();
    FAIL() << "expected service_unavailable";
  } catch (const kf::Error& e) {
    EXPECT_EQ(e.code(), kf::errc::service_unavailable);
  }
}

TEST_F(KfMemberTest, UnknownWorkerExits1) {
  ASSERT_EQ(member("add --count 2").exit_code, 0);
  for (const char* worker : {"7", "127.0.0.1:1", "nonsense"}) {
    for (const std::string verb : {"revoke ", "kill "}) {
      const Ran r = member(verb + worker);
      EXPECT_EQ(r.exit_code, 1) << verb << worker << ": " << r.output;
      EXPECT_NE(r.output.find("unknown worker"), std::string::npos) << r.output;
    }
  }
  EXPECT_EQ(client().get_cluster().version, 1u);
}

TEST_F(KfMemberTest, BadArgumentsExit2) {
  const std::string exe = env_or_empty("KF_MEMBER");
  for (const std::string args :
       {"", "bogus", "resize 0", "resize", "add --count x", "revoke", "watch --count -1",
        "add --port-range 9-1", "add --host ''", "add --host 'a b'", "resize 3 --host 'h/1'"}) {
    const Ran r = member(args);
    EXPECT_EQ(r.exit_code, 2) << "'" << args << "': " << r.output;
  }
  Ran r = run_shell(exe + " --server ftp://127.0.0.1:1 list");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ftp://127.0.0.1:1"), std::string::npos) << r.output;
  r = run_shell("env -u KF_JOB_TOKEN_FILE " + exe + " --server " + server_->url() + " add");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--token-file"), std::string::npos) << r.output;
  // With etcd, reading needs the token (or a prefix) too: without, no job could be found.
  r = run_shell("env -u KF_JOB_TOKEN_FILE " + exe + " --server etcd://127.0.0.1:1 list");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("prefix derived from its token"), std::string::npos) << r.output;
}

TEST_F(KfMemberTest, WatchReturnsAfterAChangeByAnotherProcess) {
  ASSERT_EQ(member("add").exit_code, 0);
  std::FILE* watch = ::popen((command("watch --count 1") + " 2>&1").c_str(), "r");
  ASSERT_NE(watch, nullptr);
  char line[4096];
  ASSERT_NE(std::fgets(line, sizeof line, watch),
            nullptr);  // it has read the current version
  EXPECT_TRUE(std::string(line).starts_with("v1 (current): 1 workers")) << line;
  ASSERT_EQ(member("add").exit_code, 0);
  std::string rest;
  while (std::fgets(line, sizeof line, watch) != nullptr) rest += line;
  const int status = ::pclose(watch);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << rest;
  EXPECT_TRUE(rest.starts_with("v2: 2 workers: ")) << rest;
}

}  // namespace
