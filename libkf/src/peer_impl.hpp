// SPDX-License-Identifier: Apache-2.0
// Private state of kf::Peer. Everything below runs on the peer's single I/O thread (kf-io)
// unless a comment says otherwise, so it needs no locks; other threads reach it through
// asio::post / co_spawn. Asio lives only in this header and the .cpp files that include it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio.hpp>
#include <boost/container/small_vector.hpp>

#include "coll/exec/range_set.hpp"
#include "coll/plan/plan.hpp"
#include "common/clock.hpp"
#include "kf/common/error.hpp"
#include "kf/peer.hpp"
#include "transport/frame.hpp"
#include "transport/shm_ring.hpp"

namespace kf::detail {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using local_stream = asio::local::stream_protocol;
/// A connection's socket: TCP, or a Unix-domain socket to a worker on this host.
using Stream = asio::generic::stream_protocol::socket;
template <typename T>
using awaitable = asio::awaitable<T>;

struct OpState;

/// A step's few transfers: kept inline, so that running a small collective allocates nothing.
template <typename T>
using StepVec = boost::container::small_vector<T, 4>;

/// Who runs the I/O context. Normally the I/O thread (kf-io); but a user thread that waits on a
/// collective takes over and runs it itself until its collective is done, so the reply that
/// completes it is read by the thread that needs it, with no hand-off (a thread wake-up costs
/// about as much as a loopback hop). Exactly one thread runs the context at a time: the one
/// holding `mu`, so handlers still need no locks of their own.
struct Driver {
  explicit Driver(asio::io_context& c) : ioc(&c) {}
  std::mutex mu;                  // held by whichever thread runs the context
  std::atomic<int> wanted{0};     // user threads in drive_until(); the I/O thread parks meanwhile
  std::atomic<bool> closed{false};  // the peer is shutting down: nobody else may drive
  asio::io_context* ioc;
  // Set just before the peer stops the context. The polling loops look at this and not at
  // io_context::stopped(), which takes the scheduler's mutex (a lock and an unlock per look:
  // about 60 instructions, on every poll of a waiting thread).
  std::atomic<bool> stopping{false};
  bool stopped() const noexcept { return stopping.load(std::memory_order_relaxed); }
  // How long a thread running the context polls before it blocks in epoll, in microseconds
  // (PeerOptions::spin, resolved for the current cluster). Zero also turns drive_until off.
  std::atomic<std::int64_t> spin_us{0};
  std::chrono::microseconds spin() const noexcept {
    return std::chrono::microseconds(spin_us.load(std::memory_order_relaxed));
  }
  // More workers on this host than cores: poll with sched_yield() instead of a pause.
  std::atomic<bool> yield{false};
  /// One poll's pause: a CPU pause, or sched_yield() when crowded.
  void relax() const noexcept;

  // The peer's shared-memory rings, which no epoll reports: whoever runs the context polls them
  // with the context, and announces in them when it is about to sleep (PeerImpl::poll_rings,
  // PeerImpl::rings_asleep). Set once before the I/O thread starts.
  std::function<std::size_t()> poll_rings;
  std::function<bool(bool)> rings_asleep;
  // The collective lanes whose events were set (PeerImpl::run_woken): no handler runs them,
  // so whoever runs the context runs them after each handler or ring record.
  std::function<std::size_t()> run_woken;
  // Whether this peer reads any shared-memory ring (PeerImpl::ring_readers_ is not empty);
  // touched only under `mu`.
  bool reads_rings = false;
  // Something was posted to the context that should run soon (a lane that stopped to let it
  // run: PeerImpl::advance): the next polling round polls the context even where it would
  // skip it. Touched only under `mu`.
  bool context_due = false;
  /// One round of polling: ready handlers, ring records and woken lanes; the number run.
  /// `skip_context` leaves the context out (its epoll_wait is a system call when idle).
  std::size_t poll_once(bool skip_context = false) {
    std::size_t n = 0;
    if (!skip_context) {
      context_due = false;
      n = ioc->poll_one();
    }
    if (poll_rings) n += poll_rings();
    if (run_woken) n += run_woken();
    return n;
  }
  /// Sleeps in epoll until one handler ran, unless a ring has a record waiting.
  void block_once() {
    if (rings_asleep && !rings_asleep(true)) return;
    ioc->run_one();
    if (rings_asleep) rings_asleep(false);
  }

