// SPDX-License-Identifier: Apache-2.0
// kf-config-server end to end: starts the real executable (path in $CONFIG_SERVER_EXE) on port 0,
// reads its "listening on HOST:PORT" line and talks HTTP to it with curl (and raw sockets for bad
// HTTP). Checks the status codes over the wire, that a long-poll wakes on a change without
// blocking other requests, that a restarted server serves the same state, and the exit codes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>

#include <string>
#include <thread>
#include <vector>
#include "kf/runtime/config_client.hpp"
#include "kf/runtime/request_signature.hpp"

#include "support/config_server_process.hpp"
#include "support/process.hpp"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "e2e-token";

std::string server_path() {
  const char* path = std::getenv("CONFIG_SERVER_EXE");
  return path != nullptr ? path : "";
}

using kf::test::eventually;
using kf::test::Ran;
using kf::test::run_shell;

struct HttpResult {
  int status = 0;
  json body;
};

using kf::test::ServerProcess;

class ConfigServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(server_path().empty()) << "CONFIG_SERVER_EXE is not set";
    std::string pattern = (fs::temp_directory_path() / "kf-config-server-e2e-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "token") << kToken << "\n";
    // Only this user may read a token file (kf warns otherwise).
    std::filesystem::permissions(
        dir_ / "token", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // One HTTP request with curl; `body` goes through a file so it needs no quoting.
  HttpResult http(const std::string& method, const std::string& url, const std::string& body = "",
                  bool auth = false) {
    static std::atomic<int> counter{0};
    std::string command = "curl -sS -m 20 -o - -w '\\n%{http_code}' -X " + method;
    if (auth) {
      // Signed as kf's clients sign (kf/runtime/request_signature.hpp): curl cannot.
      const auto slash = url.find('/', url.find("//") + 2);
      const std::string target = slash == std::string::npos ? "/" : url.substr(slash);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
      command +=
          " -H 'Authorization: " +
          kf::sign_request(kf::derive_key(kToken, kf::KeyUse::control), method, target, body, ms) +
          "'";
    }
    if (!body.empty()) {
      const auto file = dir_ / ("body-" + std::to_string(counter++));
      std::ofstream(file, std::ios::binary) << body;
      command += " -H 'Content-Type: application/json' --data-binary @" + file.string();
    }
    const Ran ran = run_shell(command + " '" + url + "'");
    HttpResult result;
    const auto newline = ran.output.rfind('\n');
    if (newline == std::string::npos) return result;
    result.status = std::atoi(ran.output.c_str() + newline + 1);
    result.body = json::parse(ran.output.substr(0, newline), nullptr, false);
    return result;
  }

  static json cluster(std::uint64_t version, int workers) {
    json ws = json::array();
    for (int i = 0; i < workers; ++i)
      ws.push_back({{"host", "127.0.0.1"}, {"port", 10001 + i}, {"slot", i}});
    return {{"version", version}, {"workers", ws}, {"settings", {{"batch_size", 32}}}};
  }

  fs::path dir_;
};

TEST_F(ConfigServerTest, ServesTheApiOverHttp) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  EXPECT_TRUE(server.address().starts_with("127.0.0.1:"));
  const auto url = server.url();
  EXPECT_EQ(http("GET", url + "/healthz").status, 200);
  auto r = http("GET", url + "/v1/cluster");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["version"], 0);
  r = http("PUT", url + "/v1/cluster", cluster(0, 2).dump(), true);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["version"], 1);
  r = http("PUT", url + "/v1/cluster", cluster(0, 3).dump(), true);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body["current"]["version"], 1);
  EXPECT_EQ(http("PUT", url + "/v1/cluster", cluster(1, 3).dump(), false).status, 401);
  EXPECT_EQ(http("PUT", url + "/v1/cluster", R"({"version":1,"workers":[)", true).status, 400);
  EXPECT_EQ(http("PUT", url + "/v1/cluster", cluster(1, 0).dump(), true).status, 400);
  EXPECT_EQ(http("GET", url + "/nope").status, 404);
  EXPECT_EQ(http("DELETE", url + "/v1/cluster", "", true).status, 405);
  EXPECT_EQ(
      http("POST", url + "/v1/events", R"({"type":"joined","worker":"127.0.0.1:10001"})", true)
          .status,
      201);
  r = http("GET", url + "/v1/events");
  EXPECT_EQ(r.status, 200);
  ASSERT_EQ(r.body["events"].size(), 2u);
  EXPECT_EQ(r.body["events"][0]["type"], "cluster_changed");
  EXPECT_EQ(r.body["events"][1]["type"], "joined");
  EXPECT_EQ(http("GET", url + "/v1/cluster").body["version"], 1);
  EXPECT_EQ(server.terminate(), 0);
}

