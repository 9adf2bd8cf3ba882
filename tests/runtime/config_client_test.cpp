// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient against a server that answers with something a config service would not
// send: what the client cannot read is a kf::Error (protocol_error) naming the call, never an
// exception of the JSON library. (The config_client fuzz harness checks this for any answer.)
#include "kf/runtime/config_client.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "config_client/etcd.hpp"
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
  server.sign_as("token");
  server.set_answers({CannedHttpServer::answer(201, "not json")});
  ConfigClient client(server.url("http"), "token");
  expect_protocol_error([&] { client.post_event("added", "", "", std::nullopt); }, "post event");
}

TEST(ConfigClient, AnEventFieldOfTheWrongTypeIsAProtocolError) {
  CannedHttpServer server;
  server.sign_as("token");
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

// The cluster key as etcd gives it: the document of `version` (one worker), written at
// `revision`, sealed by a process of the job of `token` (or given as `value` itself).
std::string etcd_kv(std::uint64_t revision, std::uint64_t version,
                    const std::string& token = "token", std::optional<std::string> raw = {}) {
  Cluster c;
  c.version = version;
  c.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4000}, 0});
  const std::string doc = raw ? *raw
                              : detail::sealed_document(derive_key(token, KeyUse::control),
                                                        detail::prefix_for_token("token"), c);
  std::string value(4 * ((doc.size() + 2) / 3) + 1, '\0');
  value.resize(static_cast<std::size_t>(EVP_EncodeBlock(
      reinterpret_cast<unsigned char*>(value.data()),
      reinterpret_cast<const unsigned char*>(doc.data()), static_cast<int>(doc.size()))));
  return R"({"key":"","value":")" + value + R"(","mod_revision":")" + std::to_string(revision) +
         R"("})";
}

// etcd's answer to a range of the cluster key at store revision `revision`, where the document
// of `version` was written (as etcd_kv writes it).
std::string etcd_range(std::uint64_t revision, std::uint64_t version,
                       const std::string& token = "token", std::optional<std::string> raw = {}) {
  return R"({"header":{"revision":")" + std::to_string(revision) + R"("},"kvs":[)" +
         etcd_kv(revision, version, token, std::move(raw)) + "]}";
}

// A document in etcd is taken only sealed with this job's key, and never older than one taken:
// one written plain (as anyone who reaches etcd could), one sealed under another job's key and
// an old one written again are not taken; the client says why, as though etcd had not
// answered, so that the job trains on.
TEST(ConfigClient, AnEtcdDocumentNotSealedByTheJobIsNotTaken) {
  Cluster plain;
  plain.version = 7;
  plain.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4000}, 0});
  plain.settings = {{"finished", true}};
  CannedHttpServer server;
  ConfigClient client(server.url("etcd"), "token");
  const auto refused = [&](const std::string& range, const std::string& why) {
    server.set_answers({CannedHttpServer::answer(200, range)});
    try {
      client.get_cluster();
      ADD_FAILURE() << "taken: " << range;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::service_unavailable)) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(etcd_range(5, 7, "token", plain.to_json().dump()), "not a value kf sealed");
  refused(etcd_range(5, 7, "another job's token"), "not sealed with this job's key");
  server.set_answers({CannedHttpServer::answer(200, etcd_range(6, 7))});
  EXPECT_EQ(client.get_cluster().version, 7u);
  refused(etcd_range(8, 6), "went back from version 7 to 6");
}

// The first message of an etcd watch: created, at store revision `revision`.
std::string etcd_created(std::uint64_t revision) {
  return R"({"result":{"header":{"revision":")" + std::to_string(revision) +
         R"("},"created":true}})"
         "\n";
}

