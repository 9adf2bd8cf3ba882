// SPDX-License-Identifier: Apache-2.0
// Which transport connects two workers: the same-host Unix-domain socket (the default for
// workers on one host), TCP (KF_TRANSPORT=tcp), or both at once in one job, and the fallback to
// TCP when a worker's same-host socket name is answered by someone else.
#include "kf/peer.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <thread>

#include "kf/common/env.hpp"
#include "kf/shared_memory.hpp"
#include "support/local_cluster.hpp"

namespace kf {
namespace {

// Peers on 127.0.0.1, the i-th with transports[i], started on one cluster.
std::vector<std::unique_ptr<Peer>> make_cluster(
    const std::vector<Transport>& transports,
    std::size_t single_copy_bytes = PeerOptions{}.single_copy_bytes,
    std::size_t shm_frame_bytes = PeerOptions{}.shm_frame_bytes,
    std::size_t socket_buffer_bytes = 0) {
  std::vector<std::unique_ptr<Peer>> peers;
  Cluster c;
  c.version = 1;
  for (std::size_t i = 0; i < transports.size(); ++i) {
    PeerOptions o;
    o.job_token = "test-token";
    o.transport = transports[i];
    o.single_copy_bytes = single_copy_bytes;
    o.shm_frame_bytes = shm_frame_bytes;
    o.socket_buffer_bytes = socket_buffer_bytes;
    test::stretch_heartbeat(o);
    peers.push_back(std::make_unique<Peer>(o));
    c.workers.push_back(WorkerSpec{peers.back()->endpoint(), static_cast<int>(i)});
  }
  for (auto& p : peers) p->start(c);
  return peers;
}

// A small and a pipelined large allreduce with `algo` on every peer; checks the sums.
void expect_allreduce_works(std::vector<std::unique_ptr<Peer>>& peers, Algorithm algo) {
  const int p = static_cast<int>(peers.size());
  const std::size_t n = (std::size_t{9} << 20) / 4 + 3;
  std::vector<std::vector<float>> big(p, std::vector<float>(n));
  std::vector<int> small(p);
  test::run_all(p, [&](int r) {
    CollOptions o;
    o.algorithm = algo;
    small[r] = r + 1;
    peers[r]->allreduce("small", buffer(&small[r], 1), buffer(&small[r], 1), o).wait();
    for (std::size_t i = 0; i < n; ++i) big[r][i] = static_cast<float>(r + 1 + (i % 7));
    peers[r]->allreduce("big", buffer(big[r].data(), n), buffer(big[r].data(), n), o).wait();
  });
  const int ranks = p * (p + 1) / 2;
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(small[r], ranks) << "rank " << r;
    for (std::size_t i : {std::size_t{0}, std::size_t{5}, n / 2, n - 1}) {
      ASSERT_EQ(big[r][i], static_cast<float>(ranks + p * static_cast<int>(i % 7)))
          << "rank " << r << " element " << i;
    }
  }
}

// Whether /proc/net/unix lists a listener named after `ep` ("@kf/HOST:PORT").
bool has_same_host_listener(const Endpoint& ep) {
  std::ifstream in("/proc/net/unix");
  const std::string want = "@kf/" + ep.str();
  for (std::string line; std::getline(in, line);) {
    if (line.size() >= want.size() &&
        line.compare(line.size() - want.size(), want.size(), want) == 0) {
      return true;
    }
  }
  return false;
}

class TransportMix : public ::testing::TestWithParam<Algorithm> {};

TEST_P(TransportMix, SameHostTcpAndMixedJobsGiveTheSameResults) {
  using T = Transport;
  for (const auto& mix :
       {std::vector<T>{T::automatic, T::automatic, T::automatic},
        std::vector<T>{T::unix_socket, T::unix_socket, T::unix_socket},
        std::vector<T>{T::tcp, T::tcp, T::tcp}, std::vector<T>{T::automatic, T::tcp, T::automatic},
        std::vector<T>{T::automatic, T::unix_socket, T::tcp}}) {
    auto peers = make_cluster(mix);
    expect_allreduce_works(peers, GetParam());
  }
}

// Every data frame single-copy (no rings), the 4-byte ones included: the reply protocol,
// reduce-on-arrival and frames that arrive before their receive is posted all work on that
// path too.
TEST_P(TransportMix, EveryFrameSingleCopyGivesTheSameResults) {
  auto peers =
      make_cluster({Transport::automatic, Transport::automatic, Transport::automatic}, 1, 0);
  expect_allreduce_works(peers, GetParam());
  for (auto& p : peers) {
    const TransportStats t = p->transport_stats();
    EXPECT_GT(t.single_copy_bytes, 0u);
    EXPECT_EQ(t.socket_bytes, 0u) << "every data frame should have gone single-copy";
    EXPECT_EQ(t.tcp_bytes, 0u);
    EXPECT_EQ(t.single_copy_refused, 0u);
    EXPECT_EQ(t.shm_bytes, 0u);
  }
}

// Buffers in kf::SharedMemory: each receiver maps its senders' regions and reduces or copies
// straight from them. In place, out of place into ordinary memory, and at an offset inside the
// region; the sums are those of ordinary buffers, and only payloads in a region are read in
// place.
TEST_P(TransportMix, PayloadsInSharedMemoryAreReadInPlace) {
  auto peers = make_cluster({Transport::automatic, Transport::automatic, Transport::automatic});
  const int p = static_cast<int>(peers.size());
  const std::size_t n = (std::size_t{5} << 20) / 4 + 3;
  const std::size_t skip = 1000;  // elements before the buffer, inside the region
  std::vector<SharedMemory> mem;
  std::vector<std::vector<float>> out(p, std::vector<float>(n));
  for (int r = 0; r < p; ++r) mem.emplace_back((n + skip) * sizeof(float));
  test::run_all(p, [&](int r) {
    CollOptions o;
    o.algorithm = GetParam();
    const std::span<float> v = mem[r].as<float>().subspan(skip, n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(r + 1 + (i % 7));
    peers[r]->allreduce("out", buffer(v.data(), n), buffer(out[r].data(), n), o).wait();
    peers[r]->allreduce("in", buffer(v.data(), n), buffer(v.data(), n), o).wait();
  });
  const int ranks = p * (p + 1) / 2;
  for (int r = 0; r < p; ++r) {
    const std::span<float> v = mem[r].as<float>().subspan(skip, n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto want = static_cast<float>(ranks + p * static_cast<int>(i % 7));
      ASSERT_EQ(out[r][i], want) << "out of place: rank " << r << " element " << i;
      ASSERT_EQ(v[i], want) << "in place: rank " << r << " element " << i;
    }
  }
  std::uint64_t in_place = 0;
  for (auto& peer : peers) {
    const TransportStats t = peer->transport_stats();
    EXPECT_GT(t.single_copy_bytes, 0u);
    EXPECT_EQ(t.single_copy_refused, 0u);
    in_place += t.shared_read_bytes;
  }
  EXPECT_GT(in_place, 0u);
  // Ordinary buffers: copied out as before, nothing read in place.
  auto plain = make_cluster({Transport::automatic, Transport::automatic, Transport::automatic});
  expect_allreduce_works(plain, GetParam());
  for (auto& peer : plain) {
    EXPECT_GT(peer->transport_stats().single_copy_bytes, 0u);
    EXPECT_EQ(peer->transport_stats().shared_read_bytes, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportMix,
                         ::testing::Values(Algorithm::star, Algorithm::ring, Algorithm::rhd),
                         [](const auto& tpi) { return std::string(to_string(tpi.param)); });

TEST(Transport, OnlyTheDefaultListensOnASameHostSocket) {
  auto peers = make_cluster({Transport::automatic, Transport::tcp});
  EXPECT_TRUE(has_same_host_listener(peers[0]->endpoint()));
  EXPECT_FALSE(has_same_host_listener(peers[1]->endpoint()));
}

// Which path each kind of payload takes, by transport: small ones through the shared-memory
// ring or the socket (the ring only while the receiver polls), large ones single-copy by
// default; everything through the socket with "unix"; TCP with "tcp".
TEST(Transport, LargePayloadsGoSingleCopyOnlyByDefault) {
  struct Case {
    Transport t;
    bool socket, single_copy, tcp;
  };
  for (const Case c : {Case{Transport::automatic, true, true, false},
                       Case{Transport::unix_socket, true, false, false},
                       Case{Transport::tcp, false, false, true}}) {
    auto peers = make_cluster({c.t, c.t});
    expect_allreduce_works(peers, Algorithm::ring);
    for (auto& p : peers) {
      const TransportStats s = p->transport_stats();
      SCOPED_TRACE(static_cast<int>(c.t));
      EXPECT_EQ(s.socket_bytes + s.shm_bytes > 0, c.socket);
      EXPECT_EQ(s.single_copy_bytes > 0, c.single_copy);
      EXPECT_EQ(s.tcp_bytes > 0, c.tcp);
      EXPECT_EQ(s.single_copy_refused, 0u);
      if (c.t != Transport::automatic) {
        EXPECT_EQ(s.shm_bytes, 0u);
      }
    }
  }
}

// `iterations` allreduces of one name on every peer, their sizes cycling so that consecutive
// frames between two workers take different paths (the shared-memory ring; the socket while a
// frame waits in the queue; single copy above 1 MiB), with ring steps that let a fast worker
// send the next collective's frames early. Exact sums show that no frame overtook another of
// the same name.
void expect_mixed_sequence_works(std::vector<std::unique_ptr<Peer>>& peers, int iterations) {
  const int p = static_cast<int>(peers.size());
  const std::size_t sizes[] = {1, 10000, 150000, 1, 900000, 3000};
  std::vector<int> failures(p, 0);
  test::run_all(p, [&](int r) {
    CollOptions o;
    o.algorithm = Algorithm::ring;
    std::vector<std::int32_t> v;
    for (int it = 0; it < iterations; ++it) {
      const std::size_t n = sizes[it % std::size(sizes)];
      v.assign(n, 0);
      for (std::size_t i = 0; i < n; ++i) v[i] = r + it + static_cast<int>(i % 5);
      peers[r]->allreduce("mixed", buffer(v.data(), n), buffer(v.data(), n), o).wait();
      for (std::size_t i = 0; i < n; i += 97) {
        if (v[i] != p * (p - 1) / 2 + p * (it + static_cast<int>(i % 5))) {
          ++failures[r];
          break;
        }
      }
    }
  });
  for (int r = 0; r < p; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

// While the receiver polls, small frames go through the shared-memory ring, and results agree.
TEST(Transport, SmallPayloadsGoThroughTheRingWhileTheReceiverPolls) {
  PeerOptions o;
  o.spin = std::chrono::seconds(2);  // never asleep in the kernel during the test
  auto peers = test::make_local_cluster(2, o);
  expect_mixed_sequence_works(peers, 60);
  for (auto& p : peers) {
    const TransportStats s = p->transport_stats();
    EXPECT_GT(s.shm_bytes, 0u);
    EXPECT_GT(s.single_copy_bytes, 0u);  // 900000 elements: pieces of 1.8 MB
    EXPECT_EQ(s.tcp_bytes, 0u);
  }
}

// Receivers that sleep in the kernel after every handler: frames then go through the socket,
// or into the ring just as the receiver falls asleep (and a socket frame wakes it). Three
// workers so each receives from two rings at once.
TEST(Transport, RingAndSocketFramesStayInOrderWhenReceiversSleep) {
  PeerOptions o;
  o.spin = std::chrono::microseconds(0);
  auto peers = test::make_local_cluster(3, o);
  expect_mixed_sequence_works(peers, 36);
  // And with polling that ends now and then (the default), where both happen within a run.
  auto polling = test::make_local_cluster(3, PeerOptions{});
  expect_mixed_sequence_works(polling, 36);
}

// Small data frames are written into the socket by the thread that posts them when the
// connection's writer is idle; one that does not fit whole is finished by the writer. Many
// frames of 48 KiB submitted at once over TCP and same-host sockets take both
// paths and the hand-over between them; every sum must be exact and every payload byte counted
// once. Star with two workers: each sends every buffer exactly once. Same-host sockets of
// 8 KiB buffers make sure that frames do not fit at once (TCP keeps the system's buffers: tiny
// ones stall loopback TCP for 200 ms at a time).
TEST(Transport, FramesWrittenByTheSenderAndFinishedByTheWriterArriveWhole) {
  for (const Transport t : {Transport::tcp, Transport::unix_socket}) {
    SCOPED_TRACE(static_cast<int>(t));
    auto peers = make_cluster({t, t}, PeerOptions{}.single_copy_bytes, 0,
                              t == Transport::tcp ? 0 : 8 * 1024);
    constexpr int kFrames = 64;
    constexpr std::size_t kCount = 12 * 1024;  // 48 KiB of floats
    std::vector<std::vector<std::vector<float>>> bufs(2);
    std::vector<std::uint64_t> warm_bytes(2);
    test::run_all(2, [&](int r) {
      CollOptions o;
      o.algorithm = Algorithm::star;
      // Connected first, so that the first frames below find an idle writer.
      int one = 1;
      peers[r]->allreduce("connect", buffer(&one, 1), buffer(&one, 1), o).wait();
      warm_bytes[r] =
          peers[r]->transport_stats().tcp_bytes + peers[r]->transport_stats().socket_bytes;
      std::vector<Handle> hs;
      bufs[r].assign(kFrames, std::vector<float>(kCount));
      for (int f = 0; f < kFrames; ++f) {
        for (std::size_t i = 0; i < kCount; ++i) {
          bufs[r][f][i] = static_cast<float>((r + 1) * (f + 1) + static_cast<int>(i % 13));
        }
        auto& v = bufs[r][f];
        hs.push_back(peers[r]->allreduce("f" + std::to_string(f), buffer(v.data(), kCount),
                                         buffer(v.data(), kCount), o));
      }
      for (auto& h : hs) h.wait();
    });
    for (int r = 0; r < 2; ++r) {
      for (int f = 0; f < kFrames; ++f) {
        for (std::size_t i : {std::size_t{0}, std::size_t{4095}, kCount / 2, kCount - 1}) {
          ASSERT_EQ(bufs[r][f][i], static_cast<float>(3 * (f + 1) + 2 * static_cast<int>(i % 13)))
              << "rank " << r << " frame " << f << " element " << i;
        }
      }
      const TransportStats s = peers[r]->transport_stats();
      EXPECT_EQ(s.tcp_bytes + s.socket_bytes - warm_bytes[r], kFrames * kCount * sizeof(float))
          << "rank " << r;
    }
  }
}

TEST(Transport, RingsCanBeTurnedOff) {
  PeerOptions o;
  o.spin = std::chrono::seconds(2);
  o.shm_frame_bytes = 0;
  auto peers = test::make_local_cluster(2, o);
  expect_mixed_sequence_works(peers, 12);
  for (auto& p : peers) EXPECT_EQ(p->transport_stats().shm_bytes, 0u);
}

// Frames that arrive before their receive is posted wait in kf's buffers, the large ones in
// pooled blocks that later frames of other sizes reuse. Rank 1 takes part in "sync" before it
// posts the broadcasts that rank 0 sent earlier: frames between two workers arrive in the order
// they were sent (socket, ring and single copy alike), so all of them are in by then. The second
// round's frames land in blocks of the first (a 1 MiB frame in a 4 MiB block, 70 KB in 200 KB),
// and every receive must get its own frame's bytes, no more.
TEST(Transport, FramesThatArriveBeforeTheirReceiveAreKeptAndDelivered) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    SCOPED_TRACE(static_cast<int>(t));
    auto peers = make_cluster({t, t});
    const std::vector<std::vector<std::size_t>> rounds = {
        {std::size_t{4} << 20, 200000, 1000}, {(std::size_t{1} << 20) + 4, 3 << 20, 70000}};
    std::uint64_t early_before = peers[1]->transport_stats().early_bytes;
    for (std::size_t round = 0; round < rounds.size(); ++round) {
      const auto& sizes = rounds[round];
      std::vector<std::vector<std::uint8_t>> got(sizes.size());
      int sync[2] = {1, 1};
      test::run_all(2, [&](int r) {
        std::vector<std::vector<std::uint8_t>> bufs(sizes.size());
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          bufs[k].assign(sizes[k], 0);
          if (r == 0) {
            for (std::size_t i = 0; i < sizes[k]; ++i) {
              bufs[k][i] = static_cast<std::uint8_t>(i * 7 + k + round);
            }
          }
        }
        const auto bcast = [&](std::size_t k) {
          const std::string name = "early-" + std::to_string(k);
          return peers[r]->broadcast(name, buffer(bufs[k].data(), sizes[k])).wait_status();
        };
        if (r == 0) {
          for (std::size_t k = 0; k < sizes.size(); ++k) ASSERT_FALSE(bcast(k));
        }
        ASSERT_FALSE(
            peers[r]->allreduce("sync", buffer(&sync[r], 1), buffer(&sync[r], 1)).wait_status());
        if (r == 1) {
          for (std::size_t k = 0; k < sizes.size(); ++k) ASSERT_FALSE(bcast(k));
          got = std::move(bufs);
        }
      });
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        ASSERT_EQ(got[k].size(), sizes[k]);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          wrong += got[k][i] != static_cast<std::uint8_t>(i * 7 + k + round);
        }
        EXPECT_EQ(wrong, 0u) << "round " << round << " frame " << k;
      }
      std::uint64_t total = 0;
      for (const std::size_t n : sizes) total += n;
      const std::uint64_t early = peers[1]->transport_stats().early_bytes;
      EXPECT_GE(early - early_before, total) << "round " << round;
      early_before = early;
    }
  }
}

// A frame that came before its receive but carries another size than the receive expects fails
// that receive only; the next early frame is delivered as usual (a receive completed at once
// shares one completed request, which the failure must not touch).
TEST(Transport, AnEarlyFrameOfTheWrongSizeFailsOnlyItsReceive) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    SCOPED_TRACE(static_cast<int>(t));
    auto peers = make_cluster({t, t});
    std::vector<std::uint8_t> got;
    std::error_code wrong_size;
    test::run_all(2, [&](int r) {
      std::vector<std::uint8_t> small(16, 0), large(32, 0), next(16, 0);
      if (r == 0) {
        for (std::size_t i = 0; i < 16; ++i) {
          small[i] = static_cast<std::uint8_t>(i + 1);
          next[i] = static_cast<std::uint8_t>(100 + i);
        }
      }
      int sync = 1;
      const auto sync_all = [&](const char* name) {
        return peers[r]->allreduce(name, buffer(&sync, 1), buffer(&sync, 1)).wait_status();
      };
      if (r == 0) {
        ASSERT_FALSE(
            peers[0]->broadcast("sized", buffer(small.data(), small.size())).wait_status());
        ASSERT_FALSE(peers[0]->broadcast("after", buffer(next.data(), next.size())).wait_status());
      }
      ASSERT_FALSE(sync_all("sync"));  // both frames are at rank 1 now: frames keep their order
      if (r == 1) {
        wrong_size = peers[1]->broadcast("sized", buffer(large.data(), large.size())).wait_status();
        ASSERT_FALSE(peers[1]->broadcast("after", buffer(next.data(), next.size())).wait_status());
        got = next;
      }
    });
    EXPECT_EQ(wrong_size, make_error_code(errc::protocol_error));
    ASSERT_EQ(got.size(), 16u);
    for (std::size_t i = 0; i < 16; ++i) EXPECT_EQ(got[i], 100 + i) << "byte " << i;
  }
}

