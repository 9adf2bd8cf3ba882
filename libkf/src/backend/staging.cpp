// SPDX-License-Identifier: Apache-2.0
// The staging backend (staging.hpp): device buffers through page-locked host buffers and the
// host engine, with the copies of one chunk overlapped with the transfer of another.
#include "backend/staging.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "engine/collective.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

// ---- PinnedPool ---------------------------------------------------------------------------------

PinnedPool::~PinnedPool() {
  for (auto& [cap, p] : free_) api_.free_host(p);
}

void PinnedPool::Block::reset() noexcept {
  if (pool_ && data_) pool_->give(data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
}

PinnedPool::Block PinnedPool::take(std::size_t bytes) {
  std::vector<std::byte*> release;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.lower_bound(bytes);
    // A block up to twice the size asked for serves; a larger one is kept for larger asks.
    if (it != free_.end() && it->first <= std::max<std::size_t>(2 * bytes, 64 << 10)) {
      Block b(this, it->second, it->first);
      free_bytes_ -= it->first;
      free_.erase(it);
      return b;
    }
    // Give back the largest free blocks while the free ones exceed what is kept.
    while (!free_.empty() && free_bytes_ > keep_) {
      auto last = std::prev(free_.end());
      release.push_back(last->second);
      free_bytes_ -= last->first;
      held_bytes_ -= last->first;
      free_.erase(last);
    }
  }
  for (std::byte* p : release) api_.free_host(p);
  std::size_t cap = 64 << 10;
  while (cap < bytes) cap *= 2;
  auto* p = static_cast<std::byte*>(api_.alloc_host(cap));
  std::lock_guard<std::mutex> lk(mu_);
  held_bytes_ += cap;
  return Block(this, p, cap);
}

void PinnedPool::give(std::byte* data, std::size_t capacity) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  free_.emplace(capacity, data);
  free_bytes_ += capacity;
}

std::size_t PinnedPool::held_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_bytes_;
}

// ---- the staged collective ----------------------------------------------------------------------

namespace {

// The result as a mark on the copy-out stream, once the staging thread has enqueued it.
class StagedDone final : public DeviceDone {
 public:
  explicit StagedDone(std::shared_ptr<DeviceApi> api) : api_(std::move(api)) {}
  void order_on(void* stream) override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return set_; });
    if (mark_) api_->wait(stream, mark_);  // none: the streams failed, and wait() says so
  }
  void set(DeviceEvent mark) {
    std::lock_guard<std::mutex> lk(mu_);
    mark_ = std::move(mark);
    set_ = true;
    cv_.notify_all();
  }

 private:
  std::shared_ptr<DeviceApi> api_;
  std::mutex mu_;
  std::condition_variable cv_;
  DeviceEvent mark_;
  bool set_ = false;
};

struct Chunk {
  std::size_t offset = 0, count = 0;  // elements
};

}  // namespace

struct StagingBackend::Op {
  std::shared_ptr<CollCtx> c;  // the caller's request (device buffers)
  Buffer send_h, recv_h;       // what the host collectives read and write
  bool copy_in = false;        // the send buffer is copied to the host first
  bool copy_out = false;       // the result is copied back into the recv buffer
  bool chunked = false;        // allreduce and broadcast: element ranges of both buffers
  std::vector<Chunk> chunks;
  PinnedPool::Block in_block, out_block;
  std::shared_ptr<StagedDone> done;
  DeviceEvent in_mark;  // after the last copy in: a device fault shows there

  std::mutex mu;
  std::condition_variable cv;
  std::size_t arrived = 0;  // chunks on the host

  void arrive() {
    std::lock_guard<std::mutex> lk(mu);
    ++arrived;
    cv.notify_all();
  }
  Buffer host_part(const Buffer& whole, const Chunk& k) const {
    if (!chunked) return whole;
    const std::size_t esz = dtype_bytes(whole.dtype);
    return Buffer{static_cast<std::byte*>(whole.data) + k.offset * esz, k.count, whole.dtype,
                  Device::cpu};
  }
};

