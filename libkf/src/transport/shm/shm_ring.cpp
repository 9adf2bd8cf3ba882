// SPDX-License-Identifier: Apache-2.0
#include "transport/shm/shm_ring.hpp"

#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>

namespace kf::transport {

// The control words, each on its own cache line, both stored by the reader: `head` and
// `sleeping`. The writer publishes in the records themselves (their stamps), and says once, at
// creation, whether it publishes them lightly (`light`: 1).
struct ShmRing::Control {
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint32_t> sleeping;
  alignas(64) std::atomic<std::uint32_t> light;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the ring's control words are shared between processes");
static_assert(std::atomic_ref<std::uint64_t>::required_alignment <= 8,
              "a record's stamp is 8-byte aligned");

namespace {

// A record's first line: length (u32), kind (u8), and for a compact record the name's and the
// payload's sizes (u8, u16); the stamp (u64 at 8); the count of socket frames before it (u64 at
// 16). A full record then holds the encoded header (32 bytes at 24), the name at 56 and the
// payload; a compact one the cluster version (u64 at 24), the tag (u32 at 32), the name at 40
// and the payload, all within the line.
constexpr std::uint8_t kKindFrame = 1;
constexpr std::uint8_t kKindPad = 2;  // fills the ring's end when a record does not fit there
constexpr std::uint8_t kKindCompact = 3;
constexpr std::size_t kAtStamp = 8;
constexpr std::size_t kAtSocketBefore = 16;
constexpr std::size_t kAtHeader = 24;
constexpr std::size_t kAtVersion = 24;
constexpr std::size_t kAtTag = 32;
static_assert(ShmRing::kRecordHead == kAtHeader + kHeaderBytes, "the name follows the header");
static_assert(ShmRing::kCompactHead == kAtTag + 8, "the name follows the tag, 8-byte aligned");

template <typename T>
T load_at(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store_at(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof v);
}

// A record's stamp: its position in the writer's stream of bytes, plus one (so that the zeroes
// of a fresh ring are no record). Positions only grow, so a record left from before at the same
// place in the ring, seen again after the writer went back to the start, never has the stamp
// the reader expects there.
constexpr std::uint64_t stamp_for(std::uint64_t position) noexcept { return position + 1; }

std::atomic_ref<std::uint64_t> stamp_at(std::byte* record) noexcept {
  return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(record + kAtStamp));
}

bool valid_name(const std::string& name) {
  if (name.size() < 5 || name.size() > 64 || name.compare(0, 4, "/kf-") != 0) return false;
  for (std::size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Whether this process can take part in light publishing: the kernel has the system-wide
// expedited barrier, and this process is registered for it (once; registration covers every
// thread of the process, also later ones). Without it (an old kernel, a seccomp filter that
// refuses membarrier) rings publish with a fence.
//
// Why: a writer's stamp store and its look at `sleeping` right after must not be reordered (the
// reader does the mirror: announce, then look at the ring). A sequentially consistent store is
// a full fence (an xchg on x86), which waits until the record's line has been taken from the
// reader's core, where the reader last read it: at every record, on the critical path of a
// small collective. With the barrier moved to the reader's rare sleep, a 4-byte allreduce of two
// workers took 0.50-0.51 us against 0.53-0.55 us (alternating runs, back to back).
bool light_publishing() noexcept {
  static const bool ok = [] {
    const long cmds = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    const long need = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    if (cmds < 0 || (cmds & need) != need) return false;
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  }();
  return ok;
}

}  // namespace

bool ShmRing::sleep_barrier() noexcept {
  return ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

ShmRing::ShmRing(std::string name, void* map, bool owner) noexcept
    : name_(std::move(name)), map_(map), owner_(owner), linked_(true) {}

ShmRing::~ShmRing() {
  if (owner_) unlink();
  if (map_) ::munmap(map_, kMapBytes);
}

void ShmRing::unlink() noexcept {
  if (!linked_) return;
  linked_ = false;
  ::shm_unlink(name_.c_str());
}

std::unique_ptr<ShmRing> ShmRing::create(std::error_code& ec) {
  static std::atomic<std::uint64_t> counter{0};
  std::random_device rd;
  const std::string name = "/kf-" + std::to_string(::getpid()) + "-" +
                           std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rd());
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    ec = std::error_code(errno, std::generic_category());
    return nullptr;
  }
  // Reserve the pages now: on a tmpfs that is full (a container's small /dev/shm), touching a
  // page of a merely truncated file would raise SIGBUS later; fallocate fails here instead.
  void* map = MAP_FAILED;
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(kMapBytes));
  if (err == 0) {
    map = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) err = errno;
  }
  ::close(fd);
  if (map == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    ec = std::error_code(err, std::generic_category());
    return nullptr;
  }
  auto* control = new (map) Control{};
  const bool light = light_publishing();
  control->light.store(light ? 1 : 0, std::memory_order_relaxed);
  ec.clear();
  auto ring = std::unique_ptr<ShmRing>(new ShmRing(name, map, true));
  ring->light_ = light;
  return ring;
}