// Small early frames wait outside the mailbox while it is empty, larger ones in it. Two frames
// of one name, the first small one kept outside and the second behind a large frame in the
// mailbox, must still reach their receives in the order they were sent.
TEST(Transport, EarlyFramesOfOneNameKeepTheirOrderInsideAndOutsideTheMailbox) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    SCOPED_TRACE(static_cast<int>(t));
    auto peers = make_cluster({t, t});
    std::vector<std::int32_t> first(4, 0), second(4, 0), big(1024, 0);
    test::run_all(2, [&](int r) {
      std::vector<std::int32_t> a(4, r == 0 ? 11 : 0), b(4, r == 0 ? 22 : 0);
      std::vector<std::int32_t> large(1024, r == 0 ? 33 : 0);
      if (r == 0) {
        ASSERT_FALSE(peers[0]->broadcast("dup", buffer(a.data(), a.size())).wait_status());
        ASSERT_FALSE(peers[0]->broadcast("big", buffer(large.data(), large.size())).wait_status());
        ASSERT_FALSE(peers[0]->broadcast("dup", buffer(b.data(), b.size())).wait_status());
      }
      int sync = 1;
      // All three frames are at rank 1 once this is done (a connection keeps its order).
      ASSERT_FALSE(peers[r]->allreduce("sync", buffer(&sync, 1), buffer(&sync, 1)).wait_status());
      if (r == 1) {
        ASSERT_FALSE(peers[1]->broadcast("dup", buffer(a.data(), a.size())).wait_status());
        ASSERT_FALSE(peers[1]->broadcast("big", buffer(large.data(), large.size())).wait_status());
        ASSERT_FALSE(peers[1]->broadcast("dup", buffer(b.data(), b.size())).wait_status());
        first = a;
        second = b;
        big = large;
      }
    });
    EXPECT_EQ(first, std::vector<std::int32_t>(4, 11));
    EXPECT_EQ(second, std::vector<std::int32_t>(4, 22));
    EXPECT_EQ(big, std::vector<std::int32_t>(1024, 33));
  }
}