// kf-config-server answers at most 1000 events a request; the client pages through a longer
// trail and hands it back whole and in order.
TEST_F(ConfigServerTest, ALongAuditTrailComesBackWholeAPageAtATime) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  kf::ConfigClient c(server.url(), kToken);
  for (int i = 0; i < 2500; ++i)
    c.post_event("note", "", "event " + std::to_string(i), std::nullopt);
  const auto all = c.get_events(0);
  ASSERT_EQ(all.size(), 2500u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].seq, i + 1);
    ASSERT_EQ(all[i].detail, "event " + std::to_string(i));
  }
  EXPECT_EQ(c.get_events(1200).size(), 1300u);
  EXPECT_EQ(http("GET", server.url() + "/v1/events").body["events"].size(), 1000u);
}

TEST_F(ConfigServerTest, BodyOverOneMebibyteIs413) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  json doc = cluster(0, 1);
  doc["settings"]["padding"] = std::string(std::size_t{2} << 20, 'x');
  EXPECT_EQ(http("PUT", server.url() + "/v1/cluster", doc.dump(), true).status, 413);
  EXPECT_EQ(http("GET", server.url() + "/v1/cluster").body["version"], 0);
}

TEST_F(ConfigServerTest, LongPollWakesOnChangeWithoutBlockingOthers) {
  ServerProcess server(dir_, {"--watch-timeout-ms", "20000"});
  ASSERT_FALSE(server.url().empty());
  const auto url = server.url();
  const auto start = Clock::now();
  std::vector<std::future<HttpResult>> watches;
  for (int i = 0; i < 3; ++i) {
    watches.push_back(std::async(std::launch::async,
                                 [&] { return http("GET", url + "/v1/cluster?watch=1&after=0"); }));
  }
  // Other requests are served while the watches wait.
  EXPECT_EQ(http("GET", url + "/healthz").status, 200);
  EXPECT_EQ(http("POST", url + "/v1/events", R"({"type":"note"})", true).status, 201);
  for (auto& w : watches) EXPECT_EQ(w.wait_for(0s), std::future_status::timeout);
  ASSERT_EQ(http("PUT", url + "/v1/cluster", cluster(0, 2).dump(), true).status, 200);
  for (auto& w : watches) {
    ASSERT_EQ(w.wait_for(10s), std::future_status::ready);
    const auto r = w.get();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body["version"], 1);
  }
  EXPECT_LT(Clock::now() - start, 10s);
  // Already past: answers at once.
  EXPECT_EQ(http("GET", url + "/v1/cluster?watch=1&after=0").body["version"], 1);
}

TEST_F(ConfigServerTest, LongPollTimesOutWithTheSameVersion) {
  ServerProcess server(dir_, {"--watch-timeout-ms", "300"});
  ASSERT_FALSE(server.url().empty());
  const auto start = Clock::now();
  const auto r = http("GET", server.url() + "/v1/cluster?watch=1&after=0");
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["version"], 0);
}

TEST_F(ConfigServerTest, RestartedServerServesTheSameState) {
  json events;
  {
    ServerProcess server(dir_);
    ASSERT_FALSE(server.url().empty());
    ASSERT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(0, 2).dump(), true).status, 200);
    ASSERT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(1, 3).dump(), true).status, 200);
    ASSERT_EQ(http("POST", server.url() + "/v1/events", R"({"type":"killed"})", true).status, 201);
    events = http("GET", server.url() + "/v1/events").body;
    EXPECT_EQ(server.terminate(), 0);
  }
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  const auto r = http("GET", server.url() + "/v1/cluster");
  EXPECT_EQ(r.body["version"], 2);
  EXPECT_EQ(r.body["workers"].size(), 3u);
  EXPECT_EQ(http("GET", server.url() + "/v1/events").body, events);
  EXPECT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(1, 1).dump(), true).status, 409);
}

