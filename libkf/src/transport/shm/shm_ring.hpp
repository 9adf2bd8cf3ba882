// SPDX-License-Identifier: Apache-2.0
// A single-producer, single-consumer ring of records in memory shared by two processes on one
// host: the same-host transport's path for small data frames (docs/protocol.md, "Shared-memory
// rings"). The dialer of a connection creates the ring (POSIX shared memory, mode 0600) and
// writes; the acceptor maps it, removes its name, and reads. Neither side makes a system call
// per record; a reader that is about to sleep in the kernel says so in the ring
// (`reader_sleeping`), and the writer then uses the socket instead, which wakes it.
//
// Records start on cache lines and each carries a stamp, stored last, that publishes it: a
// reader looking for the next record reads the line where it starts and nothing else. A small
// data frame (a 4-byte allreduce's) fits a compact record of one line, so one line moves from
// the writer's core to the reader's per frame. (A position word of its own, followed by a
// record over two lines, made three: 0.24 against 0.13 us per exchange between two processes.)
//
// The reader trusts nothing in the mapping: every record's length and position is checked
// before it is read, and the frame header inside goes through transport::decode like one from
// a socket.
//
// Thread-safety: one writer thread and one reader thread at a time (each side's I/O context).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>

#include "transport/frame.hpp"

namespace kf::transport {

class ShmRing {
 public:
  /// Bytes of the record area (a power of two); the mapping adds one page of control words.
  /// Four records of the largest payload (1 MiB, PeerOptions::shm_frame_bytes) fit at once.
  static constexpr std::size_t kCapacity = std::size_t{4} << 20;
  /// Records start at multiples of a cache line; so even the padding at the ring's end has
  /// room for a stamp.
  static constexpr std::size_t kLine = 64;
  /// A full record's fixed part: length and kind, the stamp that publishes it, the count of
  /// socket frames sent before it, the encoded frame header. The name follows, padded to 8
  /// bytes so that the payload after it is aligned for every element type (it is reduced in
  /// place), then the payload.
  static constexpr std::size_t kRecordHead = 24 + kHeaderBytes;
  /// A compact record's fixed part, for a plain data frame: length, kind, name and payload
  /// sizes, the stamp, the socket count, the cluster version and the tag. Used when the name
  /// and payload fit in the rest of one cache line.
  static constexpr std::size_t kCompactHead = 40;
  /// The largest record a writer puts in: a quarter of the ring (so several are in flight),
  /// plus room for the record's head and a name.
  static constexpr std::size_t kMaxRecord = kCapacity / 4 + 4096;
  /// Past this write position a writer goes back to the start when the reader has caught up:
  /// a reader that keeps up reads the same few pages over and over.
  static constexpr std::size_t kRewindFrom = std::size_t{64} << 10;

  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;
  ~ShmRing();

  /// Creates a ring under a fresh name ("/kf-PID-N-RANDOM"), for the writing side. The name
  /// stays until unlink() (the reader unlinks it once it has mapped it).
  static std::unique_ptr<ShmRing> create(std::error_code& ec);
  /// Maps the ring of that name for the reading side and removes the name. Refuses names not
  /// of create()'s form, files of another user or of the wrong size (`why` says which).
  static std::unique_ptr<ShmRing> open(const std::string& name, std::string& why);
  const std::string& name() const noexcept { return name_; }
  /// Removes the name (idempotent); the mappings stay valid.
  void unlink() noexcept;

