// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient against a server that answers with something a config service would not
// send: what the client cannot read is a kf::Error (protocol_error) naming the call, never an
// exception of the JSON library. (The config_client fuzz harness checks this for any answer.)
#include "kf/runtime/config_client.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "support/canned_http.hpp"

namespace kf {
namespace {

using test::CannedHttpServer;

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
  CannedHttpServer server;
  server.set_answers({CannedHttpServer::answer(201, "not json")});
  ConfigClient client(server.url("http"), "token");
  expect_protocol_error([&] { client.post_event("added", "", "", std::nullopt); }, "post event");
}

TEST(ConfigClient, AnEventFieldOfTheWrongTypeIsAProtocolError) {
  CannedHttpServer server;
  server.set_answers(
      {CannedHttpServer::answer(200, R"({"events":[{"seq":"one","type":"added"}]})")});
  ConfigClient client(server.url("http"), "token");
  expect_protocol_error([&] { client.get_events(0); }, "GET events");
}

TEST(ConfigClient, AnEtcdAnswerOfTheWrongShapeIsAProtocolError) {
  CannedHttpServer server;
  server.set_answers({CannedHttpServer::answer(200, R"({"header":{},"kvs":[17]})")});
  ConfigClient client(server.url("etcd"), "token");
  expect_protocol_error([&] { client.get_cluster(); }, "GET cluster");
}

TEST(ConfigClient, AnEtcdKeyOutsideTheJobsPrefixIsAProtocolError) {
  CannedHttpServer server;
  // "L2E=" is base64 of "/a", shorter than the agents' prefix.
  server.set_answers({CannedHttpServer::answer(200, R"({"kvs":[{"key":"L2E=","value":""}]})")});
  ConfigClient client(server.url("etcd"), "token");
  expect_protocol_error([&] { client.live_agents(); }, "outside");
}

// An address is connected to as it is; a name is looked up first. Both reach the service.
TEST(ConfigClient, ReachesAServiceByAddressAndByName) {
  CannedHttpServer server;
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    server.set_answers({CannedHttpServer::answer(200, R"({"events":[]})")});
    ConfigClient client("http://" + host + ":" + std::to_string(server.port()), "token");
    EXPECT_TRUE(client.get_events(0).empty()) << host;
  }
}

}  // namespace
}  // namespace kf