// Sends raw bytes (in pieces of `piece` bytes each, one send each, when piece > 0) and returns
// what comes back before the server closes (or 5 s pass).
std::string raw_exchange(const std::string& address, const std::string& bytes,
                         std::size_t piece = 0) {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    const std::size_t step = piece == 0 ? bytes.size() : piece;
    for (std::size_t at = 0; at < bytes.size(); at += step) {
      (void)::send(fd, bytes.data() + at, std::min(step, bytes.size() - at), MSG_NOSIGNAL);
    }
    char buffer[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      reply.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

// A whole "PUT /v1/cluster" request with `body`, signed at `at`, closing the connection after.
std::string signed_put(const std::string& body, std::chrono::system_clock::time_point at) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
  return "PUT /v1/cluster HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
         "application/json\r\nAuthorization: " +
         kf::sign_request(kf::derive_key(kToken, kf::KeyUse::control), "PUT", "/v1/cluster", body,
                          ms) +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST_F(ConfigServerTest, BadHttpIsRefusedWithoutACrash) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  EXPECT_TRUE(
      raw_exchange(server.address(), "\x01\x02garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
  const std::string huge_header =
      "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  const std::string reply = raw_exchange(server.address(), huge_header);
  EXPECT_TRUE(reply.empty() || reply.starts_with("HTTP/1.1 400")) << reply.substr(0, 100);
  EXPECT_TRUE(raw_exchange(server.address(),
                           "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                           "Connection: close\r\n\r\n")
                  .starts_with("HTTP/1.1 200"));
  EXPECT_TRUE(server.alive());
  EXPECT_EQ(http("GET", server.url() + "/healthz").status, 200);
}

// A malformed header is answered with a 400 as soon as its bad line has arrived, however the
// bytes were split on the way: here one byte per send, so that the server reads them in small
// pieces. Beast's parser, fed read by read, waits for the end of a header once a read ended
// without it (and can miss that end), so these went unanswered.
TEST_F(ConfigServerTest, AMalformedHeaderIsAnsweredHoweverItsBytesArrive) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  const std::string long_bad_line = "GET /" + std::string(600, 'a') + " XTTP/1.1\r\n\r\n";
  const std::string unfinished = "GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n";
  for (const std::string& bytes : {long_bad_line, unfinished}) {
    for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{0}}) {
      const std::string reply = raw_exchange(server.address(), bytes, piece);
      EXPECT_TRUE(reply.starts_with("HTTP/1.1 400"))
          << "pieces of " << piece << " bytes of " << bytes.substr(0, 40) << ": " << reply;
    }
  }
  EXPECT_TRUE(server.alive());
}

// The same for a body in chunks (Beast's parser reads a body read by read too): a bad chunk
// size, a bad chunk extension, a trailer line without a colon, a chunk without its CRLF, and a
// chunk extension longer than a read, each answered with a 400 however the bytes arrive.
TEST_F(ConfigServerTest, AMalformedChunkedBodyIsAnsweredHoweverItsBytesArrive) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  const std::string head =
      "GET /v1/cluster HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string bodies[] = {
      "4\r\nabcd\r\nzz\r\nxx\r\n0\r\n\r\n",
      "4;\x01\r\nabcd\r\n0\r\n\r\n",
      "4\r\nabcd\r\n0\r\nno colon here\r\n\r\n",
      "4\r\nabcdXY0\r\n\r\n",
      "4;x=" + std::string(700, 'a') + "\x01\r\nabcd\r\n0\r\n\r\n",
  };
  for (const std::string& body : bodies) {
    for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{0}}) {
      const std::string reply = raw_exchange(server.address(), head + body, piece);
      EXPECT_TRUE(reply.starts_with("HTTP/1.1 400"))
          << "pieces of " << piece << " bytes of a body " << body.substr(0, 20) << ": " << reply;
    }
  }
  EXPECT_TRUE(server.alive());
}

