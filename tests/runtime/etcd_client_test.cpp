// SPDX-License-Identifier: Apache-2.0
// kf::ConfigClient against a real etcd (etcd:// URLs): the cluster document by compare-and-swap,
// the audit trail, the watch, a member that does not answer, the job's own keys. Each test starts
// its own one-member etcd; without etcd they skip and say why.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "config_client/etcd.hpp"
#include "kf/runtime/config_client.hpp"
#include "support/elastic_job.hpp"
#include "support/etcd_process.hpp"

namespace kf {
namespace {

using namespace std::chrono_literals;

Cluster cluster_of(std::uint64_t version, std::initializer_list<std::uint16_t> ports) {
  Cluster c;
  c.version = version;
  int slot = 0;
  for (auto p : ports) c.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", p}, slot++});
  return c;
}

class EtcdClient : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<test::EtcdProcess>();
    if (!etcd_->error().empty()) GTEST_SKIP() << etcd_->error();
  }
  ConfigClient client(const std::string& token = "job-token") const {
    return ConfigClient(etcd_->url(), token);
  }
  std::unique_ptr<test::EtcdProcess> etcd_;
};

TEST(EtcdUrl, ParsesMembersAndPrefix) {
  const auto u = ConfigClient::parse_service_url("etcd://h1:2379,10.0.0.2:2380,[::1]:2379/jobs/a/");
  EXPECT_EQ(u.kind, ServiceUrl::Kind::etcd);
  ASSERT_EQ(u.endpoints.size(), 3u);
  EXPECT_EQ(u.endpoints[0].str(), "h1:2379");
  EXPECT_EQ(u.endpoints[1].str(), "10.0.0.2:2380");
  EXPECT_EQ(u.endpoints[2].host, "::1");
  EXPECT_EQ(u.prefix, "/jobs/a");
  EXPECT_EQ(ConfigClient::parse_service_url("http://h:1").kind, ServiceUrl::Kind::http);
  for (const char* bad :
       {"etcd://", "etcd://h1", "etcd://h1:2379,,h2:1", "etcd://h1:0", "ftp://h:1", "h1:2379"}) {
    EXPECT_THROW(ConfigClient::parse_service_url(bad), std::invalid_argument) << bad;
    EXPECT_THROW(ConfigClient(bad, "t"), std::invalid_argument) << bad;
  }
}

TEST_F(EtcdClient, StoresTheDocumentByCompareAndSwap) {
  ConfigClient c = client();
  EXPECT_EQ(c.get_cluster().version, 0u);
  const Cluster v1 = c.put_cluster(cluster_of(0, {7001, 7002}));
  EXPECT_EQ(v1.version, 1u);
  EXPECT_EQ(c.get_cluster().to_json(), v1.to_json());
  // A writer that read version 0 is too late now, and learns what is there.
  try {
    c.put_cluster(cluster_of(0, {7003}));
    FAIL() << "a stale write was accepted";
  } catch (const ConflictError& e) {
    EXPECT_EQ(e.current().to_json(), v1.to_json());
  }
  Cluster next = v1;
  next.workers.pop_back();
  next.settings["batch_size"] = 64;
  const Cluster v2 = c.put_cluster(next);
  EXPECT_EQ(v2.version, 2u);
  EXPECT_EQ(c.get_cluster().settings["batch_size"], 64);
}

TEST_F(EtcdClient, AWriteFromADocumentAnotherClientReplacedConflicts) {
  // The client writes against the document it read last, without reading it again: the
  // transaction's compare must still catch another client's write in between, with the same
  // version number in the document, and the conflict must hand over the current one.
  ConfigClient a = client(), b = client();
  ASSERT_EQ(a.put_cluster(cluster_of(0, {7001, 7002})).version, 1u);
  const Cluster seen = a.get_cluster();
  ASSERT_EQ(seen.version, 1u);
  Cluster theirs = b.get_cluster();
  theirs.workers.pop_back();
  const Cluster v2 = b.put_cluster(theirs);
  Cluster mine = seen;
  mine.settings["batch_size"] = 32;
  mine.version = 1;
  try {
    a.put_cluster(mine);
    FAIL() << "a write from a replaced document was accepted";
  } catch (const ConflictError& e) {
    EXPECT_EQ(e.current().to_json(), v2.to_json());
  }
  // Edited from what the conflict handed over, it goes through, once.
  Cluster again = v2;
  again.settings["batch_size"] = 32;
  const Cluster v3 = a.put_cluster(again);
  EXPECT_EQ(v3.version, 3u);
  EXPECT_EQ(b.get_cluster().to_json(), v3.to_json());
  EXPECT_EQ(b.get_cluster().size(), 1);
}