namespace {

// Whether this rank's collective reads the send buffer and writes the recv buffer.
bool reads_send(const CollCtx& c) {
  switch (c.op) {
    case CollOp::broadcast: return c.rank == c.opts.root;
    case CollOp::barrier: return false;
    default: return true;
  }
}
bool writes_recv(const CollCtx& c) {
  switch (c.op) {
    case CollOp::broadcast: return c.rank != c.opts.root;
    case CollOp::gather: return c.rank == c.opts.root;
    case CollOp::consensus:
    case CollOp::barrier: return false;
    default: return true;
  }
}

// How many chunks a staged collective runs in at once: enough that one chunk's copies overlap
// the next one's transfer.
constexpr std::size_t kChunksInFlight = 4;

}  // namespace

StagingBackend::StagingBackend(std::shared_ptr<DeviceApi> api, std::size_t chunk_bytes,
                               HostSubmit submit)
    : api_(std::move(api)),
      chunk_bytes_(std::max<std::size_t>(chunk_bytes, 4096)),
      submit_(std::move(submit)),
      pool_(*api_, std::size_t{1} << 30) {
  to_host_ = api_->create_stream();
  try {
    to_device_ = api_->create_stream();
  } catch (...) {
    api_->destroy_stream(to_host_);
    throw;
  }
  thread_ = std::thread([this] { loop(); });
}

StagingBackend::~StagingBackend() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  try {
    api_->synchronize(to_host_);
    api_->synchronize(to_device_);
  } catch (const std::exception& e) {
    KF_LOG(warn, "staging", "device streams did not drain: {}", e.what());
  }
  api_->destroy_stream(to_host_);
  api_->destroy_stream(to_device_);
}

void StagingBackend::run(std::shared_ptr<CollCtx> c) {
  const std::shared_ptr<OpState> state = c->state;
  const std::string label = std::string(to_string(c->op)) + " '" + c->name + "'";
  try {
    start(std::move(c));
  } catch (const std::exception& e) {
    state->complete(make_error_code(errc::device_error), label + ": " + e.what());
  }
}

void StagingBackend::start(std::shared_ptr<CollCtx> c) {
  auto op = std::make_shared<Op>();
  CollCtx& r = *c;
  op->c = std::move(c);
  op->done = std::make_shared<StagedDone>(api_);
  const std::size_t esz = dtype_bytes(r.send.dtype);
  op->copy_in = r.send.device == Device::cuda && reads_send(r) && r.send.count > 0;
  op->copy_out = r.recv.device == Device::cuda && writes_recv(r) && r.recv.count > 0;
  op->chunked = r.op == CollOp::allreduce || r.op == CollOp::broadcast;

  // The host side of each buffer: the caller's own when it is in host memory, else staging.
  op->send_h = r.send;
  op->recv_h = r.recv;
  const bool send_dev = r.send.device == Device::cuda;
  if (send_dev) {
    op->in_block = pool_.take(r.send.bytes());
    op->send_h = Buffer{op->in_block.data(), r.send.count, r.send.dtype, Device::cpu};
  }
  if (r.recv.device == Device::cuda) {
    const auto* s0 = static_cast<const std::byte*>(r.send.data);
    const auto* r0 = static_cast<const std::byte*>(r.recv.data);
    if (send_dev && r0 >= s0 && r0 + r.recv.bytes() <= s0 + r.send.bytes()) {
      // In place, or a reduce-scatter's recv inside its send: the same place in the staging.
      op->recv_h = Buffer{op->in_block.data() + (r0 - s0), r.recv.count, r.recv.dtype, Device::cpu};
    } else if (writes_recv(r)) {
      op->out_block = pool_.take(r.recv.bytes());
      op->recv_h = Buffer{op->out_block.data(), r.recv.count, r.recv.dtype, Device::cpu};
    } else {
      op->recv_h = Buffer{nullptr, 0, r.recv.dtype, Device::cpu};  // a gather's, off the root
    }
  }

  if (op->chunked) {
    const std::size_t per = std::max<std::size_t>(1, chunk_bytes_ / esz);
    for (std::size_t off = 0; off < r.send.count; off += per) {
      op->chunks.push_back({off, std::min(per, r.send.count - off)});
    }
  }
  if (op->chunks.empty()) op->chunks.push_back({0, r.send.count});
  r.state->device = op->done;

  std::lock_guard<std::mutex> order(enqueue_mu_);
  // Both copy streams start after the caller's work so far: the copy in reads what it wrote,
  // and the copy out must not overwrite what it still reads.
  const DeviceEvent caller = api_->record(r.opts.stream);
  api_->wait(to_host_, caller);
  api_->wait(to_device_, caller);
  if (op->copy_in) {
    for (const Chunk& k : op->chunks) {
      const Buffer dst = op->host_part(op->send_h, k);
      const Buffer src = op->chunked ? Buffer{static_cast<std::byte*>(r.send.data) + k.offset * esz,
                                              k.count, r.send.dtype, Device::cuda}
                                     : r.send;
      api_->copy(dst.data, src.data, dst.bytes(), to_host_);
      api_->call_after(to_host_, [op] { op->arrive(); });
    }
    op->in_mark = api_->record(to_host_);
  } else {
    op->arrived = op->chunks.size();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
}

void StagingBackend::loop() {
  start_device_thread(*api_, "kf-stage");
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto op = std::move(queue_.front());
    queue_.pop_front();
    const bool stopping = stop_;
    lk.unlock();
    if (stopping) {
      finish(op, make_error_code(errc::closed), "the peer was destroyed before it started");
    } else {
      process(op);
    }
    lk.lock();
  }
}

