// SPDX-License-Identifier: Apache-2.0
// Test fixture: N kf::Peer objects in this process on 127.0.0.1 (ports picked by the kernel),
// started on one cluster, plus a helper that runs a function on every rank in its own thread.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kf/peer.hpp"

namespace kf::test {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
/// Sanitizers slow every thread 5-20x, and these tests run up to 16 of them in one process on
/// 2 cores: a heartbeat can then be late by more than the default timeout without anything
/// being wrong. The default heartbeat is stretched there (tests that set their own keep it);
/// the release build runs the same tests with the default.
inline constexpr int kHeartbeatStretch = 4;
#else
inline constexpr int kHeartbeatStretch = 1;
#endif

/// Stretches `o`'s heartbeat by kHeartbeatStretch, unless the test chose its own.
inline void stretch_heartbeat(PeerOptions& o) {
  const PeerOptions defaults;
  if (o.heartbeat_timeout == defaults.heartbeat_timeout &&
      o.heartbeat_interval == defaults.heartbeat_interval) {
    o.heartbeat_timeout *= kHeartbeatStretch;
    o.heartbeat_interval *= kHeartbeatStretch;
  }
}

/// One peer per entry of `options` (rank i gets options[i]), listening on 127.0.0.1.
inline std::vector<std::unique_ptr<Peer>> make_local_cluster(std::vector<PeerOptions> options) {
  std::vector<std::unique_ptr<Peer>> peers;
  Cluster c;
  c.version = 1;
  for (std::size_t i = 0; i < options.size(); ++i) {
    PeerOptions& o = options[i];
    if (o.job_token.empty()) o.job_token = "test-token";
    stretch_heartbeat(o);
    o.listen.host = "127.0.0.1";
    o.listen.port = 0;
    peers.push_back(std::make_unique<Peer>(o));
    c.workers.push_back(WorkerSpec{peers.back()->endpoint(), static_cast<int>(i)});
  }
  for (auto& p : peers) p->start(c);
  return peers;
}

inline std::vector<std::unique_ptr<Peer>> make_local_cluster(int n, const PeerOptions& base) {
  return make_local_cluster(std::vector<PeerOptions>(static_cast<std::size_t>(n), base));
}

inline std::vector<std::unique_ptr<Peer>> make_local_cluster(int n) {
  PeerOptions base;
  base.job_token = "test-token";
  return make_local_cluster(n, base);
}

/// N peers on 127.0.0.1 that are not started yet, and the cluster (version 1) they make: what a
/// static job's kf::Session takes.
struct UnstartedJob {
  std::vector<std::unique_ptr<Peer>> peers;  // handed to the sessions
  Cluster cluster;
};

inline UnstartedJob make_unstarted_job(int n, const std::string& token) {
  UnstartedJob j;
  j.cluster.version = 1;
  for (int i = 0; i < n; ++i) {
    PeerOptions o;
    o.job_token = token;
    stretch_heartbeat(o);
    o.listen = Endpoint{"127.0.0.1", 0};
    j.peers.push_back(std::make_unique<Peer>(o));
    j.cluster.workers.push_back(WorkerSpec{j.peers.back()->endpoint(), i});
  }
  return j;
}

/// Runs fn(rank) on one thread per peer and joins them. An exception that leaves fn (a
/// collective that failed: a peer lost, a timeout) is thrown again here once every thread has
/// ended, the lowest rank's, naming its rank: the test fails and says why, where an exception
/// leaving a thread would end the whole test program.
inline void run_all(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&fn, &errors, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      throw std::runtime_error("rank " + std::to_string(r) + ": " + e.what());
    }
  }
}

}  // namespace kf::test