TEST_F(EtcdClient, AWriteGivenTheDocumentItWasEditedFromNeedsNoRead) {
  // A survivor's recovery: a client that never read the document writes an edit of the one the
  // caller holds, compared by value inside the transaction. It goes through while that document
  // is current, and conflicts, handing over the current one, once another write replaced it.
  ConfigClient writer = client();
  const Cluster v1 = writer.put_cluster(cluster_of(0, {7001, 7002, 7003}));
  Cluster edit = v1;
  edit.workers.pop_back();
  const Cluster v2 = client().put_cluster(edit, &v1);
  EXPECT_EQ(v2.version, 2u);
  EXPECT_EQ(writer.get_cluster().to_json(), v2.to_json());
  Cluster late = v1;  // another survivor, edited from version 1 too
  late.workers.erase(late.workers.begin());
  try {
    client().put_cluster(late, &v1);
    FAIL() << "an edit of a replaced document was accepted";
  } catch (const ConflictError& e) {
    EXPECT_EQ(e.current().to_json(), v2.to_json());
  }
  EXPECT_EQ(writer.get_cluster().to_json(), v2.to_json());
}

TEST_F(EtcdClient, RejectsWhatTheServiceRejects) {
  ConfigClient c = client();
  const auto code_of = [&](const Cluster& x) {
    try {
      c.put_cluster(x);
    } catch (const Error& e) {
      return e.code();
    }
    return std::error_code();
  };
  EXPECT_EQ(code_of(cluster_of(0, {})), make_error_code(errc::invalid_argument));
  Cluster dup = cluster_of(0, {7001, 7001});
  EXPECT_EQ(code_of(dup), make_error_code(errc::invalid_argument));
  Cluster bad_setting = cluster_of(0, {7001});
  bad_setting.settings["batch_size"] = "big";
  EXPECT_EQ(code_of(bad_setting), make_error_code(errc::invalid_argument));
  EXPECT_THROW(c.post_event("nonsense", "", "", std::nullopt), Error);
  EXPECT_THROW(c.post_event("note", "not-an-endpoint", "", std::nullopt), Error);
  EXPECT_EQ(c.get_cluster().version, 0u);
}

// Someone who reaches etcd without the token writes the job's keys as kf would, but plain: a
// document that would end the job, an event that would have an agent take a leave for a kill,
// an agent offering slots. No process of the job takes any of them; a document it sealed is
// taken again once one is written.
TEST_F(EtcdClient, KeysWrittenWithoutTheTokenAreNotTaken) {
  if (test::run_shell("command -v etcdctl").exit_code != 0) GTEST_SKIP() << "no etcdctl here";
  ConfigClient c = client();
  c.put_cluster(cluster_of(0, {7001}));
  c.announce_agent("10.0.0.1", std::chrono::seconds(30), 2);
  const std::string prefix = detail::prefix_for_token("job-token");
  const auto put = [&](const std::string& key, const std::string& value) {
    const test::Ran r = test::run_shell("ETCDCTL_API=3 etcdctl --endpoints=" + etcd_->member() +
                                        " put '" + key + "' '" + value + "'");
    ASSERT_EQ(r.exit_code, 0) << r.output;
  };
  put(prefix + "/events/ffffffffffffffff", R"({"type":"killed","worker":"127.0.0.1:7001"})");
  put(prefix + "/agents/10.9.9.9", R"({"host":"10.9.9.9","slots":64})");
  for (const auto& e : c.get_events()) EXPECT_NE(e.type, "killed") << e.detail;
  const auto agents = c.live_agents();
  ASSERT_EQ(agents.size(), 1u);
  EXPECT_EQ(agents[0].host, "10.0.0.1");
  Cluster forged = cluster_of(5, {7009});
  forged.settings["finished"] = true;
  put(prefix + "/cluster", forged.to_json().dump());
  ConfigClient fresh = client();
  for (ConfigClient* reader : {&c, &fresh}) {
    try {
      reader->get_cluster();
      ADD_FAILURE() << "a document written without the token was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::service_unavailable)) << e.what();
      EXPECT_NE(std::string(e.what()).find("not a value kf sealed"), std::string::npos) << e.what();
    }
  }
}

