// SPDX-License-Identifier: Apache-2.0
// The shared-memory ring of the same-host transport, both ends in this process: records come
// out whole and in order across the wrap-around, a full ring refuses instead of overwriting,
// the reader's sleep flag reaches the writer, and the reader refuses what it must not map or
// read (foreign names, broken headers).
#include "transport/shm/shm_ring.hpp"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace kf::transport {
namespace {

HeaderBytes data_header(std::uint32_t tag, std::size_t name_bytes, std::size_t payload_bytes) {
  FrameHeader h;
  h.type = FrameType::data;
  h.cluster_version = 3;
  h.tag = tag;
  h.name_bytes = static_cast<std::uint32_t>(name_bytes);
  h.payload_bytes = payload_bytes;
  return encode(h);
}

struct Pair {
  std::unique_ptr<ShmRing> writer, reader;
};

Pair make_pair() {
  std::error_code ec;
  Pair p;
  p.writer = ShmRing::create(ec);
  EXPECT_TRUE(p.writer) << ec.message();
  std::string why;
  p.reader = ShmRing::open(p.writer->name(), why);
  EXPECT_TRUE(p.reader) << why;
  return p;
}

TEST(ShmRing, RecordsComeOutWholeAndInOrderAcrossTheWrapAround) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  // Records of 1/100 of the ring: it wraps about every 100; 300 go through, three at a time.
  const std::size_t n = ShmRing::kCapacity / 100;
  std::vector<std::byte> payload(n);
  std::uint32_t next_read = 0;
  std::string why;
  for (std::uint32_t written = 0; written < 300;) {
    for (int k = 0; k < 3; ++k, ++written) {
      for (std::size_t i = 0; i < n; i += 512) payload[i] = static_cast<std::byte>(written + i);
      const std::string name = "t" + std::to_string(written);
      ASSERT_TRUE(p.writer->try_write(written * 2, data_header(written, name.size(), n), name,
                                      payload.data(), n));
    }
    ShmRing::Record rec;
    while (p.reader->peek(rec, 1 << 20, why) == ShmRing::Peek::record) {
      EXPECT_EQ(rec.socket_before, next_read * 2);
      EXPECT_EQ(rec.header.tag, next_read);
      EXPECT_EQ(rec.name, "t" + std::to_string(next_read));
      ASSERT_EQ(rec.payload.size(), n);
      // Names of 2 to 4 bytes: the payload is still 8-byte aligned, as in-place reductions need.
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(rec.payload.data()) % 8, 0u);
      for (std::size_t i = 0; i < n; i += 512) {
        ASSERT_EQ(rec.payload[i], static_cast<std::byte>(next_read + i)) << next_read;
      }
      p.reader->pop();
      ++next_read;
    }
    ASSERT_TRUE(why.empty()) << why;
  }
  EXPECT_EQ(next_read, 300u);
}

TEST(ShmRing, AFullRingRefusesUntilTheReaderTakesARecord) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  // Records of a fifth of the ring less two lines (head, name, rounding to a line): five fit,
  // the sixth does not.
  const std::size_t n = ShmRing::kCapacity / 5 - 2 * ShmRing::kLine;
  std::vector<std::byte> payload(n, std::byte{7});
  int fitted = 0;
  while (p.writer->try_write(0, data_header(1, 1, n), "x", payload.data(), n)) ++fitted;
  EXPECT_EQ(fitted, 5);
  ShmRing::Record rec;
  std::string why;
  ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record);
  p.reader->pop();
  EXPECT_TRUE(p.writer->try_write(0, data_header(1, 1, n), "x", payload.data(), n));
  // Larger than a quarter of the ring: never written there.
  EXPECT_FALSE(ShmRing::fits(0, ShmRing::kMaxRecord));
  std::vector<std::byte> big(ShmRing::kMaxRecord);
  EXPECT_FALSE(p.writer->try_write(0, data_header(1, 0, big.size()), "", big.data(), big.size()));
}