// An etcd watch begins at the store's revision when it is created, which its first message
// gives. When the store moved on after the document was read, the document is read again: a
// change in between is not missed (and the watch is not one etcd serves 100 ms late).
TEST(ConfigClient, AnEtcdWatchReadsWhatChangedBetweenItsReadAndItsStart) {
  using namespace std::chrono_literals;
  CannedHttpServer server;
  server.set_answers({CannedHttpServer::answer(200, etcd_range(5, 1)),
                      CannedHttpServer::answer(200, etcd_created(7)),
                      CannedHttpServer::answer(200, etcd_range(7, 2))});
  ConfigClient client(server.url("etcd"), "token");
  EXPECT_EQ(client.watch(1, 2s).version, 2u);
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_NE(requests[1].find("POST /v3/watch"), std::string::npos) << requests[1];
  EXPECT_EQ(requests[1].find("start_revision"), std::string::npos) << requests[1];
  EXPECT_NE(requests[2].find("POST /v3/kv/range"), std::string::npos) << requests[2];
}

// A created message that does not say at which revision cannot tell that nothing moved.
TEST(ConfigClient, AnEtcdWatchCreatedWithoutItsRevisionReadsAgain) {
  using namespace std::chrono_literals;
  CannedHttpServer server;
  server.set_answers({CannedHttpServer::answer(200, etcd_range(5, 1)),
                      CannedHttpServer::answer(200, R"({"result":{"created":true}})"
                                                    "\n"),
                      CannedHttpServer::answer(200, etcd_range(6, 2))});
  ConfigClient client(server.url("etcd"), "token");
  EXPECT_EQ(client.watch(1, 2s).version, 2u);
}

// Created at the revision read: nothing happened in between, so the watch's events say what
// changed (a second read would have said version 3 here).
TEST(ConfigClient, AnEtcdWatchCreatedAtTheRevisionReadTakesItsEvents) {
  using namespace std::chrono_literals;
  CannedHttpServer server;
  server.set_answers(
      {CannedHttpServer::answer(200, etcd_range(5, 1)),
       CannedHttpServer::answer(
           200, etcd_created(5) + R"({"result":{"events":[{"kv":)" + etcd_kv(6, 2) + "}]}}\n"),
       CannedHttpServer::answer(200, etcd_range(7, 3))});
  ConfigClient client(server.url("etcd"), "token");
  EXPECT_EQ(client.watch(1, 2s).version, 2u);
  EXPECT_EQ(server.requests().size(), 2u) << "read again after a watch created where it read";
}

// A write given the document it was edited from makes one request: a transaction that compares
// the stored bytes with that document's.
TEST(ConfigClient, AnEtcdWriteGivenItsBaseComparesByValueWithoutARead) {
  CannedHttpServer server;
  server.set_answers(
      {CannedHttpServer::answer(200, R"({"header":{"revision":"9"},"succeeded":true})")});
  ConfigClient client(server.url("etcd"), "token");
  Cluster base;
  base.version = 4;
  base.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4000}, 0});
  base.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4001}, 1});
  Cluster next = base;
  next.workers.pop_back();
  EXPECT_EQ(client.put_cluster(next, &base).version, 5u);
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_NE(requests[0].find("POST /v3/kv/txn"), std::string::npos) << requests[0];
  EXPECT_NE(requests[0].find(R"("target":"VALUE")"), std::string::npos) << requests[0];
}

// The same version in other bytes (written by another program) fails the compare by value; the
// answer holds its revision, and the write compared by revision goes on. A newer version is a
// conflict that hands it over.
TEST(ConfigClient, AnEtcdWriteComparedByValueFallsBackToTheRevisionOfTheSameVersion) {
  CannedHttpServer server;
  const auto failed = [](std::uint64_t revision, std::uint64_t version) {
    return R"({"header":{"revision":"9"},"responses":[{"response_range":)" +
           etcd_range(revision, version) + "}]}";
  };
  Cluster base;
  base.version = 1;
  base.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4001}, 0});
  Cluster next = base;
  next.settings["batch_size"] = 32;
  server.set_answers(
      {CannedHttpServer::answer(200, failed(5, 1)),
       CannedHttpServer::answer(200, R"({"header":{"revision":"10"},"succeeded":true})")});
  {
    ConfigClient client(server.url("etcd"), "token");
    EXPECT_EQ(client.put_cluster(next, &base).version, 2u);
  }
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_NE(requests[1].find(R"("mod_revision":"5")"), std::string::npos) << requests[1];

  server.set_answers({CannedHttpServer::answer(200, failed(7, 3))});
  ConfigClient client(server.url("etcd"), "token");
  try {
    client.put_cluster(next, &base);
    FAIL() << "a write over a newer version was accepted";
  } catch (const ConflictError& e) {
    EXPECT_EQ(e.current().version, 3u);
  }
  EXPECT_EQ(server.requests().size(), 1u);
}