// An etcd with its authentication on: kf's client authenticates as the user it is given
// (KF_ETCD_USER, KF_ETCD_PASSWORD_FILE) and sends etcd's token with every request, the watch
// and the lease's keep-alive too. Without a user it says what to set; a wrong password is
// refused, saying which user.
TEST_F(EtcdClient, AnEtcdWithAuthenticationOnIsUsedAsItsUser) {
  if (test::run_shell("command -v etcdctl").exit_code != 0) GTEST_SKIP() << "no etcdctl here";
  const std::string etcdctl = "ETCDCTL_API=3 etcdctl --endpoints=" + etcd_->member();
  const test::Ran on = test::run_shell(etcdctl + " user add root --new-user-password=s3cret && " +
                                       etcdctl + " auth enable");
  ASSERT_EQ(on.exit_code, 0) << on.output;
  const auto refused = [&](const ConfigClientOptions& options, const std::string& why) {
    try {
      ConfigClient(etcd_->url(), "job-token", options).get_cluster();
      ADD_FAILURE() << "got through; expected: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::auth_failed)) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(ConfigClientOptions{}, "KF_ETCD_USER");
  ConfigClientOptions wrong;
  wrong.etcd_user = "root";
  wrong.etcd_password = "guess";
  refused(wrong, "refused the user 'root'");
  ConfigClientOptions o;
  o.etcd_user = "root";
  o.etcd_password = "s3cret";
  ConfigClient c(etcd_->url(), "job-token", o);
  EXPECT_EQ(c.put_cluster(cluster_of(0, {7001})).version, 1u);
  c.post_event("note", "", "as root", std::nullopt);
  c.announce_agent("10.0.0.1", std::chrono::seconds(30), 2);
  c.keep_agent_alive();
  EXPECT_EQ(c.live_agents().size(), 1u);
  ConfigClient watcher(etcd_->url(), "job-token", o);
  auto seen = std::async(std::launch::async, [&] { return watcher.watch(1, 10s).version; });
  ASSERT_EQ(seen.wait_for(200ms), std::future_status::timeout) << "the watch did not wait";
  c.put_cluster(cluster_of(1, {7001, 7002}));
  ASSERT_EQ(seen.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(seen.get(), 2u);
  bool noted = false;
  for (const auto& e : c.get_events()) noted = noted || e.detail == "as root";
  EXPECT_TRUE(noted);
  // The same from the environment, as kfrun's workers and kf-member get it.
  const auto file =
      std::filesystem::temp_directory_path() / ("kf-etcd-password-" + std::to_string(::getpid()));
  std::ofstream(file) << "s3cret\n";
  ::setenv("KF_ETCD_USER", "root", 1);
  EXPECT_THROW(client(), std::invalid_argument) << "a user without a password file";
  ::setenv("KF_ETCD_PASSWORD_FILE", file.c_str(), 1);
  EXPECT_EQ(client().get_cluster().version, 2u);
  ::unsetenv("KF_ETCD_USER");
  ::unsetenv("KF_ETCD_PASSWORD_FILE");
  std::filesystem::remove(file);
}

// An etcd whose clients come over TLS with a certificate (etcds://): kf's client checks the
// member's certificate against the authority it is given and the address it dialled, and shows
// its own; the document, events, leases and the watch all go that way. Without its certificate,
// or trusting another authority, it does not get through, and plain etcd:// finds no etcd there.
TEST(EtcdTls, AnEtcdOverTlsWithClientCertificatesIsUsed) {
  if (test::run_shell("command -v openssl").exit_code != 0) GTEST_SKIP() << "no openssl here";
  const auto dir =
      std::filesystem::temp_directory_path() / ("kf-etcd-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string d = dir.string() + "/";
  const std::string key = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const test::Ran made = test::run_shell(
      "{ cd '" + d + "' && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && " +
      "openssl req -x509" + key + " -keyout ca.key -out ca.pem -days 1 -subj /CN=kf-test-ca && " +
      "openssl req -x509" + key + " -keyout other.key -out other.pem -days 1 -subj /CN=other && " +
      "openssl req" + key + " -keyout server.key -out server.csr -subj /CN=etcd && " +
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 " +
      "-extfile san.ext -out server.pem && " + "openssl req" + key +
      " -keyout client.key -out client.csr -subj /CN=kf && " +
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 " +
      "-out client.pem; } 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ConfigClientOptions o;
  o.etcd_ca_file = d + "ca.pem";
  o.etcd_cert_file = d + "client.pem";
  o.etcd_key_file = d + "client.key";
  const test::EtcdTls tls{d + "server.pem", d + "server.key", d + "ca.pem", o};
  test::EtcdProcess etcd(&tls);
  if (!etcd.error().empty()) GTEST_SKIP() << etcd.error();
  ASSERT_TRUE(etcd.url().starts_with("etcds://"));
  ConfigClient c(etcd.url(), "job-token", o);
  EXPECT_EQ(c.put_cluster(cluster_of(0, {7001})).version, 1u);
  c.post_event("note", "", "over TLS", std::nullopt);
  c.announce_agent("10.0.0.1", std::chrono::seconds(30), 2);
  c.keep_agent_alive();
  EXPECT_EQ(c.live_agents().size(), 1u);
  ConfigClient watcher(etcd.url(), "job-token", o);
  auto seen = std::async(std::launch::async, [&] { return watcher.watch(1, 10s).version; });
  ASSERT_EQ(seen.wait_for(200ms), std::future_status::timeout) << "the watch did not wait";
  c.put_cluster(cluster_of(1, {7001, 7002}));
  ASSERT_EQ(seen.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(seen.get(), 2u);

  const auto fails = [&](ConfigClientOptions options, const std::string& url, const char* what) {
    options.deadline = std::chrono::milliseconds(2000);
    try {
      ConfigClient(url, "job-token", options).get_cluster();
      ADD_FAILURE() << what << ": got through";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), make_error_code(errc::service_unavailable)) << what << ": " << e.what();
    }
  };
  ConfigClientOptions no_certificate = o;
  no_certificate.etcd_cert_file.clear();
  no_certificate.etcd_key_file.clear();
  fails(no_certificate, etcd.url(), "without a client certificate");
  ConfigClientOptions other_authority = o;
  other_authority.etcd_ca_file = d + "other.pem";
  fails(other_authority, etcd.url(), "trusting another authority");
  fails(ConfigClientOptions{}, "etcd://" + etcd.url().substr(8), "plain etcd://");
  o.etcd_key_file.clear();
  EXPECT_THROW(ConfigClient(etcd.url(), "job-token", o), std::invalid_argument);
  std::filesystem::remove_all(dir);
}

TEST_F(EtcdClient, KeepsTheAuditTrailInOrder) {
  ConfigClient c = client();
  c.put_cluster(cluster_of(0, {7001}));
  const ConfigEvent a = c.post_event("added", "127.0.0.1:7001", "kf-member add", 1);
  const ConfigEvent b = c.post_event("note", "", "hello", std::nullopt);
  EXPECT_LT(a.seq, b.seq);
  const auto all = c.get_events();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].type, "cluster_changed");
  EXPECT_EQ(all[0].version, 1u);
  EXPECT_EQ(all[0].detail, "1 worker");
  EXPECT_EQ(all[1].type, "added");
  EXPECT_EQ(all[1].worker, "127.0.0.1:7001");
  EXPECT_EQ(all[1].seq, a.seq);
  EXPECT_EQ(all[2].detail, "hello");
  EXPECT_FALSE(all[2].version.has_value());
  EXPECT_FALSE(all[2].time.empty());
  const auto later = c.get_events(a.seq);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0].seq, b.seq);
}