  /// Runs the context on the calling thread until `s` is ready, or returns early when the I/O
  /// thread cannot hand it over promptly (another user thread drives) or the peer is closing;
  /// the caller then waits on `s` as usual.
  void drive_until(const OpState& s);
  /// Runs the handlers that are ready now (a collective just submitted: its first sends) on the
  /// calling thread, when nobody else runs the context; otherwise leaves them to whoever does.
  void run_ready();
  /// Runs `f` (a collective's start) on the calling thread when nobody else runs the context,
  /// followed by what it made ready (run_ready); otherwise posts it to whoever does.
  /// `f` returns whether it posted handlers to the context; if not, only the lanes it woke run.
  template <typename F>
  void start(F&& f) {
    bool ran = false;
    if (spin().count() > 0 && !closed.load(std::memory_order_relaxed) && mu.try_lock()) {
      std::lock_guard<std::mutex> held(mu, std::adopt_lock);
      if (!stopped()) {
        if (f()) {
          run_ready_locked();
        } else if (run_woken) {
          run_woken();
        }
        ran = true;
      }
    }
    if (!ran) asio::post(*ioc, std::forward<F>(f));
  }
  /// run_ready's work, by a thread that holds `mu`.
  void run_ready_locked();

  // The lease: a waiter that drove leaves the context to user threads for one polling window
  // after it is done. The I/O thread stays parked meanwhile (without holding `mu`), so the next
  // collective's submit and wait take the context at once: no wake-up of the I/O thread and no
  // hand-over back and forth for each collective of a tight loop. After the window the I/O
  // thread takes over again (background progress while the user computes).
  std::atomic<Clock::rep> lease_until{0};
  /// The I/O thread: whether to stay parked, and until when at most before it looks again.
  bool leased(Clock::time_point now, Clock::time_point& recheck) const noexcept;
  std::mutex park_mu;  // the I/O thread's sleep while parked; notified only on close
  std::condition_variable park_cv;
  void wake_io() {
    std::lock_guard<std::mutex> lk(park_mu);
    park_cv.notify_all();
  }
};

/// Where waiters that could not drive the I/O sleep: a few mutexes and condition variables
/// shared by all operations, picked by the operation's address. A completion wakes every sleeper
/// of its stripe, and each looks again at its own operation. (A mutex and a condition variable
/// in every OpState were built and torn down for every collective, though nearly every wait
/// ends without sleeping.)
struct SleepStripe {
  std::mutex mu;
  std::condition_variable cv;
};
SleepStripe& sleep_stripe(const void* op) noexcept;

/// Completion state shared by a Handle (any thread) and the I/O thread.
///
/// Most waits end without sleeping (the waiter ran the I/O itself: Driver), so completing takes
/// no lock unless a waiter said it sleeps: `ready` and `sleepers` are a store-then-load pair on
/// each side (sequentially consistent), so either the completer sees the sleeper and wakes it
/// under its stripe's mutex, or the sleeper sees `ready` before it waits. (Locking for every
/// completion cost about 70 instructions of a 4-byte collective's 2500.)
struct OpState {
  std::atomic<bool> claimed{false};  // complete() was called: the first call wins
  std::atomic<int> sleepers{0};      // waiters that sleep, or are about to
  std::atomic<bool> ready{false};
  std::error_code ec;                // written once, before `ready`
  std::string what;                  // written once, before `ready`
  std::shared_ptr<Driver> driver;  // set for collectives: a waiter may run the I/O itself

  /// The first call wins: a waiter that saw `ready` reads `ec` and `what`.
  void complete(std::error_code e, std::string w) {
    if (claimed.exchange(true, std::memory_order_acq_rel)) return;
    ec = e;
    what = std::move(w);
    ready.store(true, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      SleepStripe& st = sleep_stripe(this);
      std::lock_guard<std::mutex> lk(st.mu);
      st.cv.notify_all();
    }
  }
  /// Sleeps until complete() has run.
  void sleep_until_ready() {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    SleepStripe& st = sleep_stripe(this);
    std::unique_lock<std::mutex> lk(st.mu);
    st.cv.wait(lk, [&] { return ready.load(std::memory_order_seq_cst); });
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
};

struct LaneRun;
/// Called when an event a lane waits on is set (defined below, after PeerImpl).
void wake(LaneRun& lane);

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
  LaneRun* waiter = nullptr;
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
inline void deliver_to(std::byte* dst, bool reduce, const std::byte* src, DType dtype,
                       ReduceOp op, const std::byte* data, std::size_t n) {
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

/// Reusable buffers, so that large collectives do not page-fault fresh memory on every call: at
/// most 8 blocks and `max_bytes` are kept. I/O thread only.
class ScratchPool {
 public:
  explicit ScratchPool(std::size_t max_bytes = SIZE_MAX) : max_bytes_(max_bytes) {}
  struct Block {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
  };
  /// The smallest kept block of at least `bytes`, or a new one (not zeroed).
  Block acquire(std::size_t bytes) {
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes)) {
        best = i;
      }
    }
    if (best == free_.size()) {
      return Block{std::make_unique_for_overwrite<std::byte[]>(bytes), bytes};
    }
    Block b = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    held_ -= b.bytes;
    return b;
  }
  void release(Block b) {
    if (!b.data || free_.size() >= 8 || b.bytes > max_bytes_ - held_) return;
    held_ += b.bytes;
    free_.push_back(std::move(b));
  }

