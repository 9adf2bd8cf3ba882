// SPDX-License-Identifier: Apache-2.0
// The shared-memory ring's reader (transport/shm/shm_ring.hpp) over whatever the writer's side
// of the mapping holds. The input is a list of records, written through the writer (headers of
// any bytes; compact records where the header allows), then bytes flipped anywhere in the
// record area, as a writer gone wrong would leave them. The reader then must: stop (within one
// pass over the ring), return only records wholly inside its mapping, of plain data frames
// within the payload limit; and with nothing flipped, return exactly the records written, in
// order.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "transport/shm/shm_ring.hpp"

using namespace kf::transport;

namespace {

constexpr std::size_t kControlBytes = 4096;  // the ring's control page, before the records

struct Written {
  bool plain = false;  // a plain data frame (else the reader must refuse it)
  FrameHeader header;
  std::string name;
  std::vector<std::byte> payload;
  std::uint64_t socket_before = 0;
};

bool inside(std::span<const std::byte> area, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  return b >= area.data() && b + n <= area.data() + area.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kf::fuzz::Input in(data, size);
  std::error_code ec;
  auto writer = ShmRing::create(ec);
  if (!writer) return 0;  // no /dev/shm here: nothing to test
  // A third mapping of the same memory: the bytes a broken writer could leave.
  void* raw = MAP_FAILED;
  const int fd = ::shm_open(writer->name().c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd >= 0) {
    raw = ::mmap(nullptr, kControlBytes + ShmRing::kCapacity, PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd, 0);
    ::close(fd);
  }
  std::string why;
  auto reader = ShmRing::open(writer->name(), why);
  KF_FUZZ_CHECK(reader != nullptr, "a ring just made must open: " + why);
  if (raw == MAP_FAILED) return 0;
  auto* area = static_cast<std::byte*>(raw) + kControlBytes;

  const std::uint64_t max_payload = in.byte() & 1 ? 4096 : std::uint64_t{64} << 20;
  std::vector<Written> written;
  const int count = in.byte() % 16;
  for (int i = 0; i < count && !in.empty(); ++i) {
    HeaderBytes hb{};
    for (auto& b : hb) b = static_cast<std::byte>(in.byte());
    std::string name = in.piece();
    if (name.size() > 63) name.resize(63);
    const std::size_t payload_bytes = in.byte() * 8u;
    std::vector<std::byte> payload(payload_bytes);
    for (auto& b : payload) b = static_cast<std::byte>(in.byte());
    FrameHeader h;
    std::string hwhy;
    // A header that decodes as plain data, with the sizes of what follows, may take the compact
    // path; any other is written as it is (the reader must refuse what is not plain data).
    const bool plain = decode(hb, max_payload, h, hwhy) && h.type == FrameType::data &&
                       h.flags == 0 && h.name_bytes == name.size() &&
                       h.payload_bytes == payload_bytes;
    const bool ok = plain ? writer->try_write(i, h, name, payload.data())
                          : writer->try_write(i, hb, name, payload.data(), payload_bytes);
    if (ok) {
      written.push_back(Written{plain, h, name, payload, static_cast<std::uint64_t>(i)});
    }
  }
  // Flips: an offset (3 bytes, within the first 64 KiB, where the records are) and a mask.
  bool flipped = false;
  while (in.remaining() >= 4) {
    const std::size_t at = (in.byte() | in.byte() << 8 | in.byte() << 16) % (64 * 1024);
    area[at] ^= static_cast<std::byte>(in.byte() | 1);
    flipped = true;
  }

  const auto mine = reader->records();
  std::size_t taken = 0;
  bool refused = false;
  for (std::size_t steps = 0;; ++steps) {
    KF_FUZZ_CHECK(steps <= ShmRing::kCapacity / ShmRing::kLine + 1,
                  "the reader did not stop within one pass over the ring");
    ShmRing::Record r;
    std::string rwhy;
    const auto p = reader->peek(r, max_payload, rwhy);
    if (p == ShmRing::Peek::empty) break;
    if (p == ShmRing::Peek::bad) {
      KF_FUZZ_CHECK(!rwhy.empty(), "a bad record must say why");
      refused = true;
      break;
    }
    KF_FUZZ_CHECK(inside(mine, r.name.data(), r.name.size()), "a name outside the ring");
    KF_FUZZ_CHECK(inside(mine, r.payload.data(), r.payload.size()), "a payload outside the ring");
    KF_FUZZ_CHECK(r.header.type == FrameType::data && r.header.flags == 0,
                  "a record of a frame other than plain data");
    KF_FUZZ_CHECK(r.payload.size() == r.header.payload_bytes && r.payload.size() <= max_payload,
                  "a payload of the wrong size");
    if (!flipped) {
      KF_FUZZ_CHECK(taken < written.size(), "more records than were written");
      // One written from raw header bytes may still read as a plain data frame (its sizes
      // inside its record); one written as plain data must come back as it was.
      const Written& w = written[taken];
      KF_FUZZ_CHECK(
          !w.plain || w.name == r.name && w.header.cluster_version == r.header.cluster_version &&
                          w.header.tag == r.header.tag && w.socket_before == r.socket_before &&
                          std::equal(w.payload.begin(), w.payload.end(), r.payload.begin(),
                                     r.payload.end()),
          "a record read back differs from the one written");
    }
    reader->pop();
    ++taken;
  }
  if (!flipped) {
    // Every record written comes back; the reader stops only at one that is no plain data
    // frame (written as it was: Written::plain false).
    KF_FUZZ_CHECK(
        refused ? taken < written.size() && !written[taken].plain : taken == written.size(),
        "the records read back are not the ones written");
  }
  ::munmap(raw, kControlBytes + ShmRing::kCapacity);
  return 0;
}