// A resize while 1,000 long-polls wait (from four addresses, under the per-source cap) and 100
// clients hold a request head they never finish: the change is answered, and every long-poll
// is answered with the new version, none left waiting.
TEST_F(ConfigServerTest, ThousandLongPollsAndSlowClientsDuringAResize) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < 2000) {
    GTEST_SKIP() << "needs 2000 descriptors; the hard limit is " << limit.rlim_max;
  }
  const rlimit was = limit;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? 4096 : std::min<rlim_t>(limit.rlim_max, 4096);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  ServerProcess server(dir_, {"--watch-timeout-ms", "120000"},
                       {"/usr/bin/prlimit", "--nofile=4096"});
  ASSERT_FALSE(server.url().empty());
  ASSERT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(0, 2).dump(), true).status, 200);
  const auto colon = server.address().rfind(':');
  const auto port = static_cast<std::uint16_t>(std::stoi(server.address().substr(colon + 1)));
  const auto connect_from = [&](const std::string& source) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    return fd;
  };
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    slow.push_back(connect_from("127.0.0.9"));
    const std::string part = "GET /v1/cluster HTTP/1.1\r\nHo";
    ASSERT_EQ(::send(slow.back(), part.data(), part.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(part.size()));
  }
  const std::string poll_request =
      "GET /v1/cluster?watch=1&after=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  std::vector<int> polls;
  for (int i = 0; i < 1000; ++i) {
    polls.push_back(connect_from("127.0.0." + std::to_string(2 + i % 4)));
    ASSERT_EQ(::send(polls.back(), poll_request.data(), poll_request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(poll_request.size()));
  }
  ASSERT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(1, 3).dump(), true).status, 200);
  // Every long-poll's whole answer, read as it comes.
  std::vector<std::string> answers(polls.size());
  std::vector<bool> done(polls.size(), false);
  std::size_t left = polls.size();
  const auto until = Clock::now() + 60s;
  char buffer[4096];
  while (left > 0 && Clock::now() < until) {
    std::vector<pollfd> wait;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < polls.size(); ++i) {
      if (done[i]) continue;
      wait.push_back({polls[i], POLLIN, 0});
      which.push_back(i);
    }
    if (::poll(wait.data(), wait.size(), 1000) <= 0) continue;
    for (std::size_t k = 0; k < wait.size(); ++k) {
      if (wait[k].revents == 0) continue;
      const std::size_t i = which[k];
      const ssize_t n = ::recv(polls[i], buffer, sizeof buffer, 0);
      if (n > 0) {
        answers[i].append(buffer, static_cast<std::size_t>(n));
        continue;
      }
      done[i] = true;
      --left;
    }
  }
  EXPECT_EQ(left, 0u) << left << " long-polls were never answered";
  int new_version = 0;
  for (const auto& a : answers) {
    const auto body = a.find("\r\n\r\n");
    if (!a.starts_with("HTTP/1.1 200") || body == std::string::npos) continue;
    const auto doc = json::parse(a.substr(body + 4), nullptr, false);
    if (!doc.is_discarded() && doc.value("version", 0) == 2) ++new_version;
  }
  EXPECT_EQ(new_version, 1000) << (answers.empty() ? "" : answers.front());
  EXPECT_TRUE(server.alive());
  for (const int fd : polls) ::close(fd);
  for (const int fd : slow) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &was);
}

// A worker whose wall clock is an hour off (or jumps): its signed changes would be refused as
// outside the service's time window. The service tells its clock in every answer; the client
// signs once more in the service's time and goes on in it.
TEST_F(ConfigServerTest, AClientWhoseClockIsAnHourOffStillChangesTheCluster) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  for (const auto shift : {std::chrono::hours(1), -std::chrono::hours(1)}) {
    kf::ConfigClientOptions o;
    o.now = [shift] { return std::chrono::system_clock::now() + shift; };
    kf::ConfigClient client(server.url(), kToken, o);
    // The first request is a change: nothing was heard from the service before it.
    const auto before = http("GET", server.url() + "/v1/cluster").body.value("version", 0);
    const auto stored = client.put_cluster(kf::Cluster::from_json(cluster(before, 2)));
    EXPECT_EQ(stored.version, static_cast<std::uint64_t>(before + 1));
    EXPECT_NO_THROW(client.post_event("note", "", "clock off", std::nullopt));
  }
  // Without the service's clock (a plain signature an hour off) the same change is refused.
  const std::string answer = raw_exchange(
      server.address(),
      signed_put(cluster(2, 1).dump(), std::chrono::system_clock::now() + std::chrono::hours(1)));
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 401")) << answer;
  EXPECT_NE(answer.find("X-KF-Time: "), std::string::npos) << answer;
}