 private:
  std::vector<Block> free_;
  std::size_t held_ = 0;  // bytes in free_
  std::size_t max_bytes_;
};

/// The plans of the last few distinct requests: a training job repeats the same few collectives
/// (the same buckets, the same control collective) every step, and building a plan costs
/// allocations and more time than a small collective's transfer. I/O thread only.
class PlanCache {
 public:
  std::shared_ptr<const coll::Plan> get(const coll::PlanRequest& r) {
    for (auto& e : entries_) {
      if (same(e.req, r)) return e.plan;
    }
    auto plan = std::make_shared<const coll::Plan>(coll::make_plan(r));  // may throw
    if (entries_.size() < kEntries) {
      entries_.push_back({r, plan});
    } else {
      entries_[next_] = {r, plan};
      next_ = (next_ + 1) % kEntries;
    }
    return plan;
  }

 private:
  static constexpr std::size_t kEntries = 32;
  static bool same(const coll::PlanRequest& a, const coll::PlanRequest& b) noexcept {
    return a.op == b.op && a.algorithm == b.algorithm && a.rank == b.rank && a.size == b.size &&
           a.count == b.count && a.root == b.root && a.lanes == b.lanes &&
           a.max_xfer_count == b.max_xfer_count && a.rd_max_count == b.rd_max_count;
  }
  struct Entry {
    coll::PlanRequest req;
    std::shared_ptr<const coll::Plan> plan;
  };
  std::vector<Entry> entries_;
  std::size_t next_ = 0;  // the entry replaced next once full (oldest first)
};

/// Frames of at least this size that arrive before their receive get a pooled buffer.
inline constexpr std::size_t kPooledEarlyBytes = 64 * 1024;
/// The most the pool of such buffers keeps while idle.
inline constexpr std::size_t kEarlyPoolBytes = std::size_t{256} << 20;
/// Smaller early frames take blocks of at least this size from a pool of their own (at most 8
/// blocks of under 64 KiB): a small collective whose peer is a moment ahead gets its frame early
/// every time, and a fresh allocation for each cost more than the rest of its bookkeeping.
inline constexpr std::size_t kSmallEarlyBytes = 256;

/// The payload of a frame that arrived before its receive was posted: in a block of
/// PeerImpl::early_pool_ (`bytes` of the block's capacity are used), or, for a quick early frame
/// (PeerImpl::quick_early_), in `small`.
struct EarlyFrame {
  static constexpr std::size_t kSmallBytes = 64;
  ScratchPool::Block block;
  std::size_t bytes = 0;
  alignas(16) std::array<std::byte, kSmallBytes> small;
  const std::byte* data() const noexcept { return block.data ? block.data.get() : small.data(); }
};

/// An early frame of tag 0 kept outside the mailbox (PeerImpl::store_frame, take_early).
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
/// side only, and it lives for one transfer: kept inline, so a transfer allocates nothing here.
struct Slot {
  boost::container::small_vector<std::shared_ptr<RecvReq>, 1> posted;
  boost::container::small_vector<EarlyFrame, 1> unexpected;

  bool empty() const noexcept { return posted.empty() && unexpected.empty(); }
  /// Removes the posted receives that are not being filled right now.
  void drop_idle() {
    posted.erase(std::remove_if(posted.begin(), posted.end(),
                                [](const auto& r) { return !r->in_progress; }),
                 posted.end());
  }
};

/// Waiting receives and early frames, by key.
using Mailbox = std::unordered_map<MailKey, Slot, MailKeyHash, MailKeyEq>;

struct Outgoing {
  Outgoing(const asio::any_io_executor& ex, int p) : sock(ex), signal(ex), peer(p) {}
  Stream sock;
  asio::steady_timer signal;  // cancelled when the queue gains an entry
  std::deque<std::shared_ptr<SendReq>> queue;
  int peer;
  bool closed = false;
  bool connected = false;  // dialled and through the handshake
  bool writing = false;    // write_frame is writing to `sock` (a heartbeat counts)
  bool local = false;  // connected over the same-host (Unix-domain) socket
  // Large payloads are left in place for the receiver to copy (transport::kFlagRemote); off
  // once the receiver has answered that it cannot.
  bool single_copy = false;
  // Small data frames go into this shared-memory ring while nothing waits in `queue`
  // (same-host connections the receiver accepted it on; PeerImpl::post_send).
  std::unique_ptr<transport::ShmRing> ring;
  // Frames written into the socket since the ring was set up, heartbeats not counted: each
  // ring record carries the count, so the receiver keeps the connection's order.
  std::uint64_t socket_frames = 0;
};

