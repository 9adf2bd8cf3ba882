// SPDX-License-Identifier: Apache-2.0
// The mailbox: matches named frames to the receives posted for them. A frame whose receive is
// posted is delivered into it (copied, or reduced on arrival); one that comes first is kept as
// an early frame until its receive is posted, within a limit of bytes. The transport hands every
// data frame here, and knows nothing of collectives: a collective that wants frames before the
// mailbox looks (the express allreduce) registers as the claimer.
// Thread-safety: I/O context only; every method checks it in debug builds (KF_DCHECK_IO).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>

#include <boost/container/small_vector.hpp>

#include "common/scratch_pool.hpp"
#include "driver/driver.hpp"
#include "kf/common/error.hpp"
#include "mailbox/request.hpp"

namespace kf::detail {

/// Frames of at least this size that arrive before their receive get a pooled buffer.
inline constexpr std::size_t kPooledEarlyBytes = 64 * 1024;
/// The most the pool of such buffers keeps while idle.
inline constexpr std::size_t kEarlyPoolBytes = std::size_t{256} << 20;
/// Smaller early frames take blocks of at least this size from a pool of their own (at most 8
/// blocks of under 64 KiB): a small collective whose peer is a moment ahead gets its frame early
/// every time, and a fresh allocation for each cost more than the rest of its bookkeeping.
inline constexpr std::size_t kSmallEarlyBytes = 256;
/// What an early frame is charged against the limits beyond its payload and name: its share of
/// the bookkeeping, so that a stream of empty frames cannot hold memory without bound either.
inline constexpr std::size_t kEarlyFrameOverhead = 64;
/// The bytes an early frame is charged (Mailbox's limits).
constexpr std::size_t early_charge(std::size_t payload, std::size_t name) noexcept {
  return payload + name + kEarlyFrameOverhead;
}

/// The payload of a frame that arrived before its receive was posted: in a block of
/// Mailbox::early_pool_ (`bytes` of the block's capacity are used), or, for a quick early frame
/// (Mailbox::quick_early_), in `small`.
struct EarlyFrame {
  static constexpr std::size_t kSmallBytes = 64;
  ScratchPool::Block block;
  std::size_t bytes = 0;
  std::size_t charged = 0;  // early_charge of its payload and name
  alignas(16) std::array<std::byte, kSmallBytes> small;
  const std::byte* data() const noexcept { return block.data ? block.data.get() : small.data(); }
};

/// An early frame of tag 0 kept outside the mailbox (Mailbox::store, take_early).
struct QuickEarly {
  static constexpr std::size_t kMax = 8;         // kept at once; more go to the mailbox
  static constexpr std::size_t kNameBytes = 48;  // longer names go to the mailbox
  int peer = -1;
  std::uint64_t version = 0;
  std::size_t name_bytes = 0;
  std::array<char, kNameBytes> name_chars;
  EarlyFrame frame;
  std::string_view name() const noexcept { return {name_chars.data(), name_bytes}; }
};

/// Receives posted for one key, and frames that came before them. Almost always one entry on one
/// side only, or two posted receives (a lane's receive posted ahead behind its current one from
/// the same peer), and it lives for one transfer: kept inline, so a transfer allocates nothing.
struct Slot {
  boost::container::small_vector<std::shared_ptr<RecvReq>, 2> posted;
  boost::container::small_vector<EarlyFrame, 1> unexpected;

  bool empty() const noexcept { return posted.empty() && unexpected.empty(); }
  /// Removes the posted receives that are not being filled right now.
  void drop_idle() {
    posted.erase(
        std::remove_if(posted.begin(), posted.end(), [](const auto& r) { return !r->in_progress; }),
        posted.end());
  }
};

/// Which keys a failure covers: one peer's or every peer's, of versions below `below` or of
/// every version.
struct KeyMatch {
  int peer = -1;  // every peer
  std::uint64_t below = UINT64_MAX;
  template <typename Key>
  bool operator()(const Key& k) const noexcept {
    return (peer < 0 || k.peer == peer) && (below == UINT64_MAX || k.version < below);
  }
};

/// How a receive reduces its payload into its destination on arrival (RecvReq::reduce).
struct ReduceOnArrival {
  const std::byte* src = nullptr;
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
};

class Mailbox {
 public:
  /// Takes a data frame before the mailbox looks at it: true when it was taken; `conn` set to
  /// an error (with `why`) ends the frame's connection.
  using ClaimFn = bool (*)(void* self, const MailKeyView& key, std::span<const std::byte> payload,
                           std::error_code& conn, std::string& why);
  /// Fails the claims waiting for keys that `match` covers (fail_posted tells the claimer too).
  using FailClaimsFn = void (*)(void* self, const KeyMatch& match, std::error_code ec);