// A reader that keeps up gets every record near the start of the ring (the same warm pages,
// within ShmRing::kRewindFrom and one record), not at successive places all around it.
TEST(ShmRing, RecordsStartOverWhenTheReaderHasTakenEverything) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  const std::byte payload[4096] = {};
  ShmRing::Record rec;
  std::string why;
  const std::byte* first = nullptr;
  int at_start = 0;
  for (int i = 0; i < 3000; ++i) {
    ASSERT_TRUE(
        p.writer->try_write(0, data_header(1, 1, sizeof payload), "x", payload, sizeof payload));
    ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record) << why;
    if (first == nullptr) first = rec.payload.data();
    ASSERT_GE(rec.payload.data(), first) << "record " << i;
    ASSERT_LT(static_cast<std::size_t>(rec.payload.data() - first),
              ShmRing::kRewindFrom + 2 * sizeof payload)
        << "record " << i;
    at_start += rec.payload.data() == first ? 1 : 0;
    p.reader->pop();
  }
  // 3000 records of 4 KiB are 187 times kRewindFrom.
  EXPECT_GE(at_start, 150);
}

// The same when the reader is always a record behind (the writer sends its next frame before
// the reader took the last one): records still start over near the ring's start, and come out
// whole and in order across the trips back.
TEST(ShmRing, RecordsStartOverWhileTheReaderIsARecordBehind) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  std::byte payload[4096] = {};
  ShmRing::Record rec;
  std::string why;
  const std::byte* first = nullptr;
  std::uint32_t next_read = 0;
  for (std::uint32_t i = 0; i < 3000; ++i) {
    payload[0] = static_cast<std::byte>(i);
    ASSERT_TRUE(
        p.writer->try_write(0, data_header(i, 1, sizeof payload), "x", payload, sizeof payload))
        << "record " << i;
    if (i == 0) continue;  // from now on one record stays unread when the next is written
    ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record) << why;
    ASSERT_EQ(rec.header.tag, next_read);
    ASSERT_EQ(rec.payload[0], static_cast<std::byte>(next_read));
    if (first == nullptr) first = rec.payload.data();
    ASSERT_LT(static_cast<std::size_t>(rec.payload.data() - first),
              ShmRing::kRewindFrom + 3 * sizeof payload)
        << "record " << next_read;
    p.reader->pop();
    ++next_read;
  }
  ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record) << why;
  EXPECT_EQ(rec.header.tag, next_read);
}

FrameHeader data_frame(std::uint32_t tag, std::uint64_t version, std::size_t name_bytes,
                       std::size_t payload_bytes) {
  FrameHeader h;
  h.type = FrameType::data;
  h.cluster_version = version;
  h.tag = tag;
  h.name_bytes = static_cast<std::uint32_t>(name_bytes);
  h.payload_bytes = payload_bytes;
  return h;
}

// Small data frames go into compact records of one cache line each (the point of them: one
// line moves per frame), larger ones into full records; both kinds, mixed, come out whole and
// in order, across many trips back to the ring's start, with payloads aligned for reduction.
TEST(ShmRing, SmallFramesTakeOneCacheLineAndMixWithLargerOnes) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  std::vector<std::byte> payload(3000);
  std::string why;
  int compact = 0;
  for (std::uint32_t i = 0; i < 20000; ++i) {
    // Names of 1-30 bytes and payloads of 0-40 bytes, with every 7th frame of 3000 bytes.
    const std::string name = std::string(1 + i % 30, static_cast<char>('a' + i % 26));
    const std::size_t bytes = i % 7 == 6 ? payload.size() : i % 41;
    for (std::size_t k = 0; k < bytes; ++k) payload[k] = static_cast<std::byte>(i * 31 + k);
    const std::uint64_t version = (std::uint64_t{1} << 40) + i;  // past 32 bits
    ASSERT_TRUE(p.writer->try_write(
        std::uint64_t{i} << 33, data_frame(i, version, name.size(), bytes), name, payload.data()));
    ShmRing::Record rec;
    ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record) << i << ": " << why;
    EXPECT_EQ(rec.socket_before, std::uint64_t{i} << 33);
    EXPECT_EQ(rec.header.type, FrameType::data);
    EXPECT_EQ(rec.header.flags, 0);
    EXPECT_EQ(rec.header.cluster_version, version);
    EXPECT_EQ(rec.header.tag, i);
    EXPECT_EQ(rec.name, name);
    ASSERT_EQ(rec.payload.size(), bytes);
    for (std::size_t k = 0; k < bytes; ++k) {
      ASSERT_EQ(rec.payload[k], static_cast<std::byte>(i * 31 + k)) << i;
    }
    if (bytes > 0) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(rec.payload.data()) % 8, 0u);
    }
    // Everything of a frame whose name and payload fit 24 bytes lies in one 64-byte line.
    const auto line = [](const void* at) {
      return reinterpret_cast<std::uintptr_t>(at) / ShmRing::kLine;
    };
    const std::size_t padded_name = (name.size() + 7) / 8 * 8;
    if (padded_name + bytes <= ShmRing::kLine - ShmRing::kCompactHead) {
      ++compact;
      EXPECT_EQ(line(rec.name.data() - ShmRing::kCompactHead), line(rec.name.data()));
      if (bytes > 0) {
        EXPECT_EQ(line(rec.name.data()), line(rec.payload.data() + bytes - 1)) << i;
      }
    }
    p.reader->pop();
    ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::empty) << i;
  }
  EXPECT_GT(compact, 2000);  // of 20000: 3013 with these names and sizes
}