struct Incoming {
  explicit Incoming(Stream s) : sock(std::move(s)), buf(kBufBytes) {}
  static constexpr std::size_t kBufBytes = 64 * 1024;
  static constexpr std::size_t kReduceChunk = 256 * 1024;  // streamed reductions, cache-sized
  std::vector<std::byte> chunk;  // allocated on the first streamed reduction
  Stream sock;
  int peer = -1;
  // Read-ahead buffer: small frames (header, name, payload) usually arrive in one segment and
  // are parsed from here with one system call; large payloads bypass it.
  std::vector<std::byte> buf;
  std::size_t begin = 0, end = 0;
  // TCP: the read-ahead buffer is filled by peeking, and the bytes are dropped from the socket
  // only before the next read (PeerImpl::read_exact). Taking the last bytes out of a TCP
  // socket has Linux send the pending ACK from inside that call (a segment through the whole
  // stack, and the peer's socket taking it in: about 1 us here); a peek leaves it for the drop,
  // which comes after the frames were delivered and the waiter saw its collective complete.
  bool peek = false;
  std::size_t peeked = 0;  // bytes in `buf` still in the socket
  // The dialer's process on a same-host connection (SO_PEERCRED), whose memory single-copy
  // frames are read from; 0 over TCP.
  pid_t pid = 0;
  // Whether single-copy frames are copied: false for a dialer running as another user, and
  // once the kernel refused to copy from `pid`.
  bool single_copy = true;
  // The dialer's shared-memory ring, once it offered one and this side mapped it.
  std::unique_ptr<transport::ShmRing> ring;
  // Socket frames taken (heartbeats not counted) since the ring was set up; a ring record
  // is taken only once this reaches its socket_before.
  std::uint64_t socket_frames = 0;
  // Why the connection was closed from outside its coroutine (a bad ring record).
  std::string closed_why;
};

/// Where a data frame's payload comes from: the connection, or (single-copy) the sender's
/// memory at `remote_addr`, of which `at` bytes were taken already.
struct PayloadSource {
  bool remote = false;
  std::uint64_t remote_addr = 0;
  std::size_t at = 0;
};

/// What this process knows of one remote worker, by endpoint; never removed, so indices are
/// stable across cluster versions.
struct PeerState {
  Endpoint ep;
  std::string key;  // ep.str()
  Clock::time_point last_rx{}, last_tx{};
  std::shared_ptr<Outgoing> out;
  std::vector<std::shared_ptr<Incoming>> in;
  bool lost = false;
  bool departed = false;
  bool no_local = false;  // its same-host socket failed the handshake: use TCP
  // The newest cluster version this peer's frames carried. Frames on a connection arrive in
  // order, so once a peer speaks version W it will never send anything of an older version: a
  // receive from it of an older version can never complete.
  std::uint64_t max_version = 0;
};

struct CollCtx;
class PeerImpl;

/// One lane of a running collective: a state machine, not a coroutine, advanced by whichever
/// thread runs the context (PeerImpl::advance). It posts a step's transfers, waits for them by
/// registering with one unfinished event at a time (Event::waiter; a set event puts the lane on
/// PeerImpl::woken_), and reduces what came. A small collective thus costs no coroutine frame,
/// no resumption through the scheduler, and no timer per wait: deadlines are kept by one timer
/// for all lanes (PeerImpl::check_deadlines).
struct LaneRun {
  PeerImpl* peer = nullptr;
  CollCtx* coll = nullptr;
  const coll::Lane* lane = nullptr;
  std::uint32_t tag = 0;
  std::size_t step = 0;   // the step being run
  bool posted = false;    // the step's transfers are posted
  ScratchPool::Block scratch;
  const coll::Xfer* stream = nullptr;  // the step's receive reduced on arrival, if any
  // How far the step's reduction got (PeerImpl::reduce_step): the transfer, the elements of it
  // reduced, and where in scratch that transfer's data starts.
  std::size_t reduce_x = 0, reduce_done = 0, reduce_sc = 0;
  StepVec<std::shared_ptr<SendReq>> sends;
  StepVec<std::shared_ptr<RecvReq>> recvs;
  StepVec<int> send_peer, recv_peer;
  // While waiting: the event, the peer it depends on, and when the wait times out unless
  // that peer was heard from meanwhile.
  Event* waiting_on = nullptr;
  int wait_peer = -1;
  Clock::time_point deadline{};

  LaneRun() = default;
  // Moved only while its collective sizes its lanes, before any runs.
  LaneRun(LaneRun&&) = default;
  LaneRun& operator=(LaneRun&&) = default;
  ~LaneRun() { stop_waiting(); }
  /// Leaves the event it waits on, if any, without being woken by it.
  void stop_waiting() noexcept {
    if (waiting_on) waiting_on->waiter = nullptr;
    waiting_on = nullptr;
  }
};

/// One collective in flight.
struct CollCtx {
  CollOp op = CollOp::allreduce;
  std::string name;
  Algorithm algorithm = Algorithm::auto_select;
  CollOptions opts;
  Buffer send, recv;
  bool* agreed = nullptr;
  std::uint64_t version = 0;
  // Out-of-place allreduce and reduce-scatter: the work buffer is filled lazily from `lazy_src`
  // (the send buffer) as the plan first touches each range, instead of one up-front copy.
  const std::byte* lazy_src = nullptr;
  RangeSet filled;
  std::shared_ptr<const std::vector<int>> rank_to_peer;  // the submitting version's, shared
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{};
  std::shared_ptr<OpState> state;