  /// Early frames are kept while they are charged (early_charge) no more than
  /// `max_unexpected_bytes` in all and `max_unexpected_bytes_per_peer` for any one sender.
  Mailbox(const Driver& driver, const asio::any_io_executor& ex, std::size_t max_unexpected_bytes,
          std::size_t max_unexpected_bytes_per_peer);

  /// The claimer, asked first while `claiming` is on (Mailbox::set_claiming).
  void set_claimer(ClaimFn claim, FailClaimsFn fail, void* self) noexcept {
    claim_ = claim;
    fail_claims_ = fail;
    claimer_ = self;
  }
  void set_claiming(bool on) noexcept { claiming_ = on; }

  // ---- frames, from the transport ----

  /// A data frame whose payload is wholly in memory: to the claimer, else into the first posted
  /// receive for its key, else kept as an early frame (a copy of `payload`, or `*owned` moved
  /// when given: `payload` is then its start, and the caller recycles the block when it was not
  /// kept). A frame of a version older than `current_version` that nobody waits for is dropped
  /// (`stale` is set). Returns an error that ends the connection (with `why`).
  std::error_code store(const MailKeyView& key, std::span<const std::byte> payload,
                        ScratchPool::Block* owned, std::uint64_t current_version, bool& stale,
                        std::string& why);
  /// A large frame read straight into its receive: the first receive posted for `key`, marked
  /// as being filled, or null when none is posted.
  std::shared_ptr<RecvReq> begin_fill(const MailKeyView& key);
  /// The end of begin_fill's receive: taken off the mailbox and completed with `ec`.
  void end_fill(const MailKeyView& key, const std::shared_ptr<RecvReq>& req, std::error_code ec);
  /// Whether one more early frame from `peer`, of `bytes` of payload and `name_bytes` of name,
  /// stays within the limits; if not, `why` says which.
  bool has_room(int peer, std::size_t bytes, std::size_t name_bytes, std::string& why) const;
  /// What early frames from `peer` are charged now (early_charge).
  std::size_t unexpected_bytes(int peer) const noexcept {
    const auto p = static_cast<std::size_t>(peer);
    return p < unexpected_by_peer_.size() ? unexpected_by_peer_[p] : 0;
  }
  /// A buffer for a frame that arrives before its receive, and its return once delivered: large
  /// ones are reused, so that they are not mapped afresh (and page-faulted) for every frame.
  ScratchPool::Block early_block(std::size_t bytes);
  void recycle(ScratchPool::Block b);

  // ---- receives, from the engine ----

  /// The frame for `key` that came before its receive, if any, delivered into `dst` (reduced
  /// with `reduce`): the shared completed receive, or one failed with protocol_error when its
  /// size is not `bytes`. Null when no such frame came.
  std::shared_ptr<RecvReq> take_early_into(const MailKeyView& key, std::byte* dst,
                                           std::size_t bytes, const ReduceOnArrival* reduce);
  /// Posts a receive for a frame that has not come; one that can never complete (`refusal`,
  /// the mesh's word on its peer and version) fails at once.
  std::shared_ptr<RecvReq> post(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                const ReduceOnArrival* reduce, std::error_code refusal);
  /// The frame for `key` that came before its receive, taken from quick_early_ or the slots.
  std::optional<EarlyFrame> take_early(const MailKeyView& key);
  /// Whether a frame for `key` came before its receive and is kept (take_early would take one).
  bool has_early(const MailKeyView& key) const;
  /// Takes a receive that is not being filled off the mailbox and completes it with `ec`.
  void cancel(const std::shared_ptr<RecvReq>& r, std::error_code ec);
  /// Fails with `ec` every posted receive whose key `match` covers and that is not being filled
  /// right now, drops the slots left empty, and has the claimer fail its matching claims.
  void fail_posted(const KeyMatch& match, std::error_code ec);
  /// Drops what is kept for versions older than `version` (a new cluster version took over).
  void drop_older(std::uint64_t version);