void StagingBackend::process(const std::shared_ptr<Op>& op) {
  CollCtx& r = *op->c;
  const std::size_t esz = dtype_bytes(r.recv.dtype);
  std::error_code ec;
  std::string why;
  std::deque<std::pair<std::size_t, Handle>> running;
  std::size_t next = 0;
  try {
    while (next < op->chunks.size() || !running.empty()) {
      // Start every chunk that is on the host, up to kChunksInFlight; wait for one only when
      // nothing runs.
      while (!ec && next < op->chunks.size() && running.size() < kChunksInFlight) {
        std::unique_lock<std::mutex> lk(op->mu);
        if (op->arrived <= next) {
          if (!running.empty()) break;
          // A device fault stops the copies, and their callbacks may never run: look at the
          // copy stream's mark while waiting.
          if (!op->cv.wait_for(lk, std::chrono::milliseconds(100),
                               [&] { return op->arrived > next; })) {
            lk.unlock();
            (void)api_->done(op->in_mark);  // throws on a fault
            continue;
          }
        }
        lk.unlock();
        const Chunk& k = op->chunks[next];
        auto h = std::make_shared<CollCtx>();
        h->op = r.op;
        h->name = op->chunks.size() == 1 ? r.name : r.name + "#" + std::to_string(next);
        h->opts = r.opts;
        h->opts.stream = nullptr;
        h->send = op->host_part(op->send_h, k);
        h->recv = op->host_part(op->recv_h, k);
        h->agreed = r.agreed;
        running.emplace_back(next, submit_(std::move(h)));
        ++next;
      }
      if (running.empty()) break;
      auto [i, h] = std::move(running.front());
      running.pop_front();
      if (const std::error_code e = h.wait_status()) {
        if (!ec) {
          ec = e;
          why = h.message();
        }
        next = op->chunks.size();  // start no more chunks; let the running ones end
      } else if (op->copy_out && !ec) {
        const Chunk& k = op->chunks[i];
        const Buffer src = op->host_part(op->recv_h, k);
        auto* dst = static_cast<std::byte*>(r.recv.data) + (op->chunked ? k.offset * esz : 0);
        api_->copy(dst, src.data, src.bytes(), to_device_);
      }
    }
  } catch (const std::exception& e) {
    ec = make_error_code(errc::device_error);
    why = std::string(to_string(r.op)) + " '" + r.name + "': " + e.what();
    for (auto& [i, h] : running) (void)h.wait_status();  // the staging buffers stay theirs
  }
  finish(op, ec, std::move(why));
}

void StagingBackend::finish(const std::shared_ptr<Op>& op, std::error_code ec, std::string why) {
  // Done once both streams have got here: the caller's buffers are then free.
  try {
    api_->wait(to_device_, api_->record(to_host_));
    op->done->set(api_->record(to_device_));
    api_->call_after(to_device_, [op, ec, why]() mutable {
      op->c->state->complete(ec, std::move(why));
      op->c.reset();
    });
    return;
  } catch (const std::exception& e) {
    if (!ec) {
      ec = make_error_code(errc::device_error);
      why = std::string(to_string(op->c->op)) + " '" + op->c->name + "': " + e.what();
    }
  }
  // The streams refuse work: nothing more can be enqueued, so complete here.
  op->done->set(nullptr);
  op->c->state->complete(ec, std::move(why));
}

}  // namespace kf::detail