// A long audit trail comes back whole and in order, a page of 1000 at a time.
TEST_F(EtcdClient, ALongAuditTrailComesBackWholeAPageAtATime) {
  ConfigClient c = client();
  std::vector<std::uint64_t> seqs;
  for (int i = 0; i < 2500; ++i) {
    seqs.push_back(c.post_event("note", "", "event " + std::to_string(i), std::nullopt).seq);
  }
  const auto all = c.get_events(0);
  ASSERT_EQ(all.size(), 2500u);
  for (std::size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].seq, seqs[i]);
    ASSERT_EQ(all[i].detail, "event " + std::to_string(i));
  }
  EXPECT_EQ(c.get_events(seqs[1199]).size(), 1300u);
}

TEST_F(EtcdClient, WatchReturnsTheNextVersionOrTheCurrentOneAtTheTimeout) {
  ConfigClient c = client();
  const Cluster v1 = c.put_cluster(cluster_of(0, {7001}));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.watch(1, 300ms).version, 1u);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_EQ(c.watch(0, 5s).version, 1u);  // already newer: at once

  auto waiter = std::async(std::launch::async, [this] { return client().watch(1, 20s); });
  ASSERT_EQ(waiter.wait_for(200ms), std::future_status::timeout);
  Cluster next = v1;
  next.workers.push_back(WorkerSpec{Endpoint{"127.0.0.1", 7002}, 1});
  c.put_cluster(next);
  ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready);
  const Cluster seen = waiter.get();
  EXPECT_EQ(seen.version, 2u);
  EXPECT_EQ(seen.size(), 2);
}