  /// Bytes of frames that came before their receive, since the start; any thread.
  std::uint64_t early_bytes() const noexcept {
    return early_bytes_.load(std::memory_order_relaxed);
  }
  /// Frames named `name` that come before their receive are counted (I/O thread; one name,
  /// a later call replaces it): watched_arrivals() changes whenever one came.
  void watch(std::string name) {
    KF_DCHECK_IO(driver_);
    watched_ = std::move(name);
  }
  /// Any thread.
  std::uint64_t watched_arrivals() const noexcept {
    return watched_arrivals_.load(std::memory_order_acquire);
  }

 private:
  using Slots = std::unordered_map<MailKey, Slot, MailKeyHash, MailKeyEq>;
  /// The slot of `key`, added (from spare_slots_ when there is one) if there is none.
  Slots::iterator slot_for(const MailKeyView& key);
  /// Adds the slot of `key`, which has none.
  Slots::iterator add_slot(const MailKeyView& key);
  /// Removes a slot that has become empty, keeping its node for add_slot.
  void drop_slot(Slots::iterator it);
  /// The pool that early frames of this size take their blocks from.
  ScratchPool& early_pool_for(std::size_t bytes) {
    return bytes >= kPooledEarlyBytes ? early_pool_ : small_early_pool_;
  }
  /// Keeps a frame that came before its receive.
  void keep_early(const MailKeyView& key, std::span<const std::byte> payload,
                  ScratchPool::Block* owned, Slots::iterator it);
  /// Takes an early frame of `peer`'s off the counts.
  void uncharge(int peer, std::size_t charged) noexcept {
    unexpected_bytes_ -= charged;
    unexpected_by_peer_[static_cast<std::size_t>(peer)] -= charged;
  }

  [[maybe_unused]] const Driver& driver_;  // for KF_DCHECK_IO, which release builds drop
  asio::any_io_executor ex_;
  std::size_t max_unexpected_bytes_;
  std::size_t max_unexpected_bytes_per_peer_;
  ClaimFn claim_ = nullptr;
  FailClaimsFn fail_claims_ = nullptr;
  void* claimer_ = nullptr;
  bool claiming_ = false;
  Slots slots_;
  // Emptied slots, kept as node handles for the next key (slot_for, drop_slot): with more
  // workers than cores most frames come before their receive, and each one needed a slot
  // allocated and freed.
  std::vector<Slots::node_type> spare_slots_;
  // Frames of tag 0 of up to EarlyFrame::kSmallBytes that came before their receive while no
  // slot was in use, oldest first: with more workers than cores nearly every small
  // collective's frame comes early, and a slot, a pooled block and hashing cost it about 900
  // instructions. Only while there are no slots, so that a key's frames stay in order: any
  // later one of the same key goes behind these (take_early looks here first).
  boost::container::small_vector<QuickEarly, 4> quick_early_;
  std::size_t unexpected_bytes_ = 0;             // charged by every early frame kept
  std::vector<std::size_t> unexpected_by_peer_;  // and by each peer's, by peer index
  ScratchPool early_pool_{kEarlyPoolBytes};      // blocks of at least kPooledEarlyBytes
  ScratchPool small_early_pool_;                 // smaller blocks (kSmallEarlyBytes and up)
  // The completed receive that take_early_into hands out for frames that came early, instead
  // of allocating one each. Never modified after construction.
  std::shared_ptr<RecvReq> received_;
  std::atomic<std::uint64_t> early_bytes_{0};
  std::string watched_;  // Mailbox::watch (I/O thread)
  std::atomic<std::uint64_t> watched_arrivals_{0};
};

}  // namespace kf::detail