// What a full ring does not hold of compact records, it holds after the reader takes some; a
// compact record never overwrites one the reader has not taken.
TEST(ShmRing, CompactRecordsWaitForRoomLikeFullOnes) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  const std::byte eight[8] = {std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4},
                              std::byte{5}, std::byte{6}, std::byte{7}, std::byte{8}};
  std::size_t fitted = 0;
  while (p.writer->try_write(fitted, data_frame(1, 1, 1, 8), "c", eight)) ++fitted;
  EXPECT_EQ(fitted, ShmRing::kCapacity / ShmRing::kLine);
  ShmRing::Record rec;
  std::string why;
  for (std::size_t i = 0; i < fitted; ++i) {
    ASSERT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::record) << i << ": " << why;
    ASSERT_EQ(rec.socket_before, i);
    ASSERT_EQ(rec.payload.size(), 8u);
    ASSERT_EQ(rec.payload[7], std::byte{8});
    p.reader->pop();
  }
  EXPECT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::empty);
  EXPECT_TRUE(p.writer->try_write(0, data_frame(1, 1, 1, 8), "c", eight));
  // A compact record's payload over the reader's limit is refused like a full record's.
  ASSERT_EQ(p.reader->peek(rec, 4, why), ShmRing::Peek::bad);
  EXPECT_NE(why.find("malformed compact record"), std::string::npos) << why;
}

TEST(ShmRing, TheReadersSleepFlagReachesTheWriter) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  EXPECT_FALSE(p.writer->reader_sleeping());
  p.reader->set_reader_sleeping(true);
  EXPECT_TRUE(p.writer->reader_sleeping());
  p.reader->set_reader_sleeping(false);
  EXPECT_FALSE(p.writer->reader_sleeping());
}

// The sleep handshake under a race: in each round the writer publishes a record and then looks
// at the sleep flag, while the reader announces its sleep (with the barrier a lightly published
// ring needs) and then looks for the record, both at once. A reader that would sleep without
// seeing the record while the writer did not see the flag would miss its wake-up: never allowed.
// As a sleeping reader would, it keeps the flag set until the writer has looked.
TEST(ShmRing, AWriterSeesTheSleepOrTheReaderSeesTheRecord) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  EXPECT_EQ(p.writer->light_publish(), p.reader->light_publish());
  constexpr int kRounds = 20000;
  std::atomic<int> go{0}, looked{0}, done{0};
  std::vector<char> writer_saw(kRounds), reader_saw(kRounds);
  bool barrier_ok = true;
  std::thread reader([&] {
    ShmRing::Record rec;
    std::string why;
    for (int i = 0; i < kRounds; ++i) {
      while (go.load(std::memory_order_acquire) <= i) {
      }
      p.reader->set_reader_sleeping(true);
      if (p.reader->light_publish() && !ShmRing::sleep_barrier()) barrier_ok = false;
      reader_saw[static_cast<std::size_t>(i)] =
          p.reader->peek(rec, 1 << 20, why) == ShmRing::Peek::record;
      // The round's record, taken now or once it shows.
      while (p.reader->peek(rec, 1 << 20, why) != ShmRing::Peek::record) {
      }
      p.reader->pop();
      while (looked.load(std::memory_order_acquire) <= i) {
      }
      p.reader->set_reader_sleeping(false);
      done.store(i + 1, std::memory_order_release);
    }
  });
  const std::byte payload[8] = {};
  for (int i = 0; i < kRounds; ++i) {
    go.store(i + 1, std::memory_order_release);
    ASSERT_TRUE(
        p.writer->try_write(0, data_header(static_cast<std::uint32_t>(i), 1, 8), "r", payload, 8));
    writer_saw[static_cast<std::size_t>(i)] = p.writer->reader_sleeping();
    looked.store(i + 1, std::memory_order_release);
    while (done.load(std::memory_order_acquire) <= i) {
    }
  }
  reader.join();
  EXPECT_TRUE(barrier_ok) << "the kernel refused the barrier it said it had";
  int missed = 0, both = 0;
  for (int i = 0; i < kRounds; ++i) {
    const auto k = static_cast<std::size_t>(i);
    missed += !writer_saw[k] && !reader_saw[k];
    both += writer_saw[k] && reader_saw[k];
  }
  EXPECT_EQ(missed, 0) << "of " << kRounds << " rounds (light publish " << p.writer->light_publish()
                       << ")";
  std::cout << "[ light publish " << p.writer->light_publish() << "; rounds where both saw the "
            << "other: " << both << " of " << kRounds << " ]" << std::endl;
}