  // ---- while it runs (PeerImpl::start_collective to PeerImpl::finish_collective) ----
  std::shared_ptr<const coll::Plan> plan;
  std::size_t count = 0;                 // elements of the plan's work buffer per rank block
  std::byte* work = nullptr;             // the plan's work buffer
  ScratchPool::Block pooled;             // the work buffer when the caller's cannot serve
  std::array<std::byte, 64> digest{};    // consensus: the work buffer
  std::byte barrier_byte{1};             // barrier: the work buffer
  boost::container::small_vector<LaneRun, 1> lanes;  // sized once: lanes do not move
  std::size_t lanes_left = 0;
  std::error_code first;  // the first lane failure, and its reason
  std::string why;
  std::size_t run_index = 0;  // in PeerImpl::runs_

  // ---- express: a tiny allreduce run by recursive doubling without plan, lanes or requests
  // (PeerImpl::start_express). The same frames as the plan's, so workers that run the same
  // collective either way interoperate. ----
  int x_dist = 0;            // the current round's distance: the partner is rank ^ x_dist
  int x_peer = -1;           // the partner's peer index while waiting for its frame
  bool x_waiting = false;    // in PeerImpl::express_waiting_
  Clock::time_point x_deadline{};

  // User-provided, so that make_shared's value-initialisation runs the member initialisers only
  // instead of first zeroing all ~900 bytes (most of them the inline lane's storage).
  CollCtx() noexcept {}
  CollCtx(const CollCtx&) = delete;
  CollCtx& operator=(const CollCtx&) = delete;
  /// The last owner is the collective's coroutine. If that is destroyed unfinished (the peer was
  /// destroyed with the collective in flight, and its context with it), the waiter still learns
  /// that the buffers are free again.
  ~CollCtx() {
    if (state && !state->ready.load(std::memory_order_acquire)) {
      state->complete(make_error_code(errc::closed),
                      std::string(to_string(op)) + " '" + name +
                          "': the peer was destroyed before the collective finished");
    }
  }
};

/// The abstract Unix-domain socket name of the worker at `ep` ("\0kf/HOST:PORT"): unique on a
/// host because the TCP port is, and gone when the process is.
std::string local_socket_name(const Endpoint& ep);

class PeerImpl {
 public:
  explicit PeerImpl(PeerOptions opts);
  ~PeerImpl();

  // ---- called from user threads ----
  Endpoint endpoint() const { return self_; }
  void start(const Cluster& c);
  void update(const Cluster& c);
  std::vector<Endpoint> lost_peers();
  Handle submit(std::shared_ptr<CollCtx> ctx);
  Handle invite(const Endpoint& to, std::string payload);
  std::optional<Invitation> wait_invitation(std::chrono::milliseconds timeout);
  Algorithm resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept;

  // Immutable after start() (set before any collective is submitted).
  Cluster cluster_;
  int rank_ = 0;
  // Every worker on this host and the default transport: `auto` prices messages by
  // coll::kSameHostLink instead of the TCP-sized defaults.
  bool same_host_link_ = false;
  std::shared_ptr<const std::vector<int>> rank_to_peer_;

  // ---- I/O thread only ----
  Cluster io_cluster_;  // the I/O thread's copy of the current cluster
  int io_rank_ = 0;
  asio::any_io_executor ex() { return ioc_.get_executor(); }
  int peer_index(const Endpoint& ep);
  /// Accepts connections on `acceptor` (TCP or Unix-domain) and serves each.
  template <typename Acceptor>
  awaitable<void> accept_loop(Acceptor& acceptor);
  /// `from` names the remote end in logs until the handshake tells who it is.
  awaitable<void> serve_incoming(std::shared_ptr<Incoming> in, std::string from);
  /// Whether connections to `ep` try the Unix-domain socket first (not Transport::tcp).
  bool same_host(const Endpoint& ep) const;
  /// Whether `ep` is on this host: the same host string, or both loopback addresses. Any thread.
  bool on_this_host(const Endpoint& ep) const;
  /// Connects out.sock to the peer: its Unix-domain socket when it is on this host, else TCP.
  awaitable<boost::system::error_code> connect(Outgoing& out, const Endpoint& ep);
  awaitable<void> run_outgoing(std::shared_ptr<Outgoing> out);
  awaitable<std::error_code> dial(Outgoing& out);
  awaitable<std::error_code> read_exact(Incoming& in, std::byte* dst, std::size_t n);
  /// The next n payload bytes of the frame being read, into dst (from the socket, or copied
  /// from the sender's memory for a single-copy frame).
  awaitable<std::error_code> read_payload(Incoming& in, PayloadSource& src, std::byte* dst,
                                          std::size_t n, std::string& why);
  /// Reads the frame's payload into a posted receive or, when none is posted, into the
  /// unexpected-message buffer. Returns an error that ends the connection.
  awaitable<std::error_code> receive_data(Incoming& in, int peer, const transport::FrameHeader& h,
                                          const std::string& name, PayloadSource& src,
                                          std::string& why);
  awaitable<std::error_code> write_frame(Outgoing& out, SendReq& req);
  /// A small data frame to a connection whose writer is idle: written straight into the socket
  /// without blocking, saving the hand-off to the writer coroutine. Returns the bytes of the
  /// frame (header, name, payload) that went; the caller queues the rest.
  std::size_t write_now(Outgoing& out, const transport::HeaderBytes& header,
                        std::string_view name, const std::byte* data, std::size_t bytes);