// Early frames count against PeerOptions::max_unexpected_bytes only until their receive takes
// them: 200 small frames (each charged about 84 bytes: 16 of payload, its name and 64 of
// bookkeeping), each taken before the next is sent, stay under a limit that 20 of them
// together would pass; 20 left waiting at once pass it, and the receiver closes the
// connection, naming the limit.
TEST(Transport, EarlyFramesCountAgainstTheLimitUntilTaken) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    SCOPED_TRACE(static_cast<int>(t));
    PeerOptions o;
    o.transport = t;
    o.max_unexpected_bytes = 512;
    o.timeout = std::chrono::seconds(20);  // a receiver that never closes fails the test, slowly
    auto peers = test::make_local_cluster(2, o);
    test::run_all(2, [&](int r) {
      std::vector<std::int32_t> v(4, r == 0 ? 7 : 0);
      for (int i = 0; i < 200; ++i) {
        const std::string name = "b#" + std::to_string(i);
        if (r == 0) {
          ASSERT_FALSE(peers[0]->broadcast(name, buffer(v.data(), v.size())).wait_status()) << i;
        }
        int sync = 1;
        ASSERT_FALSE(peers[r]
                         ->allreduce("s#" + std::to_string(i), buffer(&sync, 1), buffer(&sync, 1))
                         .wait_status())
            << i;
        if (r == 1) {
          ASSERT_FALSE(peers[1]->broadcast(name, buffer(v.data(), v.size())).wait_status()) << i;
          ASSERT_EQ(v, std::vector<std::int32_t>(4, 7)) << i;
          v.assign(4, 0);
        }
      }
    });
    std::error_code lost;
    test::run_all(2, [&](int r) {
      std::vector<std::int32_t> v(4, 7);
      if (r == 0) {
        for (int i = 0; i < 20; ++i) {
          peers[0]->broadcast("w#" + std::to_string(i), buffer(v.data(), v.size())).wait_status();
        }
      } else {
        int one = 1;
        lost = peers[1]->allreduce("after", buffer(&one, 1), buffer(&one, 1)).wait_status();
      }
    });
    EXPECT_EQ(lost, make_error_code(errc::peer_lost))
        << "20 frames of 16 bytes waiting passed a limit of 512 unnoticed: " << lost.message();
  }
}

