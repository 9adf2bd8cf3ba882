// SPDX-License-Identifier: Apache-2.0
#include "transport/shm_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <random>

namespace kf::transport {

// The control words, each on its own cache line: the writer stores `tail`, the reader `head`
// and `sleeping`.
struct ShmRing::Control {
  alignas(64) std::atomic<std::uint64_t> tail;
  alignas(64) std::atomic<std::uint64_t> head;
  alignas(64) std::atomic<std::uint32_t> sleeping;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the ring's control words are shared between processes");

namespace {

constexpr std::uint32_t kKindFrame = 1;
constexpr std::uint32_t kKindPad = 2;  // fills the ring's end when a record does not fit there

template <typename T>
T load_at(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool valid_name(const std::string& name) {
  if (name.size() < 5 || name.size() > 64 || name.compare(0, 4, "/kf-") != 0) return false;
  for (std::size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

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
  new (map) Control{};
  ec.clear();
  return std::unique_ptr<ShmRing>(new ShmRing(name, map, true));
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
    why = "shared-memory ring " + name + " has " + std::to_string(st.st_size) +
          " bytes, not " + std::to_string(kMapBytes);
  } else {
    map = ::mmap(nullptr, kMapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) why = "cannot map shared-memory ring " + name + ": " + std::strerror(errno);
  }
  ::close(fd);
  if (map == MAP_FAILED) return nullptr;
  auto ring = std::unique_ptr<ShmRing>(new ShmRing(name, map, false));
  ring->unlink();
  // Start where the writer is: a fresh ring is empty, and the reader never trusts more.
  ring->head_ = ring->control()->head.load(std::memory_order_acquire);
  ring->next_ = ring->head_;
  return ring;
}

bool ShmRing::try_write(std::uint64_t socket_before, const HeaderBytes& header,
                        std::string_view name, const std::byte* payload,
                        std::size_t payload_bytes) noexcept {
  const std::size_t size = record_bytes(name.size(), payload_bytes);
  if (size > kMaxRecord) return false;
  std::size_t pos = static_cast<std::size_t>(tail_ & (kCapacity - 1));
  const std::size_t to_end = kCapacity - pos;
  // Padding to the end when the record does not fit there; and also, once the position is past
  // the first kRewindFrom bytes, when the reader has taken everything and the record fits
  // before the current position: then it goes to the start, so a reader that keeps up sees the
  // same few pages over and over. Walking through all of the ring's pages instead cost 4-8x in
  // latency for 1-4 KiB frames between 4 workers on 2 cores (pages that are not in the TLB and
  // the cache; on this VM, shadow page faults).
  //
  // The reader's position is loaded only when that choice needs it, or when the record does
  // not fit by the position last seen: the reader stores it with every record it takes, so
  // each load is a cache line brought over from the reader's core, on the sending path.
  const bool far = pos >= kRewindFrom;
  if (far) head_seen_ = control()->head.load(std::memory_order_acquire);
  std::size_t pad = 0;
  for (bool fresh = far;; fresh = true) {
    const bool rewind = far && head_seen_ == tail_ && size <= pos;
    pad = (to_end < size || rewind) ? to_end : 0;
    if (tail_ + pad + size - head_seen_ <= kCapacity) break;
    if (fresh) return false;
    head_seen_ = control()->head.load(std::memory_order_acquire);
  }
  std::byte* d = data();
  if (pad > 0) {
    const std::uint32_t words[2] = {static_cast<std::uint32_t>(pad), kKindPad};
    std::memcpy(d + pos, words, sizeof words);
    tail_ += pad;
    pos = 0;
  }
  std::byte* r = d + pos;
  const std::uint32_t words[2] = {static_cast<std::uint32_t>(size), kKindFrame};
  std::memcpy(r, words, sizeof words);
  std::memcpy(r + 8, &socket_before, sizeof socket_before);
  std::memcpy(r + 16, header.data(), header.size());
  std::memcpy(r + kRecordHead, name.data(), name.size());
  if (payload_bytes > 0) std::memcpy(r + kRecordHead + align8(name.size()), payload, payload_bytes);
  tail_ += size;
  control()->tail.store(tail_, std::memory_order_seq_cst);
  return true;
}

bool ShmRing::reader_sleeping() const noexcept {
  return control()->sleeping.load(std::memory_order_seq_cst) != 0;
}

void ShmRing::set_reader_sleeping(bool sleeping) noexcept {
  control()->sleeping.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
}

ShmRing::Peek ShmRing::peek(Record& out, std::uint64_t max_payload, std::string& why) noexcept {
  const std::uint64_t tail = control()->tail.load(std::memory_order_seq_cst);
  for (;;) {
    if (tail == head_) return Peek::empty;
    const std::uint64_t avail = tail - head_;
    if (avail > kCapacity || avail % 8 != 0) {
      why = "shared-memory ring: the writer's position is out of range";
      return Peek::bad;
    }
    const std::size_t pos = static_cast<std::size_t>(head_ & (kCapacity - 1));
    const std::byte* r = data() + pos;
    const auto len = load_at<std::uint32_t>(r);
    const auto kind = load_at<std::uint32_t>(r + 4);
    if (len < 8 || len % 8 != 0 || len > kCapacity - pos || len > avail) {
      why = "shared-memory ring: a record's length " + std::to_string(len) + " is out of range";
      return Peek::bad;
    }
    if (kind == kKindPad) {
      head_ += len;
      control()->head.store(head_, std::memory_order_release);
      continue;
    }
    if (kind != kKindFrame || len < kRecordHead) {
      why = "shared-memory ring: malformed record (kind " + std::to_string(kind) + ", " +
            std::to_string(len) + " bytes)";
      return Peek::bad;
    }
    HeaderBytes hb;
    std::memcpy(hb.data(), r + 16, hb.size());
    FrameHeader h;
    std::string hwhy;
    if (!decode(hb, max_payload, h, hwhy)) {
      why = "shared-memory ring: " + hwhy;
      return Peek::bad;
    }
    if (h.type != FrameType::data || h.flags != 0) {
      why = "shared-memory ring: a record holds a frame other than plain data";
      return Peek::bad;
    }
    if (kRecordHead + align8(h.name_bytes) + h.payload_bytes > len) {
      why = "shared-memory ring: a frame is larger than its record";
      return Peek::bad;
    }
    out.socket_before = load_at<std::uint64_t>(r + 8);
    out.header = h;
    out.name = std::string_view(reinterpret_cast<const char*>(r + kRecordHead), h.name_bytes);
    out.payload = std::span<const std::byte>(r + kRecordHead + align8(h.name_bytes),
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