  // ---- shared-memory rings (transport/tcp/connections.cpp) ----
  /// Dialer: creates a ring and offers it over the fresh connection `reader` (still in the
  /// handshake); sets out.ring if the acceptor took it.
  awaitable<std::error_code> offer_ring(Outgoing& out, Incoming& reader, std::string& why);
  /// Acceptor: maps the offered ring and answers; an error ends the connection.
  awaitable<std::error_code> accept_ring(const std::shared_ptr<Incoming>& in,
                                         const std::vector<std::byte>& name, std::string& why);
  /// Takes every record of `in`'s ring whose turn has come and returns how many. A malformed
  /// record closes the connection, with the reason in in.closed_why.
  std::size_t drain_ring(Incoming& in);
  /// Drains every ring; returns the number of records taken.
  std::size_t poll_rings();
  /// asleep: tells every ring's writer that this side is about to sleep, and returns false
  /// (after taking the flag back) if a ring has a record after all. !asleep: awake again.
  bool rings_asleep(bool asleep);
  /// A data frame whose payload is wholly in memory: into the first posted receive for its key
  /// or, when none is posted, into the unexpected-message buffer (a copy of `payload`, or
  /// `owned` moved when given; `payload` is then its start, and the caller recycles it when it
  /// was not kept). Returns an error that ends the connection.
  std::error_code store_frame(int peer, const MailKeyView& key, std::span<const std::byte> payload,
                              ScratchPool::Block* owned, std::string& why);
  /// A buffer for a frame that arrives before its receive, and its return once delivered: large
  /// ones are reused, so that they are not mapped afresh (and page-faulted) for every frame.
  ScratchPool::Block early_block(std::size_t bytes);
  void recycle(ScratchPool::Block b);
  /// The pool that early frames of this size take their blocks from.
  ScratchPool& early_pool_for(std::size_t bytes) {
    return bytes >= kPooledEarlyBytes ? early_pool_ : small_early_pool_;
  }

  /// Sends a frame. A data frame that went whole into a shared-memory ring or the socket at once
  /// is complete and gets `sent_`, shared by all such sends: callers only look at a request's
  /// event. With `copy_if_queued`, a frame that is not sent at once is sent from a copy of
  /// `data`, which the caller may then change (otherwise `data` must stay as it is until the
  /// request completes).
  std::shared_ptr<SendReq> post_send(int peer, const transport::FrameHeader& h,
                                     std::string_view name, const std::byte* data,
                                     bool copy_if_queued = false);
  std::shared_ptr<SendReq> post_control(int peer, transport::FrameType t,
                                        std::vector<std::byte> payload);
  /// How a receive reduces its payload into dst on arrival (RecvReq::reduce).
  struct ReduceOnArrival {
    const std::byte* src = nullptr;
    DType dtype = DType::u8;
    ReduceOp op = ReduceOp::sum;
  };
  /// Posts a receive; with `reduce` the payload is reduced into dst on arrival instead of
  /// copied. One whose frame came before it is complete at once and gets `received_`, shared
  /// by all such receives.
  std::shared_ptr<RecvReq> post_recv(const MailKeyView& key, std::byte* dst, std::size_t bytes,
                                     const ReduceOnArrival* reduce = nullptr);
  /// Why a receive from `peer` of `version` can never complete (the peer is gone, the version
  /// broken, or the peer has moved past it), or no error.
  std::error_code receive_refusal(int peer, std::uint64_t version) const;
  /// The frame for `key` that came before its receive, taken from quick_early_ or the mailbox,
  /// if any.
  std::optional<EarlyFrame> take_early(const MailKeyView& key);
  /// The slot of `key`, added (from spare_slots_ when there is one) if there is none.
  Mailbox::iterator slot_for(const MailKeyView& key);
  /// Adds the slot of `key`, which has none.
  Mailbox::iterator add_slot(const MailKeyView& key);
  /// Removes a slot that has become empty, keeping its node for add_slot.
  void drop_slot(Mailbox::iterator it);
  void cancel(const std::shared_ptr<SendReq>& r, std::error_code ec);
  void cancel(const std::shared_ptr<RecvReq>& r, std::error_code ec);
  awaitable<std::error_code> wait_progress(Event& ev, int peer, std::chrono::milliseconds timeout);
  void force_close(int peer);