// Frames are matched to receives by name without copying the name out of the frame; names
// longer than a short string (here 1000 bytes, differing only at the end) must still match
// exactly, whether the frame waits for its receive (kept under its own copy of the name) or
// the receive waits for it, through the ring, the socket and TCP.
TEST(Transport, LongNamesMatchWhicheverComesFirst) {
  for (const Transport t : {Transport::automatic, Transport::tcp}) {
    SCOPED_TRACE(static_cast<int>(t));
    auto peers = make_cluster({t, t});
    const std::vector<std::size_t> sizes = {4, 1000, 70000, 600000};
    const auto name = [](bool early, std::size_t k) {
      return std::string(990, early ? 'e' : 'o') + "#" + std::to_string(k);
    };
    for (const bool early : {true, false}) {
      std::vector<std::vector<std::uint8_t>> got;
      int sync[2] = {1, 1};
      test::run_all(2, [&](int r) {
        std::vector<std::vector<std::uint8_t>> bufs;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          bufs.emplace_back(sizes[k], r == 0 ? static_cast<std::uint8_t>(k + 1) : 0);
        }
        std::vector<Handle> hs;
        const auto post = [&] {
          for (std::size_t k = 0; k < sizes.size(); ++k) {
            hs.push_back(peers[r]->broadcast(name(early, k), buffer(bufs[k].data(), sizes[k])));
          }
        };
        // Early: rank 0's frames are all in before rank 1 posts (frames between two workers
        // arrive in order, "sync" last). On time: rank 1 has posted before rank 0 sends.
        if (r == 0 && early) post();
        if (r == 1 && !early) post();
        ASSERT_FALSE(
            peers[r]
                ->allreduce(early ? "sync-e" : "sync-o", buffer(&sync[r], 1), buffer(&sync[r], 1))
                .wait_status());
        if (r == 0 && !early) post();
        if (r == 1 && early) post();
        for (auto& h : hs) ASSERT_FALSE(h.wait_status()) << h.message();
        if (r == 1) got = std::move(bufs);
      });
      ASSERT_EQ(got.size(), sizes.size());
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        EXPECT_EQ(std::count(got[k].begin(), got[k].end(), static_cast<std::uint8_t>(k + 1)),
                  static_cast<std::ptrdiff_t>(sizes[k]))
            << (early ? "early" : "on time") << ", frame " << k;
      }
    }
  }
}