  // ---- writer ----
  /// Whether a frame of this much name and payload fits a record at all.
  static bool fits(std::size_t name_bytes, std::size_t payload_bytes) noexcept {
    return record_bytes(name_bytes, payload_bytes) <= kMaxRecord;
  }
  /// Appends one frame; false when the ring has no room for it now. `socket_before` is the
  /// number of socket frames the writer has sent on the connection before this one: the reader
  /// takes the record only after it has taken that many from the socket, which keeps the
  /// connection's frames in order across the two paths. A plain data frame whose name and
  /// payload fit goes into a compact record of one cache line; any other into a full record.
  bool try_write(std::uint64_t socket_before, const FrameHeader& h, std::string_view name,
                 const std::byte* payload) noexcept;
  /// Appends a full record with this encoded header, whatever it holds (the reader checks it).
  bool try_write(std::uint64_t socket_before, const HeaderBytes& header, std::string_view name,
                 const std::byte* payload, std::size_t payload_bytes) noexcept;
  /// Whether the reader has said it sleeps in the kernel, looked at right after a record was
  /// published: either the reader sees that record or this sees its announcement (see
  /// set_reader_sleeping).
  bool reader_sleeping() const noexcept;
  /// Whether this ring's writer publishes records with a plain store (no fence): its process is
  /// registered for the system-wide barrier that a reader then makes before it sleeps
  /// (sleep_barrier). Otherwise each stamp is stored with a full fence, as on kernels without
  /// `membarrier`. Set by the writer at create() and read by the reader at open().
  bool light_publish() const noexcept { return light_; }
  /// The reader's side of a light publish: a memory barrier on every core that runs a thread of
  /// a registered process (membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED), made after announcing
  /// sleep and before looking at the ring once more. False when the kernel refused it (the
  /// reader must then not sleep).
  static bool sleep_barrier() noexcept;

  // ---- reader ----
  struct Record {
    std::uint64_t socket_before = 0;
    FrameHeader header;
    std::string_view name;  // into the mapping; valid until pop()
    std::span<const std::byte> payload;
  };
  enum class Peek { empty, record, bad };
  /// The oldest unread record, checked: `bad` (with `why`) when the writer broke the format.
  Peek peek(Record& out, std::uint64_t max_payload, std::string& why) noexcept;
  /// Frees the record peek() returned.
  void pop() noexcept;
  /// This side's mapping of the record area, for checks (tests and the fuzz harness): every
  /// record peek() returns lies inside it.
  std::span<const std::byte> records() const noexcept { return {data(), kCapacity}; }
  /// Announces (true) that the reader is about to sleep in the kernel, or that it is awake.
  /// After announcing sleep the reader looks at the ring once more (after sleep_barrier() where
  /// the writer publishes lightly), and a writer that published first sees the flag or its
  /// record is seen.
  void set_reader_sleeping(bool sleeping) noexcept;

 private:
  struct Control;
  ShmRing(std::string name, void* map, bool owner) noexcept;
  static constexpr std::size_t align8(std::size_t n) noexcept { return (n + 7) & ~std::size_t{7}; }
  static constexpr std::size_t to_line(std::size_t n) noexcept {
    return (n + kLine - 1) & ~(kLine - 1);
  }
  static std::size_t record_bytes(std::size_t name_bytes, std::size_t payload_bytes) noexcept {
    return to_line(kRecordHead + align8(name_bytes) + payload_bytes);
  }
  /// Room for a record of `size` bytes at the write position (after padding to the ring's
  /// start, which it writes); nullptr when the ring has none now.
  std::byte* reserve(std::size_t size) noexcept;
  /// Publishes the record at `r` of `size` bytes, reserved before.
  void publish(std::byte* r, std::size_t size) noexcept;
  static constexpr std::size_t kControlBytes = 4096;
  static constexpr std::size_t kMapBytes = kControlBytes + kCapacity;
  Control* control() const noexcept { return static_cast<Control*>(map_); }
  std::byte* data() const noexcept { return static_cast<std::byte*>(map_) + kControlBytes; }

  std::string name_;
  void* map_ = nullptr;
  bool owner_ = false;  // created it: unlinks the name if the reader never did
  bool linked_ = false;
  bool light_ = false;           // records are published without a fence (light_publish)
  std::uint64_t tail_ = 0;       // writer: bytes published; reader: unused
  std::uint64_t head_seen_ = 0;  // writer: the reader's position when last loaded
  std::uint64_t head_ = 0;       // reader: bytes consumed; writer: unused
  std::uint64_t next_ = 0;       // reader: head_ after the record peek() returned
};

}  // namespace kf::transport