  void mark_lost(int peer, std::error_code ec, const std::string& why);
  void mark_departed(int peer);
  /// Records that `peer` sent a frame of `version`; fails its receives of older versions.
  void note_version(int peer, std::uint64_t version);
  /// Fails with `ec` every posted receive whose key satisfies `match` and that is not being
  /// filled right now, and drops the mailbox slots left empty.
  template <typename Match>
  void fail_receives(Match match, std::error_code ec) {
    for (auto it = mailbox_.begin(); it != mailbox_.end();) {
      if (match(it->first) && !it->second.posted.empty()) {
        for (auto& r : it->second.posted) {
          if (!r->in_progress) r->ev.set(ec);
        }
        it->second.drop_idle();
        if (it->second.empty()) {
          it = mailbox_.erase(it);
          continue;
        }
      }
      ++it;
    }
    fail_express_if(match, ec);
  }
  void break_version(std::error_code ec, const std::string& why);

  // ---- the collective engine (coll/exec/executor.cpp) ----
  /// Prepares the work buffer and plan of a submitted collective and runs its lanes as far as
  /// they go without waiting; the rest happens as their events are set. Runs on whichever
  /// thread holds the context (the submitting one, when it is free).
  void start_collective(std::shared_ptr<CollCtx> ctx);
  /// start_collective's first part: the work buffer, the plan and the lanes; completes the
  /// collective itself when it fails or has nothing to do.
  void prepare_collective(const std::shared_ptr<CollCtx>& ctx);
  /// Runs a lane until it must wait, fails, or finishes, or has reduced kReduceSliceBytes: then
  /// the rest of it is posted to the context, after whatever else is ready there.
  void advance(LaneRun& l);
  /// Posts the current step's transfers.
  void post_step(LaneRun& l);
  /// Reduces what the current step received, in plan order, taking the bytes it reduces from
  /// `budget`; returns false when the budget ran out first (LaneRun::reduce_x and reduce_done
  /// say where it stopped).
  bool reduce_step(LaneRun& l, std::size_t& budget);
  /// Registers the lane as the waiter of `ev` (a transfer with `peer`), with a deadline.
  void wait_for(LaneRun& l, Event& ev, int peer);
  /// A lane failed (it stops waiting): its transfers are abandoned (a coroutine), then it
  /// counts as finished.
  void fail_lane(LaneRun& l, std::error_code ec, std::string why);
  /// "receiving from PEER: why" (or "sending to"), a failed transfer's reason.
  std::string transfer_failure(bool recv, int peer, std::error_code ec) const;
  /// Fails the lane for its transfer with `peer` (a receive or a send).
  void fail_transfer(LaneRun& l, bool recv, int peer, std::error_code ec);
  void lane_finished(LaneRun& l, std::error_code ec, std::string why);
  /// Completes the collective once its last lane finished.
  void finish_collective(CollCtx& c);
  /// Whether a collective runs as an express allreduce (CollCtx::x_*): an allreduce of at most
  /// PeerOptions::express_bytes, or a barrier, by recursive doubling over a power-of-two number
  /// of workers.
  bool express_eligible(const CollCtx& c) const noexcept;
  /// Starts an eligible collective (its context in `ctx`) as an express allreduce.
  void start_express(const std::shared_ptr<CollCtx>& ctx);
  /// Runs the express allreduce's rounds until it waits for a frame, fails or finishes (then
  /// `c` may be gone).
  void express_step(CollCtx& c);
  /// A frame for a waiting express allreduce: reduced into its work buffer, and the collective
  /// goes on. Returns false when no express allreduce waits for `key`. `conn` is set to
  /// protocol_error (with `why`) when the frame's size is wrong, which ends the connection.
  bool express_take(const MailKeyView& key, std::span<const std::byte> payload,
                    std::error_code& conn, std::string& why);
  /// Fails the express allreduce `c` (then it is gone).
  void fail_express(CollCtx& c, std::error_code ec, std::string why);
  /// Fails with `ec` the waiting express allreduces whose awaited frame's key (peer, version)
  /// satisfies `match`.
  template <typename Match>
  void fail_express_if(Match match, std::error_code ec) {
    if (express_waiting_.empty()) return;
    StepVec<std::shared_ptr<CollCtx>> hit;
    for (CollCtx* c : express_waiting_) {
      if (match(MailKeyView{c->x_peer, c->version, 0, c->name})) hit.push_back(runs_[c->run_index]);
    }
    for (const auto& c : hit) {
      if (c->x_waiting) fail_express(*c, ec, transfer_failure(true, c->x_peer, ec));
    }
  }
  /// Advances the lanes whose events were set; returns how many ran.
  std::size_t run_woken();
  /// Fails the waits whose deadline passed with no word from their peer; re-arms the timer.
  void check_deadlines();
  /// Makes the deadline timer fire by `t` at the latest.
  void arm_deadline(Clock::time_point t);
  /// Cancels a failed step's transfers and waits until none of them touches a buffer.
  awaitable<void> abandon_step(CollCtx& ctx, const StepVec<std::shared_ptr<SendReq>>& sends,
                               const StepVec<int>& send_peer,
                               const StepVec<std::shared_ptr<RecvReq>>& recvs,
                               const StepVec<int>& recv_peer, std::error_code result);
  awaitable<void> shutdown();
  awaitable<void> watchdog();
  void io_loop();
  /// From a user thread: runs the coroutine function `f` on the I/O context and returns what it
  /// returns. Started here when the I/O thread is parked on a waiter's lease (Driver::run_ready).
  template <typename F>
  auto on_io(F&& f) {
    auto done = asio::co_spawn(ioc_, std::forward<F>(f), asio::use_future);
    driver_->run_ready();
    return done.get();
  }