// A peer that leaves says goodbye on its open connections, but does not wait for connections it
// is still dialling: at the end of a job the workers go one after another, and one that never
// reached a peer before it left would otherwise hold its own exit up. Here three dials retry
// against addresses nobody listens on (with a minute's connect timeout); waiting for their
// goodbyes would take 2 s each, until the destructor gave up after 5 s. Their handles must
// fail, not hang.
// `auto` prices messages by the same-host link only where every worker is on this host and
// the default transport carries them (rings, single copy); over TCP it keeps the default link.
TEST(Transport, AutoPricesMessagesByTheTransport) {
  using T = Transport;
  constexpr std::size_t k64 = 64 * 1024;
  auto local = make_cluster({T::automatic, T::automatic});
  auto tcp = make_cluster({T::tcp, T::tcp});
  auto sock = make_cluster({T::unix_socket, T::unix_socket});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(local[r]->resolve(CollOp::allreduce, Algorithm::auto_select, k64), Algorithm::ring);
    EXPECT_EQ(local[r]->resolve(CollOp::allreduce, Algorithm::auto_select, 4), Algorithm::rhd);
    EXPECT_EQ(tcp[r]->resolve(CollOp::allreduce, Algorithm::auto_select, k64), Algorithm::rhd);
    EXPECT_EQ(sock[r]->resolve(CollOp::allreduce, Algorithm::auto_select, k64), Algorithm::rhd);
    // An explicit choice is never second-guessed.
    EXPECT_EQ(local[r]->resolve(CollOp::allreduce, Algorithm::tree, k64), Algorithm::tree);
  }
}