// kill -9 in the middle of a stream of changes: the restarted server holds every change it had
// answered, and at most the one it was writing when it died, with its event (a change is in the
// log before it is answered).
TEST_F(ConfigServerTest, KilledDuringAStreamOfChangesReloadsACommittedVersion) {
  auto server = std::make_unique<ServerProcess>(dir_);
  ASSERT_FALSE(server->url().empty());
  const std::string url = server->url();
  std::atomic<std::uint64_t> answered{0};
  std::thread writer([&] {
    kf::ConfigClient client(url, kToken, kf::ConfigClientOptions{std::chrono::milliseconds(2000)});
    try {
      kf::Cluster c = kf::Cluster::from_json(cluster(0, 2));
      for (int i = 0;; ++i) {
        c.workers.resize(static_cast<std::size_t>(1 + i % 3),
                         kf::WorkerSpec{kf::Endpoint{"127.0.0.1", 10001}, 0});
        for (std::size_t w = 0; w < c.workers.size(); ++w) {
          c.workers[w] =
              kf::WorkerSpec{kf::Endpoint{"127.0.0.1", static_cast<std::uint16_t>(10001 + w)},
                             static_cast<int>(w)};
        }
        c = client.put_cluster(c);
        answered.store(c.version);
      }
    } catch (const kf::Error&) {
      // the server died under it
    }
  });
  ASSERT_TRUE(eventually([&] { return answered.load() >= 20; }, 30s));
  server.reset();  // kill -9, while the writer goes on
  writer.join();
  const std::uint64_t acknowledged = answered.load();
  ServerProcess again(dir_);
  ASSERT_FALSE(again.url().empty()) << "the state did not load after kill -9";
  const auto got = http("GET", again.url() + "/v1/cluster");
  ASSERT_EQ(got.status, 200);
  const std::uint64_t version = got.body.value("version", std::uint64_t{0});
  EXPECT_GE(version, acknowledged);
  EXPECT_LE(version, acknowledged + 1);
  const auto got_events = http("GET", again.url() + "/v1/events");
  ASSERT_EQ(got_events.status, 200);
  const auto& events = got_events.body;
  std::uint64_t changed = 0;
  for (const auto& e : events.value("events", json::array())) {
    if (e.value("type", "") == "cluster_changed") changed = e.value("version", std::uint64_t{0});
  }
  EXPECT_EQ(changed, version) << "the newest version has no event: "
                              << events.dump().substr(0, 300);
}

