// SPDX-License-Identifier: Apache-2.0
// A MetricsServer on 127.0.0.1, port 0, scraped with curl: the exposition and its content type,
// /healthz, 404 for another path, 405 (with Allow) for another method, HEAD, keep-alive, a port
// already taken, and a destructor that returns with an idle connection open and closes the port.
#include "kf/monitor/metrics_server.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "kf/monitor/prometheus_text.hpp"
#include "support/process.hpp"

namespace kf::monitor {
namespace {

using kf::test::Ran;
using kf::test::run_shell;

struct Scrape {
  int status = 0;
  std::string content_type;
  std::string body;
};

// One request with curl: the body, then a last line "STATUS CONTENT_TYPE".
Scrape scrape(const std::string& url, const std::string& curl_options = "") {
  const Ran ran = run_shell("curl -s -m 10 " + curl_options +
                            " -w '\\n%{http_code} %{content_type}' '" + url + "'");
  Scrape s;
  const auto newline = ran.output.rfind('\n');
  if (ran.exit_code != 0 || newline == std::string::npos) {
    ADD_FAILURE() << "curl " << url << " exited with " << ran.exit_code << ": " << ran.output;
    return s;
  }
  s.body = ran.output.substr(0, newline);
  const std::string last = ran.output.substr(newline + 1);
  s.status = std::atoi(last.c_str());
  const auto space = last.find(' ');
  if (space != std::string::npos) s.content_type = last.substr(space + 1);
  return s;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  MetricsServerTest() {
    steps_.inc(41);
    registry_.gauge("kf_workers", "Workers in the cluster.", {{"job", "test \"1\""}}).set(4);
    server_.emplace(registry_, MetricsServerOptions{.host = "127.0.0.1", .port = 0});
  }

  // A connection to the server that sends nothing; -1 when it cannot be made.
  int connect_to_server() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      return fd;
    }
    if (fd >= 0) ::close(fd);
    return -1;
  }

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(server_->port()) + path;
  }

  MetricsRegistry registry_;
  Counter& steps_ = registry_.counter("kf_steps_total", "Optimizer steps.");
  std::optional<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ListensOnThePortTheKernelPicked) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(MetricsServerTest, ServesTheExpositionOnGetMetrics) {
  auto s = scrape(url("/metrics"));
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(s.body, to_prometheus_text(registry_));
  EXPECT_NE(s.body.find("kf_steps_total 41\n"), std::string::npos) << s.body;
  EXPECT_NE(s.body.find("kf_workers{job=\"test \\\"1\\\"\"} 4"), std::string::npos) << s.body;

  steps_.inc();  // the next scrape sees the update
  s = scrape(url("/metrics?debug=1"));
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("kf_steps_total 42\n"), std::string::npos) << s.body;
}

TEST_F(MetricsServerTest, AnswersHealthz) {
  const auto s = scrape(url("/healthz"));
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.body, "ok\n");
}

TEST_F(MetricsServerTest, Answers404ForOtherPaths) {
  EXPECT_EQ(scrape(url("/nope")).status, 404);
  EXPECT_EQ(scrape(url("/")).status, 404);
  EXPECT_EQ(scrape(url("/metrics/")).status, 404);
  EXPECT_EQ(scrape(url("/nope"), "-X POST").status, 404);
}

TEST_F(MetricsServerTest, Answers405WithAllowForOtherMethods) {
  EXPECT_EQ(scrape(url("/metrics"), "-X POST").status, 405);
  EXPECT_EQ(scrape(url("/metrics"), "-X PUT --data-binary x").status, 405);
  EXPECT_EQ(scrape(url("/healthz"), "-X DELETE").status, 405);
  const auto headers = scrape(url("/metrics"), "-X POST -i");
  EXPECT_NE(headers.body.find("Allow: GET, HEAD\r\n"), std::string::npos) << headers.body;
}

TEST_F(MetricsServerTest, AnswersHeadWithTheLengthOfGetAndNoBody) {
  const auto get = scrape(url("/metrics"));
  const auto head = scrape(url("/metrics"), "-I");
  EXPECT_EQ(head.status, 200);
  EXPECT_NE(head.body.find("Content-Length: " + std::to_string(get.body.size()) + "\r\n"),
            std::string::npos)
      << head.body;
}

TEST_F(MetricsServerTest, ServesSeveralRequestsOnOneConnection) {
  const Ran ran = run_shell("curl -sv -m 10 '" + url("/healthz") + "' '" + url("/metrics") + "'");
  EXPECT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("Re-using existing connection"), std::string::npos) << ran.output;
  EXPECT_NE(ran.output.find("kf_steps_total 41"), std::string::npos) << ran.output;
}

TEST_F(MetricsServerTest, ThrowsNamingTheAddressWhenThePortIsTaken) {
  try {
    MetricsServer second(registry_, {.host = "127.0.0.1", .port = server_->port()});
    ADD_FAILURE() << "a second server listens on " << second.address();
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find(server_->address()), std::string::npos) << e.what();
  }
}

int open_descriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// 1,000 clients that connect and say nothing hold at most max_connections of the server's
// descriptors (the oldest are closed to make room), and a scrape after them is served.
TEST_F(MetricsServerTest, IdleConnectionsCannotUseUpTheDescriptors) {
  const int before = open_descriptors();
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    idle.push_back(connect_to_server());
    ASSERT_GE(idle.back(), 0);
  }
  // Accepted in order: once this is answered, every idle connection was accepted before it.
  EXPECT_EQ(scrape(url("/healthz")).status, 200);
  const int server_side = open_descriptors() - before - static_cast<int>(idle.size());
  EXPECT_LE(server_side, static_cast<int>(MetricsServerOptions{}.max_connections) + 4);
  for (const int fd : idle) ::close(fd);
}

TEST_F(MetricsServerTest, DestructorReturnsWithAnIdleConnectionOpenAndClosesThePort) {
  const int fd = connect_to_server();
  ASSERT_GE(fd, 0);
  const std::string before = url("/healthz");
  server_.reset();  // must not wait for the idle connection's 30 s read deadline
  // The server closed its end: the idle connection reads EOF (or a reset).
  char byte = 0;
  EXPECT_LE(::read(fd, &byte, 1), 0);
  ::close(fd);
  const Ran ran = run_shell("curl -s -m 10 '" + before + "'");
  EXPECT_EQ(ran.exit_code, 7) << "curl: " << ran.output;  // 7: could not connect
}

}  // namespace
}  // namespace kf::monitor