  PeerOptions opts_;
  std::atomic<Algorithm> default_algorithm_;  // the job's default, changeable at run time
  asio::io_context ioc_{1};
  std::shared_ptr<Driver> driver_;
  tcp::acceptor acceptor_;
  // Unix-domain listener of the same-host transport, in the abstract namespace (nothing on
  // disk to clean up), named after the TCP endpoint: local_socket_name(self_).
  local_stream::acceptor local_acceptor_;
  Endpoint self_;
  std::string identity_;
  std::thread io_thread_;

  std::vector<PeerState> peers_;
  std::unordered_map<std::string, int> peer_by_key_;
  Mailbox mailbox_;
  // Emptied slots, kept as node handles for the next key (slot_for, drop_slot): with more
  // workers than cores most frames come before their receive, and each one needed a slot
  // allocated and freed.
  std::vector<Mailbox::node_type> spare_slots_;
  // Frames of tag 0 of up to EarlyFrame::kSmallBytes that came before their receive while the
  // mailbox was empty, oldest first: with more workers than cores nearly every small collective's
  // frame comes early, and the mailbox's slot, pooled block and hashing cost it about 900
  // instructions. Only while the mailbox is empty, so that a key's frames stay in order: any
  // later one of the same key goes behind these (take_early looks here first).
  boost::container::small_vector<QuickEarly, 4> quick_early_;
  std::vector<std::shared_ptr<Incoming>> ring_readers_;  // connections with a ring to read
  std::size_t unexpected_bytes_ = 0;
  std::error_code broken_;
  std::string broken_why_;
  bool stopping_ = false;
  ScratchPool scratch_;
  PlanCache plans_;
  // Collectives running (owned here until finished; their lanes point into them), lanes whose
  // event was set and that wait to be advanced, and the one timer for all lanes' deadlines.
  std::vector<std::shared_ptr<CollCtx>> runs_;
  // The completed send and receive that post_send and post_recv hand out for transfers done at
  // once (a ring write, a frame that came early), instead of allocating one each. Never
  // modified after construction.
  std::shared_ptr<SendReq> sent_;
  std::shared_ptr<RecvReq> received_;
  std::vector<LaneRun*> woken_;
  // Express allreduces (in runs_) waiting for a frame: store_frame offers frames to them first.
  std::vector<CollCtx*> express_waiting_;
  /// Takes `c` off express_waiting_ (it waits no more).
  void express_done_waiting(CollCtx& c) {
    c.x_waiting = false;
    std::erase(express_waiting_, &c);
  }
  // Counts what this code posts to the context (a writer to wake, a coroutine to start): a
  // collective's start that posted nothing needs no poll of the context after it, which with
  // nothing ready would be an epoll_wait system call on the submitting thread.
  std::uint64_t handlers_posted_ = 0;
  asio::steady_timer deadline_timer_{ioc_};
  Clock::time_point deadline_due_ = Clock::time_point::max();  // when it is armed for
  ScratchPool early_pool_{kEarlyPoolBytes};  // blocks of at least kPooledEarlyBytes
  ScratchPool small_early_pool_;             // smaller blocks (kSmallEarlyBytes and up)
  // Written by the I/O thread, read by Peer::transport_stats from any thread.
  struct Counters {
    std::atomic<std::uint64_t> tcp_bytes{0}, socket_bytes{0}, single_copy_bytes{0},
        single_copy_refused{0}, shm_bytes{0}, early_bytes{0};
    static void add(std::atomic<std::uint64_t>& c, std::uint64_t n) {
      c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    }
  } counters_;

  // Invitations received (I/O thread pushes, a user thread takes).
  std::mutex invite_mu_;
  std::condition_variable invite_cv_;
  std::deque<Invitation> invitations_;
};

inline void wake(LaneRun& lane) {
  lane.waiting_on = nullptr;
  lane.peer->woken_.push_back(&lane);
}

}  // namespace kf::detail