// Only the job's service can answer: an answer (here a watch's, with a document that would end
// the job) without the MAC that binds it to the request's nonce under the job's key is dropped
// as though the service had not answered; one signed under another job's key is refused as the
// sign of a wrong token. Signed under this job's key, the same answer is taken.
TEST(ConfigClient, AnAnswerNotSignedByTheJobsServiceIsNotTaken) {
  Cluster forged;
  forged.version = 9;
  forged.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 4000}, 0});
  forged.settings = {{"finished", true}};
  const std::string body = forged.to_json().dump();
  CannedHttpServer server;
  ConfigClient client(server.url("http"), "token");
  server.set_answers({CannedHttpServer::answer(200, body)});
  try {
    client.watch(3, std::chrono::milliseconds(100));
    FAIL() << "an unsigned answer was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::service_unavailable)) << e.what();
    EXPECT_NE(std::string(e.what()).find("no X-KF-Answer was dropped"), std::string::npos)
        << e.what();
  }
  server.sign_as("another job's token");
  server.set_answers({CannedHttpServer::answer(200, body)});
  try {
    client.get_cluster();
    FAIL() << "an answer signed under another key was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::auth_failed)) << e.what();
    EXPECT_NE(std::string(e.what()).find("the job token differs"), std::string::npos) << e.what();
  }
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_NE(requests[0].find("X-KF-Nonce: "), std::string::npos) << "a read carries a nonce";
  server.sign_as("token");
  server.set_answers({CannedHttpServer::answer(200, body)});
  EXPECT_EQ(client.get_cluster().version, 9u);
}

// An answer's MAC binds its request (method, target, nonce) and all of the answer (status, body).
TEST(AnswerMac, MatchesOnlyItsOwnRequestAndAnswer) {
  const Key key = derive_key("token", KeyUse::control);
  const std::string nonce = fresh_nonce(), other = fresh_nonce();
  EXPECT_TRUE(is_nonce(nonce));
  EXPECT_NE(nonce, other);
  const std::string mac = answer_mac(key, "GET", "/v1/cluster", nonce, 200, "{}\n");
  EXPECT_TRUE(answer_matches(key, mac, "GET", "/v1/cluster", nonce, 200, "{}\n"));
  EXPECT_FALSE(answer_matches(key, mac, "GET", "/v1/cluster", other, 200, "{}\n"))
      << "a recorded answer replayed to another request";
  EXPECT_FALSE(answer_matches(key, mac, "GET", "/v1/events", nonce, 200, "{}\n"));
  EXPECT_FALSE(answer_matches(key, mac, "PUT", "/v1/cluster", nonce, 200, "{}\n"));
  EXPECT_FALSE(answer_matches(key, mac, "GET", "/v1/cluster", nonce, 409, "{}\n"));
  EXPECT_FALSE(answer_matches(key, mac, "GET", "/v1/cluster", nonce, 200, "{} \n"));
  EXPECT_FALSE(answer_matches(derive_key("other", KeyUse::control), mac, "GET", "/v1/cluster",
                              nonce, 200, "{}\n"));
  EXPECT_FALSE(answer_matches(key, "", "GET", "/v1/cluster", nonce, 200, "{}\n"));
}

// An address is connected to as it is; a name is looked up first. Both reach the service.
TEST(ConfigClient, ReachesAServiceByAddressAndByName) {
  CannedHttpServer server;
  server.sign_as("token");
  for (const std::string host : {"127.0.0.1", "localhost"}) {
    server.set_answers({CannedHttpServer::answer(200, R"({"events":[]})")});
    ConfigClient client("http://" + host + ":" + std::to_string(server.port()), "token");
    EXPECT_TRUE(client.get_events(0).empty()) << host;
  }
}

}  // namespace
}  // namespace kf
