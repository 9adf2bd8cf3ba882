// SPDX-License-Identifier: Apache-2.0
// The worker program of the multi-process tests, started by kfrun or by a test directly.
//   test-worker sweep         every operation x algorithm x size, verified; exit 0 when all pass
//   test-worker recover       like stream, but on a peer failure the survivors drop the lost
//                             workers, move to the next cluster version without restarting,
//                             check 20 more allreduces and print "recovered size=<n> v<ver>"
//   test-worker stream        allreduce forever; prints "ready" after 20 rounds; on a failure
//                             prints "failure code=<name> ms_since_last_ok=<t> <message>" and
//                             exits 3 (peer_failure) or 1 (anything else)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kf/peer.hpp"

namespace {

float val(int r, std::size_t i) { return static_cast<float>((r + 1) + static_cast<int>(i % 13)); }

bool sweep(kf::Peer& peer) {
  const int p = peer.size(), r = peer.rank();
  int bad = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::cerr << "rank " << r << ": wrong result: " << what << "\n";
      ++bad;
    }
  };
  for (auto algo : {kf::Algorithm::star, kf::Algorithm::ring, kf::Algorithm::tree,
                    kf::Algorithm::clique, kf::Algorithm::rhd, kf::Algorithm::auto_select}) {
    kf::CollOptions o;
    o.algorithm = algo;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4099},
                          std::size_t{(1u << 20) + 3}}) {
      const std::string id = std::string(kf::to_string(algo)) + "/" + std::to_string(n);
      std::vector<float> in(n), out(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = val(r, i);
      peer.allreduce("ar/" + id, kf::buffer(in.data(), n), kf::buffer(out.data(), n), o).wait();
      bool ok = true;
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, i);
        ok = ok && out[i] == want;
      }
      check(ok, "allreduce " + id);
      std::vector<float> b(n, r == 0 ? 2.5f : -1.f);
      kf::CollOptions ob = o;
      ob.root = 0;
      peer.broadcast("bc/" + id, kf::buffer(b.data(), n), ob).wait();
      ok = true;
      for (float x : b) ok = ok && x == 2.5f;
      check(ok, "broadcast " + id);
      std::vector<float> g(n * p);
      peer.allgather("ag/" + id, kf::buffer(in.data(), n), kf::buffer(g.data(), n * p), o).wait();
      ok = true;
      for (int q = 0; q < p; ++q) {
        for (std::size_t i = 0; i < n; ++i) ok = ok && g[q * n + i] == val(q, i);
      }
      check(ok, "allgather " + id);
      std::vector<float> rin(n * p), rout(n);
      for (std::size_t i = 0; i < n * p; ++i) rin[i] = val(r, i);
      peer.reduce_scatter("rs/" + id, kf::buffer(rin.data(), n * p), kf::buffer(rout.data(), n), o)
          .wait();
      ok = true;
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, r * n + i);
        ok = ok && rout[i] == want;
      }
      check(ok, "reduce_scatter " + id);
      kf::CollOptions og = o;
      og.root = p - 1;
      std::vector<float> ga(r == og.root ? n * p : 0);
      peer.gather("ga/" + id, kf::buffer(in.data(), n), kf::buffer(ga.data(), ga.size()), og)
          .wait();
      if (r == og.root) {
        ok = true;
        for (int q = 0; q < p; ++q) {
          for (std::size_t i = 0; i < n; ++i) ok = ok && ga[q * n + i] == val(q, i);
        }
        check(ok, "gather " + id);
      }
    }
    peer.barrier(std::string("barrier/") + std::string(kf::to_string(algo)), o).wait();
  }
  return bad == 0;
}

// Every survivor removes the workers it saw lost; the new version's agreement is checked with
// a consensus over the new cluster document (the config service's CAS does this in a job).
int recover(kf::Peer& peer) {
  std::vector<float> buf(16 * 1024);
  for (long i = 0;; ++i) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    auto h = peer.allreduce("stream", kf::buffer(buf.data(), buf.size()),
                            kf::buffer(buf.data(), buf.size()));
    const std::error_code ec = h.wait_status();
    if (ec) {
      if (ec != kf::errcond::peer_failure) {
        std::cout << "failure " << h.message() << std::endl;
        return 1;
      }
      break;
    }
    if (buf[0] != static_cast<float>(peer.size())) return 1;
    if (i == 20) std::cout << "ready" << std::endl;
  }
  const auto t0 = std::chrono::steady_clock::now();
  kf::Cluster next = peer.cluster();
  const auto lost = peer.lost_peers();
  std::erase_if(next.workers, [&](const kf::WorkerSpec& w) {
    return std::find(lost.begin(), lost.end(), w.endpoint) != lost.end();
  });
  next.version += 1;
  peer.update(next);
  std::string doc = next.to_json().dump();
  std::vector<std::uint8_t> bytes(doc.begin(), doc.end());
  bool agreed = false;
  peer.consensus("new-cluster", kf::buffer(bytes.data(), bytes.size()), &agreed).wait();
  if (!agreed) {
    std::cout << "survivors disagree on the new cluster" << std::endl;
    return 1;
  }
  for (int i = 0; i < 20; ++i) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    peer.allreduce("after", kf::buffer(buf.data(), buf.size()), kf::buffer(buf.data(), buf.size()))
        .wait();
    if (buf[0] != static_cast<float>(peer.size())) {
      std::cout << "wrong sum after recovery: " << buf[0] << std::endl;
      return 1;
    }
  }
  const auto ms =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count() /
      1000.0;
  std::cout << "recovered size=" << peer.size() << " v" << peer.version() << " resume_ms=" << ms
            << std::endl;
  return 0;
}

int stream(kf::Peer& peer) {
  std::vector<float> buf(16 * 1024, 1.0f);
  auto last_ok = std::chrono::steady_clock::now();
  for (long i = 0;; ++i) {
    auto h = peer.allreduce("stream", kf::buffer(buf.data(), buf.size()),
                            kf::buffer(buf.data(), buf.size()));
    const std::error_code ec = h.wait_status();
    const auto now = std::chrono::steady_clock::now();
    if (ec) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_ok).count();
      const bool peer_failure = ec == kf::errcond::peer_failure;
      std::cout << "failure code=" << (ec == kf::errc::peer_lost ? "peer_lost" : ec.message())
                << " ms_since_last_ok=" << ms << " " << h.message() << std::endl;
      return peer_failure ? 3 : 1;
    }
    last_ok = now;
    std::fill(buf.begin(), buf.end(), 1.0f);
    if (i == 20) std::cout << "ready" << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "sweep" && mode != "stream" && mode != "recover") {
    std::cerr << "usage: test-worker sweep|stream|recover\n";
    return 2;
  }
  try {
    auto peer = kf::Peer::from_environment();
    if (mode == "sweep") {
      const bool ok = sweep(*peer);
      std::cout << "rank " << peer->rank() << " of " << peer->size() << ": sweep "
                << (ok ? "ok" : "FAILED") << std::endl;
      return ok ? 0 : 1;
    }
    return mode == "recover" ? recover(*peer) : stream(*peer);
  } catch (const std::exception& e) {
    std::cerr << "test-worker: " << e.what() << "\n";
    return 1;
  }
}