// Clients that connect and stay silent fill the connection cap, which the server lowers below
// its descriptor limit (here 128): those past it get a 503, the server goes on accepting, and a
// change still has a descriptor for its state file. Without the lowered cap the server ran out
// of descriptors first: it stopped accepting, and a change could not open its log.
TEST_F(ConfigServerTest, RunningOutOfDescriptorsLeavesRoomForTheStateFile) {
  ServerProcess server(dir_, {}, {"/usr/bin/prlimit", "--nofile=128"});
  ASSERT_FALSE(server.url().empty());
  const auto colon = server.address().rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(server.address().substr(colon + 1))));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  const auto open_connection = [&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    return fd;
  };
  const int kept = open_connection();  // a client that will change the cluster
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(open_connection());
  // Accepted in order: the last one's answer says every one before it was taken in.
  std::string last;
  char buffer[4096];
  for (;;) {
    pollfd p{idle.back(), POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) break;
    const ssize_t n = ::recv(idle.back(), buffer, sizeof buffer, 0);
    if (n <= 0) break;
    last.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_TRUE(last.starts_with("HTTP/1.1 503")) << "the server stopped accepting: " << last;
  const std::string request = signed_put(cluster(0, 2).dump(), std::chrono::system_clock::now());
  ASSERT_EQ(::send(kept, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string answer;
  for (;;) {
    pollfd p{kept, POLLIN, 0};
    if (::poll(&p, 1, 10'000) <= 0) break;
    const ssize_t n = ::recv(kept, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 200")) << answer;
  ::close(kept);
  for (const int fd : idle) ::close(fd);
  EXPECT_TRUE(
      eventually([&] { return http("GET", server.url() + "/v1/cluster").status == 200; }, 10s));
  EXPECT_EQ(http("GET", server.url() + "/v1/cluster").body["version"], 1);
  EXPECT_TRUE(server.alive());
}

// The answer to HEAD states the length of its body but leaves the body out, so that the next
// answer on a kept-alive connection starts where the client expects it.
TEST_F(ConfigServerTest, AnswersToHeadCarryNoBody) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  const std::string reply = raw_exchange(server.address(),
                                         "HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                                         "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                         "Connection: close\r\n\r\n");
  const auto end_of_first = reply.find("\r\n\r\n");
  ASSERT_NE(end_of_first, std::string::npos) << reply;
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 405")) << reply;
  EXPECT_NE(reply.substr(0, end_of_first).find("Content-Length: "), std::string::npos) << reply;
  EXPECT_TRUE(reply.substr(end_of_first + 4).starts_with("HTTP/1.1 200")) << reply;
}

// Connections past a cap get a 503 naming it (kf's clients take it as the service being down
// for a moment); once the held ones close, connections are served again.
TEST_F(ConfigServerTest, ConnectionsPastTheCapAreRefusedWith503) {
  ServerProcess server(dir_, {"--max-connections-per-source", "2"});
  ASSERT_FALSE(server.url().empty());
  const auto colon = server.address().rfind(':');
  std::vector<int> held;
  for (int i = 0; i < 2; ++i) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(server.address().substr(colon + 1))));
    ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    held.push_back(::socket(AF_INET, SOCK_STREAM, 0));
    ASSERT_EQ(::connect(held.back(), reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  }
  // The held connections are accepted in order; the server counts each before the next.
  const std::string refused = raw_exchange(server.address(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(refused.starts_with("HTTP/1.1 503")) << refused;
  EXPECT_NE(refused.find("2 connections from 127.0.0.1 are open (the limit)"), std::string::npos)
      << refused;
  for (const int fd : held) ::close(fd);
  EXPECT_TRUE(eventually([&] { return http("GET", server.url() + "/healthz").status == 200; },
                         std::chrono::seconds(10)));
  EXPECT_TRUE(server.alive());
}

// Long-polls past the cap are answered 503 at once instead of waiting: of two sent together with
// a cap of one, one waits (and gets the change) and the other is refused.
TEST_F(ConfigServerTest, LongPollsPastTheCapAreRefusedWith503) {
  ServerProcess server(dir_, {"--max-watches-per-source", "1", "--watch-timeout-ms", "20000"});
  ASSERT_FALSE(server.url().empty());
  const auto long_poll = [&] {
    return raw_exchange(server.address(),
                        "GET /v1/cluster?watch=1&after=0 HTTP/1.1\r\nConnection: close\r\n\r\n");
  };
  auto a = std::async(std::launch::async, long_poll);
  auto b = std::async(std::launch::async, long_poll);
  std::future<std::string>* first = nullptr;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (first == nullptr && std::chrono::steady_clock::now() < until) {
    if (a.wait_for(10ms) == std::future_status::ready)
      first = &a;
    else if (b.wait_for(10ms) == std::future_status::ready)
      first = &b;
  }
  ASSERT_NE(first, nullptr) << "neither long-poll was refused";
  const std::string refused = first->get();
  EXPECT_TRUE(refused.starts_with("HTTP/1.1 503")) << refused;
  EXPECT_NE(refused.find("1 long-polls from 127.0.0.1 are open (the limit)"), std::string::npos)
      << refused;
  ASSERT_EQ(http("PUT", server.url() + "/v1/cluster", cluster(0, 1).dump(), true).status, 200);
  const std::string woke = (first == &a ? b : a).get();
  EXPECT_TRUE(woke.starts_with("HTTP/1.1 200")) << woke;
  EXPECT_NE(woke.find("\"version\":1"), std::string::npos) << woke;
}

// A mutation without credentials is refused from its header alone: the server does not wait
// for, nor read, the megabyte its Content-Length announces.
TEST_F(ConfigServerTest, AMutationWithoutCredentialsIsRefusedBeforeItsBody) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  const std::string reply =
      raw_exchange(server.address(), "PUT /v1/cluster HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n");
  EXPECT_TRUE(reply.starts_with("HTTP/1.1 401")) << reply;
  EXPECT_NE(reply.find("missing or invalid Authorization"), std::string::npos) << reply;
  const std::string stale = raw_exchange(
      server.address(), "POST /v1/events HTTP/1.1\r\nAuthorization: " +
                            kf::sign_request(kf::derive_key(kToken, kf::KeyUse::control), "POST",
                                             "/v1/events", "", 1000) +
                            "\r\nContent-Length: 1000000\r\n\r\n");
  EXPECT_TRUE(stale.starts_with("HTTP/1.1 401")) << stale;
  EXPECT_NE(stale.find("ms from the server's time"), std::string::npos) << stale;
}

// A read with a body is refused from its header alone, unread: without credentials a client
// could otherwise park a megabyte per long-poll in the server.
TEST_F(ConfigServerTest, AGetOrHeadWithABodyIsRefusedBeforeItsBody) {
  ServerProcess server(dir_);
  ASSERT_FALSE(server.url().empty());
  for (const std::string head :
       {"GET /v1/cluster?watch=1&after=0 HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n",
        "HEAD /v1/cluster HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
        "GET /v1/events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"}) {
    const std::string reply = raw_exchange(server.address(), head);
    EXPECT_TRUE(reply.starts_with("HTTP/1.1 400")) << head << reply;
    if (!head.starts_with("HEAD")) {
      EXPECT_NE(reply.find("may not have a body"), std::string::npos) << reply;
    }
  }
  // A read without a body is served as before.
  EXPECT_TRUE(
      raw_exchange(server.address(), "GET /v1/cluster HTTP/1.1\r\nConnection: close\r\n\r\n")
          .starts_with("HTTP/1.1 200"));
}

TEST_F(ConfigServerTest, UsageErrorsExit2) {
  const auto exe = server_path();
  const auto token = (dir_ / "token").string();
  const auto state = (dir_ / "state.json").string();
  EXPECT_EQ(run_shell(exe).exit_code, 2);
  EXPECT_EQ(run_shell(exe + " --state " + state).exit_code, 2);
  Ran r = run_shell(exe + " --token-file " + token + " --state " + state + " --listen nonsense");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--listen"), std::string::npos) << r.output;
  r = run_shell(exe + " --token-file " + token + " --state " + state + " --watch-timeout-ms 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(run_shell(exe + " --help").exit_code, 0);
}

TEST_F(ConfigServerTest, TakenPortExits1NamingTheAddress) {
  ServerProcess first(dir_);
  ASSERT_FALSE(first.address().empty());
  const Ran r =
      run_shell(server_path() + " --token-file " + (dir_ / "token").string() + " --state " +
                (dir_ / "other.json").string() + " --listen " + first.address());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot listen on " + first.address()), std::string::npos) << r.output;
}

TEST_F(ConfigServerTest, UnreadableTokenOrCorruptStateExit1NamingTheFile) {
  const auto exe = server_path();
  const auto state = (dir_ / "state.json").string();
  const auto missing = (dir_ / "no-such-token").string();
  Ran r = run_shell(exe + " --token-file " + missing + " --state " + state);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(missing), std::string::npos) << r.output;
  std::ofstream(state) << "{ corrupt";
  r = run_shell(exe + " --token-file " + (dir_ / "token").string() + " --state " + state);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(state), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("corrupt"), std::string::npos) << r.output;
}

}  // namespace