// An address is dialled as it is; a worker the cluster document names by host name is looked up.
TEST(Transport, PeersNamedByHostNameAreLookedUpAndReached) {
  std::vector<std::unique_ptr<Peer>> peers;
  Cluster c;
  c.version = 1;
  for (int i = 0; i < 2; ++i) {
    PeerOptions o;
    o.job_token = "test-token";
    o.transport = Transport::tcp;
    o.listen = Endpoint{"localhost", 0};
    test::stretch_heartbeat(o);
    peers.push_back(std::make_unique<Peer>(o));
    ASSERT_EQ(peers.back()->endpoint().host, "localhost");
    c.workers.push_back(WorkerSpec{peers.back()->endpoint(), i});
  }
  for (auto& p : peers) p->start(c);
  expect_allreduce_works(peers, Algorithm::ring);
}

TEST(Transport, LeavingDoesNotWaitForPeersStillBeingDialled) {
  PeerOptions o;
  o.job_token = "test-token";
  o.listen = Endpoint{"127.0.0.1", 0};
  o.connect_timeout = std::chrono::milliseconds(60000);
  std::vector<Endpoint> gone;
  for (int i = 0; i < 3; ++i) gone.push_back(Peer(o).endpoint());
  auto leaving = std::make_unique<Peer>(o);
  std::vector<Handle> sent;
  for (const auto& ep : gone) sent.push_back(leaving->invite(ep, "hello"));
  const auto t0 = std::chrono::steady_clock::now();
  leaving.reset();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(2))
      << "leaving took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
      << " ms: it waited for dials to peers that are not there";
  for (auto& h : sent) EXPECT_TRUE(h.wait_status()) << "an invitation to nobody was delivered";
}

TEST(Transport, ParsesItsNamesAndNothingElse) {
  EXPECT_EQ(parse_transport("auto"), Transport::automatic);
  EXPECT_EQ(parse_transport("unix"), Transport::unix_socket);
  EXPECT_EQ(parse_transport("tcp"), Transport::tcp);
  EXPECT_FALSE(parse_transport("shm").has_value());
  EXPECT_FALSE(parse_transport("").has_value());
}

TEST(Transport, KfTransportSetsTheOptionAndABadValueIsNamed) {
  Env e;
  e.self = Endpoint{"127.0.0.1", 0};
  e.job_token = "t";
  EXPECT_EQ(Peer::options_from(e).transport, Transport::automatic);
  e.transport = "tcp";
  EXPECT_EQ(Peer::options_from(e).transport, Transport::tcp);
  e.transport = "unix";
  EXPECT_EQ(Peer::options_from(e).transport, Transport::unix_socket);
  e.transport = "shm";
  try {
    Peer::options_from(e);
    FAIL() << "KF_TRANSPORT=shm was accepted";
  } catch (const std::invalid_argument& ex) {
    EXPECT_NE(std::string(ex.what()).find("KF_TRANSPORT='shm'"), std::string::npos) << ex.what();
  }
}

