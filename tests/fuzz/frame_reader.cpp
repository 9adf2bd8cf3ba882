// SPDX-License-Identifier: Apache-2.0
// A live worker's frame reader (libkf's transport), fed by a stranger on a real connection. Two
// kf::Peer objects in this process make a job; each input opens one connection to one of them
// and sends, by its first byte:
//   0  raw bytes over TCP, before any handshake;
//   1  raw bytes over TCP after a genuine handshake (as an outside identity), without MACs;
//   2  frames over TCP after the handshake, each with a correct MAC: header fields, name and
//      payload from the input, lengths true to what follows;
//   3  the same frames over the same-host socket (which carries no MACs);
//   4  raw bytes over the same-host socket after the handshake.
// Then it closes the connection, and the two workers run an allreduce, which must give the
// right sum on both: the worker survived, dropped what it should and still serves its job.
// Frames kept for a receive that never comes are capped (max_unexpected_bytes) and the run has
// libFuzzer's memory limit, so the memory stays bounded. Every 2000 inputs the job is made anew,
// so that what one stranger was allowed to leave behind does not pile up across the run.
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/null_sink.h>

#include "check.hpp"
#include "kf/common/log.hpp"
#include "kf/peer.hpp"
#include "support/raw_client.hpp"
#include "transport/frame.hpp"
#include "transport/frame_mac.hpp"

namespace {

using kf::transport::FrameHeader;
using kf::transport::FrameType;

struct Job {
  std::vector<std::unique_ptr<kf::Peer>> peers;
  int checks = 0;

  Job() {
    kf::Cluster c;
    c.version = 1;
    for (int i = 0; i < 2; ++i) {
      kf::PeerOptions o;
      o.job_token = "test-token";
      o.listen = kf::Endpoint{"127.0.0.1", 0};
      o.timeout = std::chrono::milliseconds(5000);
      o.handshake_timeout = std::chrono::milliseconds(1000);
      o.max_unexpected_bytes = std::size_t{4} << 20;
      o.max_unexpected_bytes_per_peer = std::size_t{1} << 20;
      peers.push_back(std::make_unique<kf::Peer>(o));
      c.workers.push_back(kf::WorkerSpec{peers.back()->endpoint(), i});
    }
    for (auto& p : peers) p->start(c);
  }

  // An allreduce of 64 ints on both workers; true when both got the sum.
  bool allreduce_works() {
    const std::string name = "check-" + std::to_string(checks++);
    std::vector<std::vector<int>> v(2, std::vector<int>(64, 0));
    v[0].assign(64, 3);
    v[1].assign(64, 4);
    std::vector<kf::Handle> h;
    for (int r = 0; r < 2; ++r) {
      h.push_back(
          peers[r]->allreduce(name, kf::buffer(v[r].data(), 64), kf::buffer(v[r].data(), 64)));
    }
    try {
      for (auto& x : h) x.wait();
    } catch (const kf::Error& e) {
      std::fprintf(stderr, "allreduce %s failed: %s\n", name.c_str(), e.what());
      return false;
    }
    return v[0] == std::vector<int>(64, 7) && v[1] == std::vector<int>(64, 7);
  }
};

std::unique_ptr<Job> job;

// Frames from the input: each a type, flags, a cluster version near the job's, a tag, a name and
// a payload, the lengths stated as they are. With `mac`, each is followed by its tag.
std::string frames(kf::fuzz::Input& in, kf::transport::FrameMac* mac) {
  std::string wire;
  while (!in.empty()) {
    FrameHeader h;
    h.type = static_cast<FrameType>(in.byte() % 12);
    h.flags = in.byte() & 0x03;
    const std::uint8_t v = in.byte();
    h.cluster_version = v < 250 ? v % 4 : (std::uint64_t{1} << (v - 200));
    h.tag = in.byte();
    const std::string name = in.piece();
    const std::string payload = in.piece();
    h.name_bytes = static_cast<std::uint32_t>(name.size());
    h.payload_bytes = payload.size();
    const std::size_t start = wire.size();
    const auto hb = kf::transport::encode(h);
    wire.append(reinterpret_cast<const char*>(hb.data()), hb.size());
    wire += name;
    wire += payload;
    if (mac != nullptr) {
      mac->begin();
      mac->update(wire.data() + start, wire.size() - start);
      const kf::transport::Tag t = mac->finish();
      wire.append(reinterpret_cast<const char*>(t.data()), t.size());
    }
  }
  return wire;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Every input is refused with a warning: the lines are made (escaping and rate limits are
  // part of what runs) and then dropped.
  static const bool quiet = [] {
    kf::logger().sinks().clear();
    kf::logger().sinks().push_back(std::make_shared<spdlog::sinks::null_sink_mt>());
    return true;
  }();
  (void)quiet;
  static int inputs = 0;
  if (!job || ++inputs % 2000 == 0) {
    job.reset();
    job = std::make_unique<Job>();
    // The workers' threads must end before OpenSSL's own exit handler frees what it keeps per
    // thread, or what those threads hold is lost: a handler registered after OpenSSL's runs
    // before it.
    static const int once = std::atexit([] { job.reset(); });
    (void)once;
  }
  kf::fuzz::Input in(data, size);
  const std::uint8_t mode = in.byte() % 5;
  const kf::Endpoint target = job->peers[in.byte() & 1]->endpoint();
  const bool local = mode >= 3;
  const int s = local ? kf::test::connect_local(target) : kf::test::connect_to(target);
  KF_FUZZ_CHECK(s >= 0, "cannot connect to the worker");
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::string wire;
  if (mode == 0) {
    wire = in.piece(true);
  } else {
    const auto key = kf::test::authenticate(s, local ? "127.0.0.1:2" : "127.0.0.1:1");
    KF_FUZZ_CHECK(key.has_value(), "the handshake failed");
    if (mode == 2) {
      kf::transport::FrameMac mac(*key);
      wire = frames(in, &mac);
    } else if (mode == 3) {
      wire = frames(in, nullptr);
    } else {
      wire = in.piece(true);
    }
  }
  // The worker may close the connection before it has read everything: no SIGPIPE, no check.
  for (std::size_t sent = 0; sent < wire.size();) {
    const ssize_t n = ::send(s, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  ::close(s);
  KF_FUZZ_CHECK(job->allreduce_works(), "the job's allreduce failed after a stranger's input");
  return 0;
}
