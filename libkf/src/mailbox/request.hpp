// SPDX-License-Identifier: Apache-2.0
// Transfers between the engine and the mesh: a send or a receive request, and the one-shot
// event that says it is done. Thread-safety: I/O context only (see driver/driver.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "common/asio.hpp"
#include "common/clock.hpp"
#include "kf/coll/types.hpp"
#include "kf/common/dtype.hpp"
#include "transport/frame.hpp"

namespace kf::detail {

struct Event;

/// What waits on an Event without a coroutine (a collective's lane): when the event is set, the
/// waiter goes on its run queue (`woken`), and whoever runs the context advances it from there.
struct Waiter {
  Event* waiting_on = nullptr;
  std::vector<Waiter*>* woken = nullptr;
};

inline void wake(Waiter& w) {
  w.waiting_on = nullptr;
  w.woken->push_back(&w);
}

/// A one-shot event on the I/O thread. Two kinds of waiter: a running collective's lane, which
/// is put back on the run queue when the event is set (LaneRun: no coroutine, no timer), and a
/// coroutine, which waits on the event's timer: it is cancelled to signal completion, and its
/// expiry doubles as the coroutine's deadline. The timer is made on first use only: most
/// events are never waited on by a coroutine, and making one costs a lock.
struct Event {
  explicit Event(const asio::any_io_executor& e) : ex(e) {}
  asio::any_io_executor ex;
  std::optional<asio::steady_timer> timer_;
  bool done = false;
  std::error_code ec;
  Waiter* waiter = nullptr;
  asio::steady_timer& timer() {
    if (!timer_) timer_.emplace(ex, Clock::time_point::max());
    return *timer_;
  }
  void set(std::error_code e) {
    if (done) return;
    done = true;
    ec = e;
    if (timer_) timer_->cancel();
    if (waiter) wake(*std::exchange(waiter, nullptr));
  }
};

struct MailKey {
  int peer;
  std::uint64_t version;
  std::uint32_t tag;
  std::string name;
  bool operator==(const MailKey&) const = default;
};
/// A MailKey whose name is borrowed (from a frame being read, or a ring record): the mailbox is
/// searched with it without copying the name, which for names past the short-string size
/// would be an allocation per frame.
struct MailKeyView {
  int peer;
  std::uint64_t version;
  std::uint32_t tag;
  std::string_view name;
  MailKey owned() const { return MailKey{peer, version, tag, std::string(name)}; }
};
struct MailKeyHash {
  using is_transparent = void;
  static std::size_t mix(std::string_view name, int peer, std::uint64_t version,
                         std::uint32_t tag) noexcept {
    std::size_t h = std::hash<std::string_view>{}(name);
    h ^= std::hash<std::uint64_t>{}(version + (static_cast<std::uint64_t>(peer) << 40) +
                                    (static_cast<std::uint64_t>(tag) << 20)) +
         0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
  std::size_t operator()(const MailKey& k) const noexcept {
    return mix(k.name, k.peer, k.version, k.tag);
  }
  std::size_t operator()(const MailKeyView& k) const noexcept {
    return mix(k.name, k.peer, k.version, k.tag);
  }
};
struct MailKeyEq {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const noexcept {
    return a.peer == b.peer && a.version == b.version && a.tag == b.tag &&
           std::string_view(a.name) == std::string_view(b.name);
  }
};

struct SendReq {
  explicit SendReq(const asio::any_io_executor& ex) : ev(ex) {}
  transport::HeaderBytes header{};
  std::string name;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::vector<std::byte> owned;  // payload of control frames
  Event ev;
  bool in_progress = false;
  bool cancelled = false;
  // Bytes of the frame (header, name, payload) that post_send wrote straight into the socket
  // before the socket was full; the writer sends the rest. Such a frame is counted in
  // Outgoing::socket_frames already.
  std::size_t written = 0;
  // With frame MACs: the frame's tag, once computed (write_now computes it for the frames it
  // starts; the writer for the others, as it writes their payload).
  std::array<std::byte, 16> tag{};
  bool tag_ready = false;
};

struct RecvReq {
  RecvReq(const asio::any_io_executor& ex, MailKey k) : key(std::move(k)), ev(ex) {}
  MailKey key;
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
  Event ev;
  bool in_progress = false;
  // Reduce on arrival instead of copying: dst[i] = (src ? src : dst)[i] OP payload[i]. Large
  // payloads are then reduced chunk by chunk while each chunk is still in cache.
  bool reduce = false;
  const std::byte* src = nullptr;
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
};

/// Puts n payload bytes that belong at `offset` of the request's destination in place.
/// Copies n payload bytes to dst, or with `reduce` stores dst[i] = (src ? src : dst)[i] OP
/// data[i].
inline void deliver_to(std::byte* dst, bool reduce, const std::byte* src, DType dtype, ReduceOp op,
                       const std::byte* data, std::size_t n) {
  if (n == 0) return;
  if (!reduce) {
    std::memcpy(dst, data, n);
    return;
  }
  reduce_to(dst, src ? src : dst, data, n / dtype_bytes(dtype), dtype, op);
}
inline void deliver(RecvReq& r, const std::byte* data, std::size_t offset, std::size_t n) {
  deliver_to(r.dst + offset, r.reduce, r.src ? r.src + offset : nullptr, r.dtype, r.op, data, n);
}

/// Why a frame for a waiting receive ends its connection: its size is not the receive's.
inline std::string wrong_size(std::string_view name, std::size_t got, std::size_t want) {
  return "frame for '" + std::string(name) + "' carries " + std::to_string(got) +
         " bytes, the receiver expects " + std::to_string(want);
}

}  // namespace kf::detail