// An express allreduce whose frame does not fit the socket at once (TCP with 8 KiB socket
// buffers, 64 KiB frames) goes on reducing into its buffer while the writer sends the rest: the
// writer must send the frame as it was when the round began (its own copy), or the partner sums
// values that already include its own.
TEST(Express, FramesQueuedForTheSocketAreSentAsTheyWere) {
  auto peers = make_cluster({Transport::tcp, Transport::tcp}, PeerOptions{}.single_copy_bytes,
                            PeerOptions{}.shm_frame_bytes, 8192);
  const std::size_t n = 16384;  // 64 KiB of int32: the express path's largest
  std::vector<std::size_t> wrong(2, 0);
  test::run_all(2, [&](int r) {
    std::vector<std::int32_t> in(n), out(n);
    for (int k = 0; k < 4; ++k) {
      for (std::size_t i = 0; i < n; ++i)
        in[i] = static_cast<std::int32_t>((r + 1) * (i % 1000 + k));
      const std::string name = "queued#" + std::to_string(k);
      if (peers[r]->allreduce(name, buffer(in.data(), n), buffer(out.data(), n)).wait_status()) {
        wrong[r] = n;
        return;
      }
      for (std::size_t i = 0; i < n; ++i) {
        wrong[r] += out[i] != static_cast<std::int32_t>(3 * (i % 1000 + k));
      }
    }
  });
  EXPECT_EQ(wrong[0], 0u);
  EXPECT_EQ(wrong[1], 0u);
}

// KF_EXPRESS_BYTES sets PeerOptions::express_bytes (0 turns the express path off); a value that
// is not a number of bytes in 0-65536 is refused with the variable's name.
TEST(Express, KfExpressBytesSetsTheOptionAndABadValueIsNamed) {
  ::setenv(env::kSelf, "127.0.0.1:5000", 1);
  ::setenv(env::kCluster, R"({"version": 1, "workers": [{"host": "127.0.0.1", "port": 5000}]})", 1);
  ::setenv(env::kJobToken, "t", 1);
  ::unsetenv(env::kExpressBytes);
  EXPECT_EQ(Peer::options_from(Env::from_environment()).express_bytes, PeerOptions{}.express_bytes);
  ::setenv(env::kExpressBytes, "0", 1);
  EXPECT_EQ(Peer::options_from(Env::from_environment()).express_bytes, 0u);
  ::setenv(env::kExpressBytes, "256", 1);
  EXPECT_EQ(Peer::options_from(Env::from_environment()).express_bytes, 256u);
  for (const char* bad : {"-1", "65537", "1k", "2 "}) {
    ::setenv(env::kExpressBytes, bad, 1);
    try {
      Env::from_environment();
      ADD_FAILURE() << "KF_EXPRESS_BYTES='" << bad << "' was accepted";
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find("KF_EXPRESS_BYTES"), std::string::npos) << ex.what();
    }
  }
  for (const char* name : {env::kSelf, env::kCluster, env::kJobToken, env::kExpressBytes}) {
    ::unsetenv(name);
  }
}