std::unique_ptr<ShmRing> ShmRing::open(const std::string& name, std::string& why) {
  if (!valid_name(name)) {
    why = "shared-memory ring name is not of the form /kf-...";
    return nullptr;
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) {
    why = "cannot open shared-memory ring " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  void* map = MAP_FAILED;
  if (::fstat(fd, &st) != 0) {
    why = "cannot stat shared-memory ring " + name + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    why = "shared-memory ring " + name + " is not a private file of this user";
  } else if (st.st_size != static_cast<off_t>(kMapBytes)) {
    why = "shared-memory ring " + name + " has " + std::to_string(st.st_size) + " bytes, not " +
          std::to_string(kMapBytes);
  } else {
    map = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
      why = "cannot map shared-memory ring " + name + ": " + std::strerror(errno);
  }
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  auto ring = std::unique_ptr<ShmRing>(new ShmRing(name, map, false));
  ring->unlink();
  // A writer that publishes lightly relies on this side's barrier before it sleeps: a reader
  // that cannot make it must not take the ring (the connection then carries every frame).
  ring->light_ = ring->control()->light.load(std::memory_order_relaxed) != 0;
  if (ring->light_ && !light_publishing()) {
    why = "shared-memory ring " + name +
          " is published without fences, and this process cannot make the barrier "
          "(membarrier) that reading it then needs";
    return nullptr;
  }
  // Start where the writer is: a fresh ring is empty, and the reader never trusts more.
  ring->head_ = ring->control()->head.load(std::memory_order_acquire);
  ring->next_ = ring->head_;
  return ring;
}

std::byte* ShmRing::reserve(std::size_t size) noexcept {
  if (size > kMaxRecord) return nullptr;
  std::size_t pos = static_cast<std::size_t>(tail_ & (kCapacity - 1));
  const std::size_t to_end = kCapacity - pos;
  // Padding to the end when the record does not fit there; and also, once the position is past
  // the first kRewindFrom bytes, whenever the record fits at the start: a reader that keeps up
  // then sees the same few pages over and over. Walking through all of the ring's pages instead
  // cost 4-8x in latency for 1-4 KiB frames between 4 workers on 2 cores (pages that are not in
  // the TLB and the cache; on this VM, shadow page faults). A reader that is a record or two
  // behind (frames in flight back to back) counts as keeping up: going back only when it had
  // taken everything had a writer that was always a step ahead walk the whole ring, loading
  // the reader's position for every record.
  //
  // The reader's position is loaded only when the record does not fit by the position last
  // seen: the reader stores it with every record it takes, so each load is a cache line brought
  // over from the reader's core, on the sending path. A stale position only ever says the ring
  // is fuller than it is.
  std::size_t pad = to_end < size ? to_end : 0;
  if (pos >= kRewindFrom && size <= pos) pad = to_end;
  const auto fits = [&](std::size_t padding) {
    return tail_ + padding + size - head_seen_ <= kCapacity;
  };
  if (!fits(pad)) {
    head_seen_ = control()->head.load(std::memory_order_acquire);
    if (!fits(pad)) {
      // No room to go back to the start (the reader is far behind): on from here if it fits.
      if (pad == 0 || to_end < size || !fits(0)) return nullptr;
      pad = 0;
    }
  }
  std::byte* d = data();
  if (pad > 0) {
    std::byte* r = d + pos;
    store_at<std::uint32_t>(r, static_cast<std::uint32_t>(pad));
    store_at<std::uint8_t>(r + 4, kKindPad);
    publish(r, pad);
    pos = 0;
  }
  return d + pos;
}

// Paired with the reader's sleep flag (see reader_sleeping): sequentially consistent, or, when
// publishing lightly, a release store that the compiler must keep before the look at the flag
// (the processor may still let the look pass the store; the reader's sleep_barrier covers it).
void ShmRing::publish(std::byte* r, std::size_t size) noexcept {
  if (light_) {
    stamp_at(r).store(stamp_for(tail_), std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    stamp_at(r).store(stamp_for(tail_), std::memory_order_seq_cst);
  }
  tail_ += size;
}

bool ShmRing::try_write(std::uint64_t socket_before, const FrameHeader& h, std::string_view name,
                        const std::byte* payload) noexcept {
  const std::size_t payload_bytes = static_cast<std::size_t>(h.payload_bytes);
  if (h.type != FrameType::data || h.flags != 0 ||
      kCompactHead + align8(name.size()) + payload_bytes > kLine) {
    return try_write(socket_before, encode(h), name, payload, payload_bytes);
  }
  std::byte* r = reserve(kLine);
  if (r == nullptr) return false;
  store_at<std::uint32_t>(r, static_cast<std::uint32_t>(kLine));
  store_at<std::uint8_t>(r + 4, kKindCompact);
  store_at<std::uint8_t>(r + 5, static_cast<std::uint8_t>(name.size()));
  store_at<std::uint16_t>(r + 6, static_cast<std::uint16_t>(payload_bytes));
  store_at<std::uint64_t>(r + kAtSocketBefore, socket_before);
  store_at<std::uint64_t>(r + kAtVersion, h.cluster_version);
  store_at<std::uint32_t>(r + kAtTag, h.tag);
  std::memcpy(r + kCompactHead, name.data(), name.size());
  if (payload_bytes > 0) {
    std::memcpy(r + kCompactHead + align8(name.size()), payload, payload_bytes);
  }
  publish(r, kLine);
  return true;
}

bool ShmRing::try_write(std::uint64_t socket_before, const HeaderBytes& header,
                        std::string_view name, const std::byte* payload,
                        std::size_t payload_bytes) noexcept {
  const std::size_t size = record_bytes(name.size(), payload_bytes);
  std::byte* r = reserve(size);
  if (r == nullptr) return false;
  // Back to front: the first line, which the reader polls, is written last and at once, so
  // that it moves to this core and back once (written first, the reader's polls took it back
  // while the rest was written, and the stamp fetched it again: 16 B 0.57 -> 0.60 us).
  if (payload_bytes > 0) std::memcpy(r + kRecordHead + align8(name.size()), payload, payload_bytes);
  std::memcpy(r + kRecordHead, name.data(), name.size());
  std::memcpy(r + kAtHeader, header.data(), header.size());
  store_at<std::uint64_t>(r + kAtSocketBefore, socket_before);
  store_at<std::uint32_t>(r, static_cast<std::uint32_t>(size));
  store_at<std::uint8_t>(r + 4, kKindFrame);
  publish(r, size);
  return true;
}

bool ShmRing::reader_sleeping() const noexcept {
  return control()->sleeping.load(std::memory_order_seq_cst) != 0;
}

void ShmRing::set_reader_sleeping(bool sleeping) noexcept {
  control()->sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
}

ShmRing::Peek ShmRing::peek(Record& out, std::uint64_t max_payload, std::string& why) noexcept {
  for (;;) {
    const std::size_t pos = static_cast<std::size_t>(head_ & (kCapacity - 1));
    std::byte* r = data() + pos;
    // Sequentially consistent: a reader that announced its sleep looks here once more.
    if (stamp_at(r).load(std::memory_order_seq_cst) != stamp_for(head_)) return Peek::empty;
    const auto len = load_at<std::uint32_t>(r);
    const auto kind = load_at<std::uint8_t>(r + 4);
    if (len < kLine || len % kLine != 0 || len > kCapacity - pos) {
      why = "shared-memory ring: a record's length " + std::to_string(len) + " is out of range";
      return Peek::bad;
    }
    if (kind == kKindPad) {
      head_ += len;
      control()->head.store(head_, std::memory_order_release);
      continue;
    }
    FrameHeader h;
    std::size_t name_at = 0;
    if (kind == kKindCompact) {
      h.type = FrameType::data;
      h.cluster_version = load_at<std::uint64_t>(r + kAtVersion);
      h.tag = load_at<std::uint32_t>(r + kAtTag);
      h.name_bytes = load_at<std::uint8_t>(r + 5);
      h.payload_bytes = load_at<std::uint16_t>(r + 6);
      name_at = kCompactHead;
      if (len != kLine || h.payload_bytes > max_payload) {
        why = "shared-memory ring: malformed compact record (" + std::to_string(len) +
              " bytes, payload " + std::to_string(h.payload_bytes) + ")";
        return Peek::bad;
      }
    } else if (kind == kKindFrame && len >= kRecordHead) {
      HeaderBytes hb;
      std::memcpy(hb.data(), r + kAtHeader, hb.size());
      std::string hwhy;
      if (!decode(hb, max_payload, h, hwhy)) {
        why = "shared-memory ring: " + hwhy;
        return Peek::bad;
      }
      if (h.type != FrameType::data || h.flags != 0) {
        why = "shared-memory ring: a record holds a frame other than plain data";
        return Peek::bad;
      }
      name_at = kRecordHead;
    } else {
      why = "shared-memory ring: malformed record (kind " + std::to_string(kind) + ", " +
            std::to_string(len) + " bytes)";
      return Peek::bad;
    }
    if (name_at + align8(h.name_bytes) + h.payload_bytes > len) {
      why = "shared-memory ring: a frame is larger than its record";
      return Peek::bad;
    }
    out.socket_before = load_at<std::uint64_t>(r + kAtSocketBefore);
    out.header = h;
    out.name = std::string_view(reinterpret_cast<const char*>(r + name_at), h.name_bytes);
    out.payload = std::span<const std::byte>(r + name_at + align8(h.name_bytes),
                                             static_cast<std::size_t>(h.payload_bytes));
    next_ = head_ + len;
    return Peek::record;
  }
}

void ShmRing::pop() noexcept {
  head_ = next_;
  control()->head.store(head_, std::memory_order_release);
}

}  // namespace kf::transport