TEST(ShmRing, OpeningRemovesTheNameAndForeignNamesAreRefused) {
  std::error_code ec;
  auto w = ShmRing::create(ec);
  ASSERT_TRUE(w) << ec.message();
  std::string why;
  auto r = ShmRing::open(w->name(), why);
  ASSERT_TRUE(r) << why;
  EXPECT_FALSE(ShmRing::open(w->name(), why));  // the name is gone once mapped
  EXPECT_NE(why.find("cannot open"), std::string::npos) << why;
  for (const std::string bad : {"/etc-passwd", "/kf-../x", "kf-1", "/kf-a/b", ""}) {
    why.clear();
    EXPECT_FALSE(ShmRing::open(bad, why)) << bad;
    EXPECT_NE(why.find("not of the form"), std::string::npos) << bad << ": " << why;
  }
}

TEST(ShmRing, ABrokenHeaderOrAnotherFrameTypeIsReportedNotDelivered) {
  Pair p = make_pair();
  ASSERT_TRUE(p.writer && p.reader);
  HeaderBytes garbage = data_header(1, 1, 4);
  garbage[0] = std::byte{0};  // bad magic
  const std::byte four[4] = {};
  ASSERT_TRUE(p.writer->try_write(0, garbage, "x", four, 4));
  ShmRing::Record rec;
  std::string why;
  EXPECT_EQ(p.reader->peek(rec, 1 << 20, why), ShmRing::Peek::bad);
  EXPECT_NE(why.find("bad magic"), std::string::npos) << why;

  Pair q = make_pair();
  ASSERT_TRUE(q.writer && q.reader);
  FrameHeader h;
  h.type = FrameType::bye;
  ASSERT_TRUE(q.writer->try_write(0, encode(h), "", nullptr, 0));
  why.clear();
  EXPECT_EQ(q.reader->peek(rec, 1 << 20, why), ShmRing::Peek::bad);
  EXPECT_NE(why.find("other than plain data"), std::string::npos) << why;

  // A header that claims more payload than its record holds.
  Pair r = make_pair();
  ASSERT_TRUE(r.writer && r.reader);
  ASSERT_TRUE(r.writer->try_write(0, data_header(1, 1, 4096), "x", four, 4));
  why.clear();
  EXPECT_EQ(r.reader->peek(rec, 1 << 20, why), ShmRing::Peek::bad);
  EXPECT_NE(why.find("larger than its record"), std::string::npos) << why;
}

// A /dev/shm too small for a ring (a container's default is 64 MiB, shared by all its rings):
// create() fails with ENOSPC, and the connection then goes without a ring. Had it only truncated
// the file, the first write to a missing page would kill the process with SIGBUS.
TEST(ShmRing, AFullShmFileSystemMeansNoRingNotACrash) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to mount a small tmpfs in a mount namespace";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 as expected, 2 no namespace here (skip), 1 a ring was made.
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256k") != 0) {
      _exit(2);
    }
    std::error_code ec;
    auto ring = ShmRing::create(ec);
    _exit(!ring && ec == std::errc::no_space_on_device ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "cannot mount a tmpfs in a new mount namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "create() made a ring on a full /dev/shm";
}

}  // namespace
}  // namespace kf::transport
