// SPDX-License-Identifier: Apache-2.0
// Hostile and broken connections: garbage bytes, oversized lengths, a client that never
// finishes the handshake and a peer with the wrong job token are all rejected with a logged
// reason, and the worker goes on serving its real peers.
#include "kf/peer.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "kf/common/log.hpp"
#include "kf/shared_memory.hpp"
#include "support/local_cluster.hpp"
#include "support/log_capture.hpp"
#include "support/process.hpp"
#include "support/raw_client.hpp"
#include "transport/auth.hpp"
#include "transport/frame.hpp"
#include "transport/frame_mac.hpp"
#include "transport/shm/shm_ring.hpp"

namespace kf {
namespace {

using test::authenticate;
using test::connect_local;
using test::connect_to;
using test::LogCapture;
using test::read_all;
using test::read_frame;
using test::send_frame;

// A free TCP port of 127.0.0.1 (free when this returns).
std::uint16_t free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(s);
  return ntohs(a.sin_port);
}

// Reads until the peer closes the connection (the challenge frame comes first). Returns true
// when the peer closed within the socket's receive timeout.
bool closed_by_peer(int s) {
  timeval tv{5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[256];
  for (;;) {
    const ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// A data frame that claims its payload waits in the sender's memory at `addr`.
void send_single_copy_frame(int s, std::uint64_t addr) {
  transport::FrameHeader d;
  d.type = transport::FrameType::data;
  d.flags = transport::kFlagRemote;
  d.cluster_version = 1;
  d.name_bytes = 1;
  d.payload_bytes = 1 << 20;
  const auto db = transport::encode(d);
  std::vector<char> frame(db.size() + 1 + 8);
  std::memcpy(frame.data(), db.data(), db.size());
  frame[db.size()] = 'x';
  std::memcpy(frame.data() + db.size() + 1, &addr, 8);
  ASSERT_EQ(send(s, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
}

// A single-copy frame of `bytes` that names a shared region: descriptor `fd` in the sender (this
// process), region `id`, the payload at `offset`, and `reserved` where zero belongs.
void send_shared_frame(int s, std::uint64_t addr, std::uint32_t fd, std::uint64_t id,
                       std::uint64_t offset, std::uint64_t bytes, std::uint32_t reserved = 0) {
  transport::FrameHeader d;
  d.type = transport::FrameType::data;
  d.flags = transport::kFlagRemote | transport::kFlagShared;
  d.cluster_version = 1;
  d.name_bytes = 1;
  d.payload_bytes = bytes;
  const auto db = transport::encode(d);
  std::vector<char> frame(db.size() + 1 + 8 + transport::kSharedRefBytes);
  char* p = frame.data();
  std::memcpy(p, db.data(), db.size());
  p += db.size();
  *p++ = 'x';
  std::memcpy(p, &addr, 8);  // little-endian host, as the frame
  std::memcpy(p + 8, &fd, 4);
  std::memcpy(p + 12, &reserved, 4);
  std::memcpy(p + 16, &id, 8);
  std::memcpy(p + 24, &offset, 8);
  ASSERT_EQ(send(s, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
}

// Appends a data frame of cluster version 1, tag 0, named `name`, carrying `values`, to `wire`.
// With `mac` (a TCP connection), the frame's tag follows it.
void append_data_frame(std::vector<char>& wire, const std::string& name,
                       const std::vector<std::int32_t>& values, transport::FrameMac* mac = nullptr,
                       std::uint64_t version = 1) {
  const std::size_t start = wire.size();
  transport::FrameHeader d;
  d.type = transport::FrameType::data;
  d.cluster_version = version;
  d.tag = 0;
  d.name_bytes = static_cast<std::uint32_t>(name.size());
  d.payload_bytes = values.size() * sizeof(std::int32_t);
  const auto hb = transport::encode(d);
  wire.insert(wire.end(), reinterpret_cast<const char*>(hb.data()),
              reinterpret_cast<const char*>(hb.data()) + hb.size());
  wire.insert(wire.end(), name.begin(), name.end());
  const auto* p = reinterpret_cast<const char*>(values.data());
  wire.insert(wire.end(), p, p + values.size() * sizeof(std::int32_t));
  if (mac != nullptr) {
    mac->begin();
    mac->update(wire.data() + start, wire.size() - start);
    const transport::Tag t = mac->finish();
    wire.insert(wire.end(), reinterpret_cast<const char*>(t.data()),
                reinterpret_cast<const char*>(t.data()) + t.size());
  }
}

// Waits (up to 10 s) until `peer` holds at least `bytes` of frames that came before their
// receives, in all; returns the count it saw last.
std::uint64_t await_early_bytes(Peer& peer, std::uint64_t bytes) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (peer.transport_stats().early_bytes < bytes &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  return peer.transport_stats().early_bytes;
}

void allreduce_works(std::vector<std::unique_ptr<Peer>>& peers, const std::string& name) {
  const int p = static_cast<int>(peers.size());
  std::vector<std::vector<int>> v(p, std::vector<int>(100, 1));
  test::run_all(p, [&](int r) {
    peers[r]->allreduce(name, buffer(v[r].data(), 100), buffer(v[r].data(), 100)).wait();
  });
  for (int r = 0; r < p; ++r) EXPECT_EQ(v[r][99], p);
}

TEST(Robustness, MalformedFramesAreDroppedAndTheWorkerGoesOn) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");

  // Garbage instead of a hello.
  int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  const char junk[64] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_GT(send(s, junk, sizeof junk, 0), 0);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  // A well-formed header that claims a huge hello.
  s = connect_to(peers[0]->endpoint());
  transport::FrameHeader h;
  h.type = transport::FrameType::hello;
  h.payload_bytes = std::uint64_t{1} << 40;
  const auto hb = transport::encode(h);
  ASSERT_GT(send(s, hb.data(), hb.size(), 0), 0);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  // A data frame before any handshake.
  s = connect_to(peers[1]->endpoint());
  transport::FrameHeader d;
  d.type = transport::FrameType::data;
  d.payload_bytes = 4;
  const auto db = transport::encode(d);
  ASSERT_GT(send(s, db.data(), db.size(), 0), 0);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  allreduce_works(peers, "after");
  const std::string text = log.text();
  EXPECT_NE(text.find("bad magic"), std::string::npos) << text;
  EXPECT_NE(text.find("exceeds the limit"), std::string::npos) << text;
  EXPECT_NE(text.find("expected frame type 2, got 4"), std::string::npos) << text;
}

// An authenticated client may still lie in a single-copy frame: over TCP (the receiver cannot
// reach a process on another host) and over the same-host socket with an address that is not
// mapped in the sender. Both close the connection with the reason; no crash, no delivery.
TEST(Robustness, BadSingleCopyFramesCloseTheConnection) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");

  int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  ASSERT_TRUE(authenticate(s, "127.0.0.1:1"));
  static const std::vector<std::byte> payload(1 << 20);
  send_single_copy_frame(s, reinterpret_cast<std::uintptr_t>(payload.data()));
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  s = connect_local(peers[1]->endpoint());
  ASSERT_GE(s, 0);
  ASSERT_TRUE(authenticate(s, "127.0.0.1:2"));
  send_single_copy_frame(s, 8);  // page 0 is never mapped
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  allreduce_works(peers, "after");
  const std::string text = log.text();
  EXPECT_NE(text.find("single-copy frame over a connection from another host"), std::string::npos)
      << text;
  EXPECT_NE(text.find("single-copy frame names memory its sender does not have"), std::string::npos)
      << text;
}

// A same-host client may lie about a shared region too: a descriptor it does not have, one that
// is no sealed memory file, bytes past the region's end, non-zero reserved bytes. Each closes
// its connection with the reason; nothing is mapped that could fault, nothing delivered.
TEST(Robustness, BadSharedRegionReferencesCloseTheConnection) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  SharedMemory region(1 << 20);
  const auto addr = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(region.data()));
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const int gone = 999'999;  // above any descriptor this process has open
  ASSERT_EQ(fcntl(gone, F_GETFD), -1);
  // The region's own descriptor: the only memfd this process has opened.
  int region_fd = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.find("memfd:kf-shared") != std::string::npos) {
      region_fd = std::stoi(e.path().filename().string());
    }
  }
  ASSERT_GE(region_fd, 0);
  struct Lie {
    std::uint32_t fd;
    std::uint64_t offset, bytes;
    std::uint32_t reserved;
  };
  for (const Lie& lie : {Lie{static_cast<std::uint32_t>(gone), 0, 1 << 20, 0},
                         Lie{static_cast<std::uint32_t>(pipe_fds[0]), 0, 1 << 20, 0},
                         Lie{static_cast<std::uint32_t>(region_fd), 4096, 1 << 20, 0},
                         Lie{static_cast<std::uint32_t>(region_fd), 0, 1 << 20, 7}}) {
    const int s = connect_local(peers[1]->endpoint());
    ASSERT_GE(s, 0);
    ASSERT_TRUE(authenticate(s, "127.0.0.1:2"));
    send_shared_frame(s, addr, lie.fd, 1'000'000 + lie.fd + lie.offset, lie.offset, lie.bytes,
                      lie.reserved);
    EXPECT_TRUE(closed_by_peer(s));
    close(s);
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  allreduce_works(peers, "after");
  EXPECT_EQ(peers[1]->transport_stats().shared_read_bytes, 0u);
  const std::string text = log.text();
  for (const char* why : {"which its sender does not have", "not a memory file sealed",
                          "of a shared region of 1048576", "non-zero reserved bytes"}) {
    EXPECT_NE(text.find(why), std::string::npos) << why << "\n" << text;
  }
}

// Two small data frames in one write, so the second is parsed straight from the receiver's
// read-ahead buffer: a true one is delivered into the allreduce that asks for it, and one that
// carries fewer bytes than its receive expects fails that allreduce and nothing else.
TEST(Robustness, SmallFramesFromTheReadAheadBufferAreDeliveredOrRefused) {
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  // The first allreduce's frame may itself have arrived before its receive (early): count from
  // here.
  const std::uint64_t early_before = peers[0]->transport_stats().early_bytes;
  int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  const auto key = authenticate(s, peers[1]->endpoint().str());  // as rank 1
  ASSERT_TRUE(key);
  transport::FrameMac mac(*key);

  constexpr std::size_t kCount = 100;
  std::vector<char> wire;
  append_data_frame(wire, "truth", std::vector<std::int32_t>(kCount, 7), &mac);
  append_data_frame(wire, "lie", std::vector<std::int32_t>(2, 7), &mac);
  ASSERT_EQ(send(s, wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
  // Both frames wait in peer 0's mailbox before anything asks for them.
  ASSERT_EQ(await_early_bytes(*peers[0], early_before + kCount * sizeof(std::int32_t) + 8),
            early_before + kCount * sizeof(std::int32_t) + 8);

  // Recursive doubling: one exchange of the whole buffer with rank 1, i.e. with these frames.
  CollOptions o;
  o.algorithm = Algorithm::rhd;
  std::vector<std::int32_t> v(kCount, 1);
  peers[0]->allreduce("truth", buffer(v.data(), kCount), buffer(v.data(), kCount), o).wait();
  EXPECT_EQ(v.front(), 8);
  EXPECT_EQ(v.back(), 8);
  std::vector<std::int32_t> w(kCount, 1);
  const Handle lie =
      peers[0]->allreduce("lie", buffer(w.data(), kCount), buffer(w.data(), kCount), o);
  EXPECT_THROW(lie.wait(), Error);
  EXPECT_EQ(w.front(), 1);  // nothing delivered
  close(s);
}

// A header whose tag is bad changes nothing of what the worker knows of its sender: a forged
// heartbeat under the name of a worker that is to join (its address), claiming a far newer
// cluster version, is refused with its connection; when that worker then joins, the
// collectives with it work, instead of every receive from it looking stale until the claimed
// version.
TEST(Robustness, AForgedFrameHeaderDoesNotMoveThePeersVersion) {
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  const Endpoint joiner{"127.0.0.1", free_port()};
  int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  ASSERT_TRUE(authenticate(s, joiner.str()));
  transport::FrameHeader f;
  f.type = transport::FrameType::heartbeat;
  f.cluster_version = 1000;
  const auto hb = transport::encode(f);
  std::vector<char> wire(reinterpret_cast<const char*>(hb.data()),
                         reinterpret_cast<const char*>(hb.data()) + hb.size());
  wire.resize(wire.size() + transport::kTagBytes, '\x5a');  // not the tag
  ASSERT_EQ(send(s, wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
  // The worker closes the connection on the bad tag.
  char byte = 0;
  EXPECT_LE(recv(s, &byte, 1, 0), 0);
  close(s);
  PeerOptions o;
  o.job_token = "test-token";
  o.listen = joiner;
  peers.push_back(std::make_unique<Peer>(o));
  Cluster next = peers[0]->cluster();
  next.version = 2;
  next.workers.push_back(WorkerSpec{joiner, 2});
  for (std::size_t i = 0; i < 2; ++i) peers[i]->update(next);
  peers[2]->start(next);
  allreduce_works(peers, "with-the-joiner");
  // A message from the joiner to rank 0 (of version 2, far below the forged 1000).
  std::vector<int> sent(10, 7), got(10, 0);
  Handle rx = peers[0]->receive(2, "from-the-joiner", buffer(got.data(), got.size()));
  peers[2]->send(0, "from-the-joiner", buffer(sent.data(), sent.size())).wait();
  rx.wait();
  EXPECT_EQ(got, sent);
}

// Frames that reach a worker over TCP in pieces are read whole. Over TCP the reader peeks into
// its read-ahead buffer and drops the bytes from the socket before its next read: a read that
// needs more than arrived must drop what it peeked before it reads on, or it would take the
// same bytes twice. The pauses between the pieces are what is under test (each piece is read
// before the next is sent), not a wait for a result.
TEST(Robustness, FramesThatArriveInPiecesOverTcpAreReadWhole) {
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  const auto key = authenticate(s, peers[1]->endpoint().str());  // as rank 1
  ASSERT_TRUE(key);
  transport::FrameMac mac(*key);

  // A small frame (through the read-ahead buffer) and one of 20 KiB (its payload partly from
  // the buffer, the rest straight into the destination), each with its own values.
  constexpr std::size_t kSmall = 100, kLarge = 5 * 1024;
  auto counting = [](std::size_t count, std::int32_t base) {
    std::vector<std::int32_t> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = base + static_cast<std::int32_t>(i);
    return v;
  };
  std::vector<char> wire;
  append_data_frame(wire, "small", counting(kSmall, 1000), &mac);
  const std::size_t second = wire.size();
  append_data_frame(wire, "large", counting(kLarge, 5000), &mac);
  // Cut inside the first header, inside its name, inside its payload, inside the second
  // header, and three times inside the second payload.
  const std::vector<std::size_t> cuts{
      10, 34, 200, second + 20, second + 900, second + 9000, second + 17000, wire.size()};
  const std::uint64_t early_before = peers[0]->transport_stats().early_bytes;
  std::size_t at = 0;
  for (const std::size_t cut : cuts) {
    ASSERT_EQ(send(s, wire.data() + at, cut - at, 0), static_cast<ssize_t>(cut - at));
    at = cut;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto want = early_before + (kSmall + kLarge) * sizeof(std::int32_t);
  ASSERT_EQ(await_early_bytes(*peers[0], want), want);

  CollOptions o;
  o.algorithm = Algorithm::rhd;  // one exchange of the whole buffer with rank 1: these frames
  std::vector<std::int32_t> v(kSmall, 1);
  peers[0]->allreduce("small", buffer(v.data(), kSmall), buffer(v.data(), kSmall), o).wait();
  std::vector<std::int32_t> w(kLarge, 1);
  peers[0]->allreduce("large", buffer(w.data(), kLarge), buffer(w.data(), kLarge), o).wait();
  for (std::size_t i = 0; i < kSmall; ++i) {
    ASSERT_EQ(v[i], 1001 + static_cast<std::int32_t>(i)) << "small, element " << i;
  }
  for (std::size_t i = 0; i < kLarge; ++i) {
    ASSERT_EQ(w[i], 5001 + static_cast<std::int32_t>(i)) << "large, element " << i;
  }
  close(s);
}

// Offers a shared-memory ring named `name`; returns the acceptor's one-byte answer (0 if none).
int offer_ring(int s, const std::string& name) {
  std::vector<std::byte> payload(name.size());
  std::memcpy(payload.data(), name.data(), name.size());
  if (!send_frame(s, transport::FrameType::ring_offer, payload)) return 0;
  std::uint8_t reply = 0;
  return read_all(s, &reply, 1) ? reply : 0;
}

// Ring offers the acceptor must not take are declined (the connection goes on), offers over TCP
// close it, and a record that breaks the format closes it with the reason, after the records
// before it were delivered.
TEST(Robustness, BadRingOffersAndRecordsAreRefused) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  constexpr int kTaken = static_cast<int>(transport::RemoteReply::copied);
  constexpr int kDeclined = static_cast<int>(transport::RemoteReply::send_inline);

  // Over TCP: no ring can be shared with another host.
  int s = connect_to(peers[0]->endpoint());
  ASSERT_TRUE(authenticate(s, "127.0.0.1:1"));
  const std::vector<std::byte> name{std::byte{'/'}, std::byte{'k'}, std::byte{'f'}, std::byte{'-'},
                                    std::byte{'1'}};
  ASSERT_TRUE(send_frame(s, transport::FrameType::ring_offer, name));
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  // Names that are not a ring's, and a ring that does not exist: declined, connection kept.
  s = connect_local(peers[1]->endpoint());
  ASSERT_TRUE(authenticate(s, "127.0.0.1:2"));
  EXPECT_EQ(offer_ring(s, "/dev/shm/../../etc/passwd"), kDeclined);
  EXPECT_EQ(offer_ring(s, "/kf-no-such-ring"), kDeclined);
  // A real ring: taken. Then one good record, one with a broken header, and a heartbeat on the
  // socket to wake the receiver should it sleep.
  std::error_code ec;
  auto ring = transport::ShmRing::create(ec);
  ASSERT_TRUE(ring) << ec.message();
  EXPECT_EQ(offer_ring(s, ring->name()), kTaken);
  transport::FrameHeader d;
  d.type = transport::FrameType::data;
  d.cluster_version = 1;
  d.name_bytes = 5;
  d.payload_bytes = 4;
  const std::byte four[4] = {};
  ASSERT_TRUE(ring->try_write(0, transport::encode(d), "early", four, 4));
  auto bad = transport::encode(d);
  bad[0] = std::byte{0x42};
  ASSERT_TRUE(ring->try_write(0, bad, "early", four, 4));
  transport::FrameHeader beat;
  beat.type = transport::FrameType::heartbeat;
  const auto beat_bytes = transport::encode(beat);
  // A polling receiver may have closed the connection already: no SIGPIPE, no check.
  (void)send(s, beat_bytes.data(), beat_bytes.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);

  allreduce_works(peers, "after");
  const std::string text = log.text();
  EXPECT_NE(text.find("shared-memory ring offered over a connection from another host"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("not of the form"), std::string::npos) << text;
  EXPECT_NE(text.find("cannot open shared-memory ring /kf-no-such-ring"), std::string::npos)
      << text;
  EXPECT_NE(text.find("shared-memory ring: bad magic"), std::string::npos) << text;
}

TEST(Robustness, SilentClientIsDroppedAfterTheConnectDeadline) {
  LogCapture log;
  PeerOptions o;
  o.connect_timeout = std::chrono::milliseconds(300);
  auto peers = test::make_local_cluster(2, o);
  const int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);
  EXPECT_NE(log.text().find("handshake not completed in time"), std::string::npos);
  allreduce_works(peers, "still-fine");
}

// The hello has a deadline of its own, much shorter than the one for reaching a peer at all.
TEST(Robustness, AClientHasLittleTimeToProveTheToken) {
  LogCapture log;
  PeerOptions o;
  o.handshake_timeout = std::chrono::milliseconds(300);  // connect_timeout stays 20 s
  auto peers = test::make_local_cluster(2, o);
  const int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  EXPECT_TRUE(closed_by_peer(s));
  close(s);
  EXPECT_NE(log.text().find("handshake not completed in time (300 ms)"), std::string::npos)
      << log.text();
  allreduce_works(peers, "still-fine");
}

// Connections that have not proved the token are capped, from one address and in all: past a
// cap they are closed at once, and the worker's real connections go on.
TEST(Robustness, PendingHandshakesAreCappedBySourceAndInAll) {
  LogCapture log;
  PeerOptions o;
  o.max_pending_handshakes_per_source = 3;
  o.max_pending_handshakes = 5;
  auto peers = test::make_local_cluster(2, o);
  allreduce_works(peers, "before");  // the peers' own connections are through their handshakes
  const auto dial_from = [&](const char* source) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, source, &a.sin_addr);
    EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << source;
    a.sin_port = htons(peers[0]->endpoint().port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return s;
  };
  // A challenge read means the worker accepted the connection and counts it as pending.
  const auto challenged = [](int s) {
    transport::FrameHeader h;
    std::vector<std::byte> payload;
    return read_frame(s, h, payload) && h.type == transport::FrameType::challenge;
  };
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(dial_from("127.0.0.1"));
    ASSERT_TRUE(challenged(held.back())) << i;
  }
  const int over_source = dial_from("127.0.0.1");
  EXPECT_TRUE(closed_by_peer(over_source)) << "a fourth pending handshake from one address";
  close(over_source);
  for (int i = 0; i < 2; ++i) {
    held.push_back(dial_from("127.0.0.2"));
    ASSERT_TRUE(challenged(held.back())) << i;
  }
  const int over_all = dial_from("127.0.0.3");
  EXPECT_TRUE(closed_by_peer(over_all)) << "a sixth pending handshake in all";
  close(over_all);
  EXPECT_EQ(peers[0]->transport_stats().handshakes_refused, 2u);
  const std::string text = log.text();
  EXPECT_NE(text.find("3 of its connections are in their handshake already (the limit)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("5 connections are in their handshake already (the limit)"),
            std::string::npos)
      << text;
  allreduce_works(peers, "while-held");
  for (const int s : held) close(s);
}

// Out of descriptors, a listener cannot accept the connection waiting for it, and trying again
// at once fails again at once: the worker pauses longer each time instead of spinning, and
// accepts the connection once descriptors are free.
TEST(Robustness, AcceptingPausesWhileDescriptorsRunOut) {
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  int open_now = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++open_now;
  }
  rlimit low = was;
  low.rlim_cur = static_cast<rlim_t>(open_now + 64);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> filler;
  for (;;) {
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    filler.push_back(fd);
  }
  ASSERT_EQ(errno, EMFILE);
  close(filler.back());
  filler.pop_back();
  const int s = connect_to(peers[0]->endpoint());  // takes the one free descriptor
  ASSERT_GE(s, 0);
  const auto failures = [&] { return peers[0]->transport_stats().accept_failures; };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (failures() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  ASSERT_GT(failures(), 0u) << "the worker never tried to accept the connection";
  // Half a second of a listener that cannot accept: the pauses (10, 20, 40, ... ms) allow a
  // handful of tries, where spinning would make thousands.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::uint64_t tries = failures();
  for (const int fd : filler) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
  EXPECT_LE(tries, 12u);
  transport::FrameHeader h;
  std::vector<std::byte> payload;
  timeval tv{5, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  EXPECT_TRUE(read_frame(s, h, payload) && h.type == transport::FrameType::challenge)
      << "the waiting connection was not accepted once descriptors were free";
  close(s);
  allreduce_works(peers, "after");
}

// What a client says in a rejected hello reaches the log escaped (no forged lines, no terminal
// codes), and a flood of rejections is logged at a bounded rate.
TEST(Robustness, RejectedHellosAreLoggedEscapedAndRateLimited) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  const auto start = std::chrono::steady_clock::now();
  constexpr int kTries = 30;
  for (int i = 0; i < kTries; ++i) {
    const int s = connect_to(peers[0]->endpoint());
    ASSERT_GE(s, 0);
    transport::FrameHeader h;
    std::vector<std::byte> payload;
    ASSERT_TRUE(read_frame(s, h, payload));
    transport::Hello hello{"evil\n12:00:00.000 error forged\x1b[31m",
                           "127.0.0.1:1",
                           transport::random_nonce(),
                           {},
                           true};
    ASSERT_TRUE(send_frame(s, transport::FrameType::hello, transport::encode(hello)));
    EXPECT_TRUE(closed_by_peer(s));
    close(s);
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const std::string text = log.text();
  EXPECT_NE(text.find("hello for job 'evil\\x0a12:00:00.000 error forged\\x1b[31m'"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("\n12:00:00.000 error forged"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  int lines = 0;
  for (std::size_t at = 0; (at = text.find("rejected connection from", at)) != std::string::npos;
       ++at) {
    ++lines;
  }
  EXPECT_GT(lines, 0);
  // 20 lines per 10 s window.
  const auto windows = 1 + std::chrono::duration_cast<std::chrono::seconds>(elapsed).count() / 10;
  EXPECT_LE(lines, 20 * windows) << text;
  allreduce_works(peers, "after");
}

// A program the worker's process starts (user code calling system(), a data loader's helper)
// inherits none of kf's listeners and connections: they are all close-on-exec.
TEST(Robustness, AProgramTheWorkerStartsInheritsNoneOfItsSockets) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    PeerOptions o;
    o.transport = t;
    auto peers = test::make_local_cluster(2, o);
    allreduce_works(peers, "connected");
    const auto ran = test::run_shell("ls -l /proc/self/fd/");
    ASSERT_EQ(ran.exit_code, 0) << ran.output;
    const auto listed = test::listed_fds(ran.output);
    EXPECT_FALSE(listed.fds.empty()) << ran.output;
    EXPECT_FALSE(listed.socket) << ran.output;
  }
}

// A frame whose cluster version runs far ahead of every member's closes its connection: taken
// in, it would make every receive from that peer look stale for the rest of the job.
TEST(Robustness, FramesOfAFarFutureVersionAreRefused) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  allreduce_works(peers, "before");
  const int s = connect_to(peers[0]->endpoint());
  ASSERT_GE(s, 0);
  const std::string identity = "127.0.0.1:1";  // not a member: its loss breaks nothing
  const auto key = authenticate(s, identity);
  ASSERT_TRUE(key);
  transport::FrameMac mac(*key);
  std::vector<char> wire;
  append_data_frame(wire, "near", std::vector<std::int32_t>(2, 1), &mac, 2);
  append_data_frame(wire, "far", std::vector<std::int32_t>(2, 1), &mac,
                    1 + transport::kMaxVersionLead + 1);
  ASSERT_EQ(send(s, wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
  EXPECT_TRUE(closed_by_peer(s));
  close(s);
  EXPECT_NE(log.text().find("frame of cluster version 65538, more than 65536 ahead of this "
                            "worker's 1"),
            std::string::npos)
      << log.text();
  allreduce_works(peers, "after");
}

// A member whose connection broke without a goodbye is most likely dead. When a newer version
// that someone else wrote still holds it (two workers killed at once: the first removal was
// written before the second death was seen), a collective there must fail at once, not wait
// for the connect timeout while re-dialling an address nothing listens on any more.
TEST(Robustness, AMemberWhoseConnectionBrokeFailsTheNextVersionAtOnce) {
  LogCapture log;
  PeerOptions o;
  o.job_token = "test-token";
  o.listen = Endpoint{"127.0.0.1", 0};
  o.connect_timeout = std::chrono::milliseconds(60'000);
  o.timeout = std::chrono::milliseconds(60'000);
  o.heartbeat_timeout = std::chrono::milliseconds(60'000);
  Peer a(o);
  const Endpoint dead{"127.0.0.1", free_port()};  // nothing listens there
  Cluster c;
  c.version = 1;
  c.workers = {WorkerSpec{a.endpoint(), 0}, WorkerSpec{dead, 1}};
  a.start(c);
  // The member connects, proves the token, and its process dies: the connection just closes.
  const int s = connect_to(a.endpoint());
  ASSERT_GE(s, 0);
  ASSERT_TRUE(authenticate(s, dead.str()));
  close(s);
  ASSERT_TRUE(test::eventually([&] { return !a.lost_peers().empty(); }, std::chrono::seconds(10)));
  c.version = 2;
  a.update(c);
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> v(16, 1);
  EXPECT_THROW(a.allreduce("after", buffer(v.data(), 16), buffer(v.data(), 16)).wait(), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "the collective waited for the connect timeout";
  EXPECT_NE(log.text().find("refuses connections after its connection broke"), std::string::npos)
      << log.text();
}

TEST(Robustness, PeerWithTheWrongTokenIsRejectedOnBothSides) {
  LogCapture log;
  auto peers = test::make_local_cluster(2);
  PeerOptions bad;
  bad.job_token = "not-the-token";
  bad.timeout = std::chrono::milliseconds(500);
  bad.connect_timeout = std::chrono::milliseconds(2000);
  Peer intruder(bad);
  Cluster c;
  c.version = 1;
  c.workers = {WorkerSpec{peers[0]->endpoint(), 0}, WorkerSpec{intruder.endpoint(), 1}};
  intruder.start(c);
  int x = 1;
  const auto ec = intruder.allreduce("steal", buffer(&x, 1), buffer(&x, 1)).wait_status();
  EXPECT_TRUE(ec == errcond::peer_failure) << ec.message();
  EXPECT_NE(log.text().find("does not prove the job token"), std::string::npos) << log.text();
  allreduce_works(peers, "unaffected");
}

// A relay between a genuine dialer (this test, holding the token) and a worker over TCP: it
// forwards the handshake, so the worker accepts the connection, but the connection's key comes
// from the peers' key, which the relay does not have. A frame of the genuine dialer passes
// through it; one the relay makes, or alters, fails its MAC, and the worker closes the
// connection saying why.
TEST(Robustness, ARelayedHandshakeGivesTheRelayNothing) {
  for (const bool alter : {false, true}) {
    LogCapture log;
    auto peers = test::make_local_cluster(2);
    allreduce_works(peers, "before");
    const std::uint64_t early_before = peers[0]->transport_stats().early_bytes;
    int s = connect_to(peers[0]->endpoint());  // the relay's connection to the worker
    ASSERT_GE(s, 0);
    // The relay forwards the challenge to the dialer, and its hello back.
    transport::FrameHeader h;
    std::vector<std::byte> payload;
    ASSERT_TRUE(read_frame(s, h, payload));
    transport::Nonce challenge;
    std::memcpy(challenge.data(), payload.data(), challenge.size());
    const std::string identity = peers[1]->endpoint().str();
    const Key peer_key = derive_key("test-token", KeyUse::peers);
    transport::Hello hello{"kf", identity, transport::random_nonce(), {}, true};
    hello.mac = transport::hello_mac(peer_key, true, true, "kf", identity,
                                     peers[0]->endpoint().str(), challenge);
    ASSERT_TRUE(send_frame(s, transport::FrameType::hello, transport::encode(hello)));
    ASSERT_TRUE(read_frame(s, h, payload));
    ASSERT_EQ(h.type, transport::FrameType::welcome);  // accepted: the handshake was genuine
    const auto w = transport::decode_welcome(payload);
    ASSERT_TRUE(w);
    // The genuine dialer's frame, forwarded as it is: delivered.
    transport::FrameMac genuine(
        transport::connection_key(peer_key, challenge, hello.nonce, identity, w->identity));
    std::vector<char> wire;
    append_data_frame(wire, "truth", std::vector<std::int32_t>(10, 7), &genuine);
    // The relay's own frame, tagged under every key it could make from what it saw, or the
    // next genuine frame with a payload byte changed on the way.
    if (alter) {
      const std::size_t at = wire.size();
      append_data_frame(wire, "truth2", std::vector<std::int32_t>(10, 7), &genuine);
      wire[at + transport::kHeaderBytes + 6 + 3] ^= 1;
    } else {
      transport::FrameMac forged(transport::connection_key(derive_key("", KeyUse::peers), challenge,
                                                           hello.nonce, identity, w->identity));
      append_data_frame(wire, "stolen", std::vector<std::int32_t>(10, 9), &forged);
    }
    ASSERT_EQ(send(s, wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
    EXPECT_TRUE(closed_by_peer(s));
    close(s);
    EXPECT_EQ(await_early_bytes(*peers[0], early_before + 40), early_before + 40)
        << "the genuine frame was not delivered, or the other one was";
    const std::string text = log.text();
    EXPECT_NE(text.find("frame 2 failed its MAC (altered, injected or replayed on the way)"),
              std::string::npos)
        << text;
  }
}

// Frame MACs are a job setting: off on both sides, frames go without tags; on one side only,
// the handshake refuses the connection and says why.
TEST(Robustness, FrameMacsMustBeSetAlikeOnEveryWorker) {
  PeerOptions off;
  off.transport = Transport::tcp;
  off.frame_auth = false;
  auto plain = test::make_local_cluster(2, off);
  allreduce_works(plain, "no-macs");
  // Counted once the I/O thread's write returns, which may be after the receiver has the data.
  EXPECT_TRUE(test::eventually([&] { return plain[0]->transport_stats().tcp_bytes > 0; },
                               std::chrono::seconds(10)));

  LogCapture log;
  PeerOptions on = off;
  on.frame_auth = true;
  on.connect_timeout = std::chrono::milliseconds(2000);
  off.connect_timeout = on.connect_timeout;
  on.timeout = off.timeout = std::chrono::milliseconds(2000);
  auto mixed = test::make_local_cluster(std::vector<PeerOptions>{on, off});
  std::vector<int> v(4, 1);
  const auto ec =
      mixed[0]->allreduce("mixed", buffer(v.data(), 4), buffer(v.data(), 4)).wait_status();
  EXPECT_TRUE(ec) << "a worker with frame MACs talked to one without";
  EXPECT_NE(log.text().find("KF_FRAME_AUTH must be the same on every worker"), std::string::npos)
      << log.text();
}

// Another user takes a worker's same-host socket name before the worker starts (the abstract
// namespace has no permissions). The worker warns that its name is taken; a peer that dials the
// name finds a listener of another user (SO_PEERCRED), warns and uses TCP, so it never talks to
// the squatter, not even to hand it a handshake. Collectives work.
TEST(Robustness, ASameHostSocketOfAnotherUserIsNotTrusted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to listen as another user (CI runs as root)";
  const std::uint16_t port = free_port();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t squatter = fork();
  if (squatter == 0) {
    // Only system calls here: the test process may have threads.
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = std::string(1, '\0') + "kf/127.0.0.1:" + std::to_string(port);
    std::memcpy(a.sun_path, name.data(), name.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(s, 16) != 0) _exit(3);
    const char ok = 1;
    if (write(ready[1], &ok, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1) << "the squatter could not take the name";
  close(ready[0]);
  LogCapture log;
  {
    PeerOptions o;
    o.job_token = "test-token";
    o.listen = Endpoint{"127.0.0.1", port};
    std::vector<std::unique_ptr<Peer>> peers;
    peers.push_back(std::make_unique<Peer>(o));
    o.listen = Endpoint{"127.0.0.1", 0};
    peers.push_back(std::make_unique<Peer>(o));
    Cluster c;
    c.version = 1;
    for (int i = 0; i < 2; ++i) c.workers.push_back(WorkerSpec{peers[i]->endpoint(), i});
    for (auto& p : peers) p->start(c);
    allreduce_works(peers, "past-the-squatter");
  }
  kill(squatter, SIGKILL);
  waitpid(squatter, nullptr, 0);
  const std::string text = log.text();
  EXPECT_NE(text.find("127.0.0.1:" + std::to_string(port) +
                      ": the same-host socket name of this worker is taken by another process"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("the same-host socket of 127.0.0.1:" + std::to_string(port) +
                      " is held by uid 65534"),
            std::string::npos)
      << text;
}

// A process of another user connects to a worker's same-host socket (to relay a member's TCP
// connection into it, say, and drop the frames' tags): the worker closes it before its
// challenge, so the relay has nothing to forward. Workers of that user still get through.
TEST(Robustness, ASameHostConnectionFromAnotherUserIsClosedBeforeTheChallenge) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to connect as another user (CI runs as root)";
  LogCapture log;
  PeerOptions o;
  o.job_token = "test-token";
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < 2; ++i) peers.push_back(std::make_unique<Peer>(o));
  const Endpoint target = peers[0]->endpoint();
  int result[2];
  ASSERT_EQ(pipe(result), 0);
  const pid_t child = fork();
  if (child == 0) {
    // Only system calls here: the test process has threads. Reports what the worker sent
    // before it closed: 0 bytes when it refused at once.
    alarm(20);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    const std::string name = std::string(1, '\0') + "kf/" + target.str();
    std::memcpy(a.sun_path, name.data(), name.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (connect(s, reinterpret_cast<sockaddr*>(&a), len) != 0) _exit(3);
    char buf[512];
    ssize_t total = 0;
    for (;;) {
      const ssize_t n = read(s, buf, sizeof buf);
      if (n <= 0) break;
      total += n;
    }
    if (write(result[1], &total, sizeof total) != sizeof total) _exit(4);
    _exit(0);
  }
  close(result[1]);
  ssize_t sent = -1;
  ASSERT_EQ(read(result[0], &sent, sizeof sent), static_cast<ssize_t>(sizeof sent));
  close(result[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(sent, 0) << "the worker spoke to another user's process before closing";
  EXPECT_NE(log.text().find("refused a same-host connection from another user's process"),
            std::string::npos)
      << log.text();
  Cluster c;
  c.version = 1;
  for (int i = 0; i < 2; ++i) c.workers.push_back(WorkerSpec{peers[i]->endpoint(), i});
  for (auto& p : peers) p->start(c);
  allreduce_works(peers, "after-the-stranger");
}

}  // namespace
}  // namespace kf
