// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient against a server that answers with something a config service would not
// send: what the client cannot read is a kf::Error (protocol_error) naming the call, never an
// exception of the JSON library. (The config_client fuzz harness checks this for any answer.)
#include "kf/runtime/config_client.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace kf {
namespace {

// Answers `answers` connections on 127.0.0.1, one request each, with `answer`.
class OneAnswerServer {
 public:
  OneAnswerServer(std::string answer, int answers) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, answer = std::move(answer), answers] {
      for (int i = 0; i < answers; ++i) {
        const int s = ::accept(fd_, nullptr, nullptr);
        if (s < 0) return;
        std::string in;
        char buf[4096];
        // The client's requests here are small and carry a body of at most one read.
        while (in.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::recv(s, buf, sizeof buf, 0);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
        }
        (void)::send(s, answer.data(), answer.size(), MSG_NOSIGNAL);
        ::shutdown(s, SHUT_WR);
        ::close(s);
      }
    });
  }
  ~OneAnswerServer() {
    thread_.join();
    ::close(fd_);
  }
  std::string url(const char* scheme) const {
    return std::string(scheme) + "://127.0.0.1:" + std::to_string(port_);
  }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

std::string answer(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nContent-Type: application/json\r\n\r\n" + body;
}

void expect_protocol_error(const std::function<void()>& call, const std::string& names) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::protocol_error)) << e.what();
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(ConfigClient, AnEventAnswerThatIsNotJsonIsAProtocolError) {
  OneAnswerServer server(answer(201, "not json"), 1);
  ConfigClient client(server.url("http"), "token");
  expect_protocol_error([&] { client.post_event("added", "", "", std::nullopt); }, "post event");
}

TEST(ConfigClient, AnEventFieldOfTheWrongTypeIsAProtocolError) {
  OneAnswerServer server(answer(200, R"({"events":[{"seq":"one","type":"added"}]})"), 1);
  ConfigClient client(server.url("http"), "token");
  expect_protocol_error([&] { client.get_events(0); }, "GET events");
}

TEST(ConfigClient, AnEtcdAnswerOfTheWrongShapeIsAProtocolError) {
  OneAnswerServer server(answer(200, R"({"header":{},"kvs":[17]})"), 1);
  ConfigClient client(server.url("etcd"), "token");
  expect_protocol_error([&] { client.get_cluster(); }, "GET cluster");
}

}  // namespace
}  // namespace kf
