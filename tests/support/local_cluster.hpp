// SPDX-License-Identifier: Apache-2.0
// Test fixture: N kf::Peer objects in this process on 127.0.0.1 (ports picked by the kernel),
// started on one cluster, plus a helper that runs a function on every rank in its own thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kf/peer.hpp"

namespace kf::test {

inline std::vector<std::unique_ptr<Peer>> make_local_cluster(int n, PeerOptions base = {}) {
  if (base.job_token.empty()) base.job_token = "test-token";
  std::vector<std::unique_ptr<Peer>> peers;
  Cluster c;
  c.version = 1;
  for (int i = 0; i < n; ++i) {
    PeerOptions o = base;
    o.listen = Endpoint{"127.0.0.1", 0};
    peers.push_back(std::make_unique<Peer>(o));
    c.workers.push_back(WorkerSpec{peers.back()->endpoint(), i});
  }
  for (auto& p : peers) p->start(c);
  return peers;
}

/// Runs fn(rank) on one thread per peer and joins them.
inline void run_all(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

}  // namespace kf::test