TEST_F(EtcdClient, CancelEndsAWatch) {
  ConfigClient c = client();
  c.put_cluster(cluster_of(0, {7001}));
  auto waiter = std::async(std::launch::async, [&] { return c.watch(1, 60s); });
  ASSERT_EQ(waiter.wait_for(300ms), std::future_status::timeout) << "the watch did not wait";
  c.cancel();
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  try {
    waiter.get();
    FAIL() << "a cancelled watch returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::cancelled));
  }
}

// Writers race: each change is applied exactly once, none is lost.
TEST_F(EtcdClient, ConcurrentWritersNeverLoseOrRepeatAChange) {
  ConfigClient(etcd_->url(), "job-token").put_cluster(cluster_of(0, {7000}));
  constexpr int kWriters = 3, kEach = 10;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([this, w] {
      ConfigClient c = client();
      for (int i = 0; i < kEach; ++i) {
        Cluster cur = c.get_cluster();
        for (;;) {
          Cluster next = cur;
          next.workers.push_back(
              WorkerSpec{Endpoint{"127.0.0.1", static_cast<std::uint16_t>(10000 + w * 100 + i)},
                         static_cast<int>(cur.workers.size())});
          try {
            c.put_cluster(next);
            break;
          } catch (const ConflictError& e) {
            cur = e.current();
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const Cluster last = client().get_cluster();
  EXPECT_EQ(last.version, 1u + kWriters * kEach);
  std::set<std::string> names;
  for (const auto& w : last.workers) names.insert(w.endpoint.str());
  EXPECT_EQ(names.size(), 1u + kWriters * kEach);
}

// A member that does not answer is skipped: the next one serves.
TEST_F(EtcdClient, ADeadMemberIsSkipped) {
  const std::string url =
      "etcd://127.0.0.1:" + std::to_string(test::free_tcp_port()) + "," + etcd_->member();
  ConfigClient c(url, "job-token", ConfigClientOptions{1000ms});
  EXPECT_EQ(c.put_cluster(cluster_of(0, {7001})).version, 1u);
  EXPECT_EQ(c.get_cluster().version, 1u);
  // None answering: service_unavailable, naming each.
  etcd_->stop();
  try {
    c.get_cluster();
    FAIL() << "read from a stopped etcd";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(errc::service_unavailable));
    EXPECT_NE(std::string(e.what()).find("no etcd member answered"), std::string::npos) << e.what();
  }
}

// Agents are listed, with the slots they offer, while their lease lives: renewed, retired at
// once, or expired after its TTL when nobody renews it (an agent that died).
TEST_F(EtcdClient, AgentsAreAliveWhileTheirLeaseIs) {
  ConfigClient a = client();
  ConfigClient b = client();
  ConfigClient viewer = client();
  const auto hosts = [&] {
    std::vector<std::string> out;
    for (const auto& o : viewer.live_agents())
      out.push_back(o.host + "=" + std::to_string(o.slots));
    return out;
  };
  EXPECT_EQ(hosts(), std::vector<std::string>{});
  a.announce_agent("10.0.0.1", 30s, 4);
  b.announce_agent("10.0.0.2", 2s, 1);
  EXPECT_EQ(hosts(), (std::vector<std::string>{"10.0.0.1=4", "10.0.0.2=1"}));
  EXPECT_FALSE(viewer.live_agents().front().since.empty());
  a.keep_agent_alive();
  a.retire_agent();
  EXPECT_EQ(hosts(), std::vector<std::string>{"10.0.0.2=1"});
  // b never renews: etcd drops it once its lease runs out.
  EXPECT_TRUE(test::eventually([&] { return viewer.live_agents().empty(); }, 20s));
  // Renewing an expired lease announces again, with the same slots.
  b.keep_agent_alive();
  EXPECT_EQ(hosts(), std::vector<std::string>{"10.0.0.2=1"});
}

// Jobs with different tokens (or prefixes) have their own documents in one etcd.
TEST_F(EtcdClient, EachJobHasItsOwnKeys) {
  ConfigClient a = client("token-a");
  ConfigClient b = client("token-b");
  a.put_cluster(cluster_of(0, {7001}));
  EXPECT_EQ(b.get_cluster().version, 0u);
  ConfigClient p(etcd_->url() + "/teams/x", "token-a");
  EXPECT_EQ(p.get_cluster().version, 0u);
  p.put_cluster(cluster_of(0, {7002, 7003}));
  EXPECT_EQ(a.get_cluster().size(), 1);
  EXPECT_EQ(p.get_cluster().size(), 2);
}

}  // namespace
}  // namespace kf
