// SPDX-License-Identifier: Apache-2.0
// The NCCL backend (nccl.hpp): communicators per cluster version, collectives on the caller's
// stream, failures turned into errors by revoking or aborting the communicator.
#include "backend/nccl.hpp"

#include <algorithm>
#include <cstring>

#include <cuda_runtime.h>
#include <nccl.h>

#include "engine/collective.hpp"
#include "kf/common/log.hpp"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define KF_NCCL_SHRINK 1
#else
#define KF_NCCL_SHRINK 0
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define KF_NCCL_REVOKE 1
#else
#define KF_NCCL_REVOKE 0
#endif

namespace kf::detail {

struct NcclBackend::Comm {
  ncclComm_t comm = nullptr;  // null once aborted
  std::uint64_t version = 0;
  std::vector<Endpoint> members;
  int rank = 0;
  // Set once, by fail_comm, before `failed`; read by completions after it.
  std::atomic<bool> failed{false};
  std::error_code ec;
  std::string why;
  bool revoked = false;  // stopped by ncclCommRevoke: still shrinkable (with NCCL_SHRINK_ABORT)
};

namespace {

using Ms = std::chrono::milliseconds;

// A remote process that exited or a broken connection is a lost peer, which the job recovers
// from like any other; the rest are faults of this process or its device.
std::error_code nccl_error_code(ncclResult_t r) {
  return make_error_code(r == ncclRemoteError || r == ncclSystemError ? errc::peer_lost
                                                                      : errc::device_error);
}

[[noreturn]] void throw_nccl(const char* what, ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string msg = std::string("NCCL: ") + what + ": " + ncclGetErrorString(r);
  if (comm) {
    if (const char* last = ncclGetLastError(comm); last && *last) msg += std::string(": ") + last;
  }
  throw Error(nccl_error_code(r), msg);
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace

NcclBackend::NcclBackend(std::shared_ptr<DeviceApi> api, PeerHooks hooks)
    : api_(std::move(api)), hooks_(std::move(hooks)) {
  int v = 0;
  if (const ncclResult_t r = ncclGetVersion(&v); r != ncclSuccess) throw_nccl("ncclGetVersion", r);
  comm_stream_ = api_->create_stream();
  watcher_ = std::thread([this] { watch(); });
}

NcclBackend::~NcclBackend() {
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    stop_ = true;
  }
  watch_cv_.notify_all();
  watcher_.join();
  std::lock_guard<std::mutex> lk(mu_);
  if (auto c = current()) {
    if (running_.load() > 0) fail_comm(*c, make_error_code(errc::closed), "the peer was destroyed");
    if (c->comm) (void)ncclCommAbort(c->comm);
    c->comm = nullptr;
  }
  try {
    api_->synchronize(comm_stream_);  // the completions' callbacks have run
  } catch (const std::exception& e) {
    KF_LOG(warn, "nccl", "the communication stream did not drain: {}", e.what());
  }
  api_->destroy_stream(comm_stream_);
}

std::string NcclBackend::name() const {
  int v = 0;
  (void)ncclGetVersion(&v);
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

NcclBackend::Timings NcclBackend::timings() const {
  std::lock_guard<std::mutex> lk(comm_mu_);
  return timings_;
}

std::shared_ptr<NcclBackend::Comm> NcclBackend::current() const {
  std::lock_guard<std::mutex> lk(comm_mu_);
  return comm_;
}

void NcclBackend::settle(Comm& c, const char* what, Ms limit, bool watch_members) {
  const auto until = Clock::now() + limit;
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(c.comm, &state); r != ncclSuccess) {
      throw_nccl("ncclCommGetAsyncError", r, c.comm);
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throw_nccl(what, state, c.comm);
    // A peer that is gone never answers: look at the mesh now and then.
    if (watch_members && polls % 64 == 63) {
      for (const Endpoint& e : hooks_.lost_peers()) {
        if (std::find(c.members.begin(), c.members.end(), e) != c.members.end()) {
          throw Error(make_error_code(errc::peer_lost),
                      std::string("NCCL: ") + what + ": peer " + e.str() + " lost");
        }
      }
    }
    if (Clock::now() > until) {
      throw Error(make_error_code(errc::timeout), std::string("NCCL: ") + what + " took over " +
                                                      std::to_string(limit.count()) + " ms");
    }
    // NCCL's state is only polled. A collective that returned ncclInProgress is usually
    // enqueued within microseconds: yield for the first millisecond or so, then sleep.
    if (polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclBackend::settle_new(Comm& c, const char* what) {
  try {
    settle(c, what, hooks_.init_timeout);
  } catch (...) {
    if (c.comm) (void)ncclCommAbort(c.comm);
    c.comm = nullptr;
    throw;
  }
}

std::shared_ptr<NcclBackend::Comm> NcclBackend::fresh(const Cluster& cluster, int rank) {
  const auto t0 = Clock::now();
  ncclUniqueId id{};
  if (rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      throw_nccl("ncclGetUniqueId", r);
    }
  }
  // The id travels in kf's own broadcast: no second rendezvous service.
  auto b = std::make_shared<CollCtx>();
  b->op = CollOp::broadcast;
  b->name = "kf.nccl.id";
  b->send = b->recv = Buffer{&id, sizeof id, DType::u8, Device::cpu};
  if (const Handle h = hooks_.host_submit(std::move(b));
      const std::error_code e = h.wait_status()) {
    throw Error(e, "NCCL: the communicator's unique id did not arrive: " + h.message());
  }
  auto c = std::make_shared<Comm>();
  c->version = cluster.version;
  c->rank = rank;
  for (const auto& w : cluster.workers) c->members.push_back(w.endpoint);
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t r = ncclCommInitRankConfig(&c->comm, cluster.size(), id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl("ncclCommInitRankConfig", r);
  settle_new(*c, "ncclCommInitRankConfig");
  std::lock_guard<std::mutex> lk(comm_mu_);
  timings_.init_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  timings_.last_was_shrink = false;
  return c;
}

std::shared_ptr<NcclBackend::Comm> NcclBackend::shrunk(Comm& old, const Cluster& cluster,
                                                       int rank) {
#if KF_NCCL_SHRINK
  const auto t0 = Clock::now();
  std::vector<int> exclude;
  for (int r = 0; r < static_cast<int>(old.members.size()); ++r) {
    const Endpoint& e = old.members[static_cast<std::size_t>(r)];
    const bool stays = std::any_of(cluster.workers.begin(), cluster.workers.end(),
                                   [&](const auto& w) { return w.endpoint == e; });
    if (!stays) exclude.push_back(r);
  }
  auto c = std::make_shared<Comm>();
  c->version = cluster.version;
  c->rank = rank;
  for (const auto& w : cluster.workers) c->members.push_back(w.endpoint);
  // A revoked communicator must be quiet before it is shrunk.
  if (old.revoked) settle(old, "ncclCommRevoke", hooks_.init_timeout, /*watch_members=*/false);
  // NCCL_SHRINK_ABORT ends whatever still runs on the old communicator (operations waiting for a
  // dead peer). It is used for every shrink, not only after a loss: the flags must agree on
  // every member, and whether a loss was seen while an operation ran differs between them.
  const int flags = NCCL_SHRINK_ABORT;
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t r = ncclCommShrink(old.comm, exclude.data(), static_cast<int>(exclude.size()),
                                        &c->comm, &config, flags);
  if (r != ncclSuccess && r != ncclInProgress) throw_nccl("ncclCommShrink", r, old.comm);
  // Non-blocking, NCCL writes the new handle only once the shrink is done; until then the
  // parent's state tells how it goes.
  try {
    settle(old, "ncclCommShrink", hooks_.init_timeout);
  } catch (...) {
    if (c->comm) (void)ncclCommAbort(c->comm);
    c->comm = nullptr;
    throw;
  }
  if (!c->comm) {
    throw Error(make_error_code(errc::device_error), "NCCL: ncclCommShrink made no communicator");
  }
  settle_new(*c, "ncclCommShrink");
  std::lock_guard<std::mutex> lk(comm_mu_);
  timings_.shrink_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  timings_.last_was_shrink = true;
  return c;
#else
  (void)old;
  (void)cluster;
  (void)rank;
  return nullptr;
#endif
}

std::shared_ptr<NcclBackend::Comm> NcclBackend::comm_for(const Cluster& cluster, int rank) {
  std::shared_ptr<Comm> old = current();
  if (old && old->version == cluster.version) return old;  // failed or not: run() looks
  std::vector<Endpoint> members;
  for (const auto& w : cluster.workers) members.push_back(w.endpoint);
  std::shared_ptr<Comm> next;
  if (old && old->comm && old->members == members && !old->failed.load()) {
    // A new version with the same members (a settings change): the same communicator.
    old->version = cluster.version;
    old->rank = rank;
    return old;
  }
  // Shrink when the new members are the old ones less some, in the same order (NCCL gives the
  // remaining ranks their order); every remaining member makes the same choice, since they all
  // hold the same old communicator.
  bool subset = old && old->comm && members.size() < old->members.size() && !members.empty();
  if (subset) {
    std::size_t j = 0;
    for (const Endpoint& e : old->members) {
      if (j < members.size() && members[j] == e) ++j;
    }
    subset = j == members.size();
  }
  if (subset) next = shrunk(*old, cluster, rank);
  if (!next) next = fresh(cluster, rank);
  if (old && old->comm) (void)ncclCommAbort(old->comm);  // nothing runs on it (Peer::update)
  if (old) old->comm = nullptr;
  std::lock_guard<std::mutex> lk(comm_mu_);
  comm_ = next;
  return next;
}

void NcclBackend::fail_comm(Comm& c, std::error_code ec, const std::string& why) {
  if (c.failed.load()) return;
  c.ec = ec;
  c.why = why;
  c.failed.store(true, std::memory_order_release);
  KF_LOG(warn, "nccl", "communicator of version {} stopped: {}", c.version, why);
  if (!c.comm) return;
#if KF_NCCL_REVOKE
  if (const ncclResult_t r = ncclCommRevoke(c.comm, NCCL_REVOKE_DEFAULT);
      r == ncclSuccess || r == ncclInProgress) {
    c.revoked = true;
    return;
  }
#endif
  (void)ncclCommAbort(c.comm);
  c.comm = nullptr;
}

void NcclBackend::run(std::shared_ptr<CollCtx> ctx, const Cluster& cluster) {
  CollCtx& r = *ctx;
  const std::string label = std::string(to_string(r.op)) + " '" + r.name + "'";
  std::unique_lock<std::mutex> lk(mu_);
  std::shared_ptr<Comm> comm;
  try {
    comm = comm_for(cluster, r.rank);
    if (comm->failed.load(std::memory_order_acquire)) throw Error(comm->ec, comm->why);
  } catch (const Error& e) {
    r.state->complete(e.code(), label + ": " + e.what());
    return;
  }
  // NCCL runs on kf's own stream, after the caller's work so far: the collective overlaps what
  // the caller enqueues next (the rest of backward), and order_on makes the caller wait.
  auto* stream = static_cast<cudaStream_t>(comm_stream_);
  try {
    api_->wait(comm_stream_, api_->record(r.opts.stream));
  } catch (const Error& e) {
    r.state->complete(e.code(), label + ": " + e.what());
    return;
  }
  const ncclDataType_t dt = nccl_type(r.send.dtype);
  ncclComm_t nc = comm->comm;
  ncclResult_t res = ncclSuccess;
  switch (r.op) {
    case CollOp::allreduce:
      res =
          ncclAllReduce(r.send.data, r.recv.data, r.send.count, dt, nccl_op(r.opts.op), nc, stream);
      break;
    case CollOp::broadcast:
      res = ncclBroadcast(r.send.data, r.recv.data, r.send.count, dt, r.opts.root, nc, stream);
      break;
    case CollOp::allgather:
      res = ncclAllGather(r.send.data, r.recv.data, r.send.count, dt, nc, stream);
      break;
    case CollOp::reduce_scatter:
      res = ncclReduceScatter(r.send.data, r.recv.data, r.recv.count, dt, nccl_op(r.opts.op), nc,
                              stream);
      break;
    case CollOp::gather: {
      // Point to point in one group: every rank sends its block, the root receives them all.
      const std::size_t bytes = r.send.bytes();
      res = ncclGroupStart();
      if (res == ncclSuccess)
        res = ncclSend(r.send.data, r.send.count, dt, r.opts.root, nc, stream);
      if (res == ncclSuccess && r.rank == r.opts.root) {
        for (int from = 0; from < r.size && res == ncclSuccess; ++from) {
          res = ncclRecv(
              static_cast<std::byte*>(r.recv.data) + static_cast<std::size_t>(from) * bytes,
              r.send.count, dt, from, nc, stream);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      if (res == ncclSuccess) res = end;
      break;
    }
    default:
      r.state->complete(make_error_code(errc::invalid_argument),
                        label + ": not an operation of the NCCL backend");
      return;
  }
  try {
    if (res != ncclSuccess && res != ncclInProgress) throw_nccl(label.c_str(), res, nc);
    if (res == ncclInProgress) settle(*comm, label.c_str(), r.timeout);
    // Completed by the stream itself once NCCL's kernel is done (or ended by an abort).
    auto mark = api_->record(comm_stream_);
    struct Done final : DeviceDone {
      std::shared_ptr<DeviceApi> api;
      DeviceEvent mark;
      void order_on(void* s) override { api->wait(s, mark); }
    };
    auto done = std::make_shared<Done>();
    done->api = api_;
    done->mark = mark;
    r.state->device = done;
    running_.fetch_add(1);
    // The callback owns the request until it completes it: the request's last owner completes
    // it with `closed` when destroyed unfinished (CollCtx's destructor).
    api_->call_after(comm_stream_, [this, comm, ctx, label] {
      if (comm->failed.load(std::memory_order_acquire)) {
        ctx->state->complete(comm->ec, label + ": " + comm->why);
      } else {
        ctx->state->complete({}, {});
      }
      running_.fetch_sub(1);
    });
  } catch (const Error& e) {
    fail_comm(*comm, e.code(), e.what());
    r.state->complete(e.code(), label + ": " + e.what());
    return;
  }
  lk.unlock();
  watch_cv_.notify_all();
}

void NcclBackend::watch() {
  start_device_thread(*api_, "kf-nccl");
  std::unique_lock<std::mutex> wl(watch_mu_);
  while (!stop_) {
    if (running_.load() == 0) {
      watch_cv_.wait_for(wl, Ms(100));
      continue;
    }
    watch_cv_.wait_for(wl, Ms(2));
    if (stop_) break;
    wl.unlock();
    {
      std::lock_guard<std::mutex> lk(mu_);
      std::shared_ptr<Comm> c = current();
      if (c && c->comm && !c->failed.load()) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
          const ncclResult_t bad = r != ncclSuccess ? r : state;
          const char* last = ncclGetLastError(c->comm);
          fail_comm(*c, nccl_error_code(bad),
                    std::string("NCCL: ") + ncclGetErrorString(bad) +
                        (last && *last ? std::string(": ") + last : std::string()));
        } else {
          for (const Endpoint& e : hooks_.lost_peers()) {
            if (std::find(c->members.begin(), c->members.end(), e) != c->members.end()) {
              fail_comm(*c, make_error_code(errc::peer_lost), "peer " + e.str() + " lost");
              break;
            }
          }
        }
      }
    }
    wl.lock();
  }
}

}  // namespace kf::detail