// Worker 1 listens on TCP only, and another socket takes its same-host name: worker 0 dials that
// name first, fails the handshake with whoever answers, and reaches worker 1 over TCP.
TEST(Transport, ASquattedSameHostNameFallsBackToTcp) {
  auto peers = make_cluster({Transport::automatic, Transport::tcp});
  const std::string name = std::string(1, '\0') + "kf/" + peers[1]->endpoint().str();
  const int squatter = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(squatter, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
  ASSERT_EQ(listen(squatter, 4), 0);
  std::atomic<int> accepted{0};
  // Answers each connection by closing it, until the test shuts the listener down.
  std::thread answer([&] {
    for (;;) {
      const int c = accept(squatter, nullptr, nullptr);
      if (c < 0) return;
      ++accepted;
      close(c);
    }
  });
  expect_allreduce_works(peers, Algorithm::ring);
  EXPECT_GE(accepted.load(), 1) << "worker 0 never tried the same-host socket";
  shutdown(squatter, SHUT_RDWR);
  answer.join();
  close(squatter);
}

// A child process's half of the refusal test: makes the kernel refuse to let anyone read this
// process's memory (not dumpable, and no CAP_SYS_PTRACE to override that), reports its port on
// `to_parent`, reads the peer's port from `from_parent`, runs a 4 MiB allreduce with the other
// child and checks that it went through the socket after a refused single-copy attempt.
// Returns the exit status (0: all as expected), having said what failed on stderr.
// With `other_user` (run as root), rank 1 becomes user nobody instead, and rank 0 keeps every
// right: the kernel would let rank 0 read rank 1, but rank 0 must not, because rank 1 runs as
// another user; rank 1 cannot read rank 0 anyway.
int refusing_child(int to_parent, int from_parent, int rank, bool other_user, bool shared) {
  alarm(60);  // a hang fails the test instead of stalling it
  if (other_user) {
    if (rank == 1 && setuid(65534) != 0) return 12;
  } else {
    prctl(PR_SET_DUMPABLE, 0);
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2]{};
    if (syscall(SYS_capget, &hdr, caps) != 0) return 10;
    caps[0].effective &= ~(1u << CAP_SYS_PTRACE);
    caps[0].permitted &= ~(1u << CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &hdr, caps) != 0) return 11;
  }
  try {
    PeerOptions o;
    o.job_token = "test-token";
    Peer peer(o);
    const std::uint16_t mine = peer.endpoint().port;
    std::uint16_t theirs = 0;
    if (write(to_parent, &mine, sizeof mine) != sizeof mine) return 13;
    if (read(from_parent, &theirs, sizeof theirs) != sizeof theirs) return 14;
    Cluster c;
    c.version = 1;
    const Endpoint me = peer.endpoint(), other{"127.0.0.1", theirs};
    c.workers = {WorkerSpec{rank == 0 ? me : other, 0}, WorkerSpec{rank == 0 ? other : me, 1}};
    peer.start(c);
    const std::size_t n = std::size_t{1} << 20;  // 4 MiB: frames well over single_copy_bytes
    std::vector<float> heap;
    SharedMemory mem;
    std::span<float> v;
    if (shared) {
      mem = SharedMemory(n * sizeof(float));
      v = mem.as<float>();
    } else {
      heap.resize(n);
      v = heap;
    }
    std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
    CollOptions co;
    co.algorithm = Algorithm::ring;
    peer.allreduce("refused", buffer(v.data(), n), buffer(v.data(), n), co).wait();
    if (peer.transport_stats().shared_read_bytes != 0) {
      std::fprintf(stderr, "rank %d: read in place from a peer it may not read\n", rank);
      return 5;
    }
    for (float x : v) {
      if (x != 3.0f) {
        std::fprintf(stderr, "rank %d: wrong sum %g\n", rank, static_cast<double>(x));
        return 2;
      }
    }
    const TransportStats t = peer.transport_stats();
    if (other_user) {
      // Neither trusts the other's same-host socket (SO_PEERCRED): TCP, with frame MACs.
      if (t.socket_bytes != 0 || t.single_copy_bytes != 0 || t.tcp_bytes == 0) {
        std::fprintf(stderr, "rank %d: socket bytes %llu, single-copy bytes %llu, tcp %llu\n", rank,
                     static_cast<unsigned long long>(t.socket_bytes),
                     static_cast<unsigned long long>(t.single_copy_bytes),
                     static_cast<unsigned long long>(t.tcp_bytes));
        return 4;
      }
    } else if (t.single_copy_refused != 1 || t.single_copy_bytes != 0 || t.socket_bytes == 0) {
      std::fprintf(stderr, "rank %d: refused %llu, single-copy bytes %llu, socket bytes %llu\n",
                   rank, static_cast<unsigned long long>(t.single_copy_refused),
                   static_cast<unsigned long long>(t.single_copy_bytes),
                   static_cast<unsigned long long>(t.socket_bytes));
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 4;
  }
  return 0;
}

// Runs refusing_child in two forked processes that find each other through the parent.
void run_refusing_pair(bool other_user, bool shared = false) {
  int up[2][2], down[2][2];
  for (int r = 0; r < 2; ++r) ASSERT_EQ(pipe(up[r]), 0);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(pipe(down[r]), 0);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    ASSERT_GE(pids[r], 0);
    if (pids[r] == 0) _exit(refusing_child(up[r][1], down[r][0], r, other_user, shared));
  }
  std::uint16_t ports[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(read(up[r][0], &ports[r], sizeof ports[r]), static_cast<ssize_t>(sizeof ports[r]));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(write(down[r][1], &ports[1 - r], sizeof ports[0]),
              static_cast<ssize_t>(sizeof ports[0]));
  }
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << ": "
        << (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                              : "signal " + std::to_string(WTERMSIG(status)));
  }
  for (auto& p : up) close(p[0]), close(p[1]);
  for (auto& p : down) close(p[0]), close(p[1]);
}

// Where the kernel will not let workers read each other's memory (another user, Yama's ptrace
// rules, a seccomp profile), large payloads still arrive: through the socket, after one refused
// attempt per connection. Two processes, because a process may always read its own memory.
TEST(Transport, ARefusedSingleCopyFallsBackToTheSocket) { run_refusing_pair(false); }

// The same for payloads in kf::SharedMemory: the kernel refuses the peer its memory file too
// (pidfd_getfd checks what process_vm_readv does), and the payloads come through the socket.
TEST(Transport, ARefusedMappingFallsBackToTheSocket) { run_refusing_pair(false, true); }

// Workers of different users on one host never use each other's same-host sockets (a listener of
// another user is not trusted with the name): they talk over TCP, and their payloads arrive.
TEST(Transport, WorkersOfDifferentUsersTalkOverTcp) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to run one worker as user nobody";
  run_refusing_pair(true);
}

}  // namespace
}  // namespace kf
