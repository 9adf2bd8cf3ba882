// SPDX-License-Identifier: Apache-2.0
// kf::Peer's public surface: construction, cluster adoption, argument checks, and handing
// collectives to the I/O thread. The coroutines live in transport/tcp/connections.cpp and
// coll/exec/executor.cpp.
#include "kf/peer.hpp"

#include <array>
#include <future>
#include <stdexcept>

#include "kf/coll/cost_model.hpp"
#include "kf/common/env.hpp"
#include "kf/common/log.hpp"
#include "common/cores.hpp"
#include "peer_impl.hpp"

namespace kf {

std::optional<Transport> parse_transport(std::string_view text) noexcept {
  if (text == "auto") return Transport::automatic;
  if (text == "unix") return Transport::unix_socket;
  if (text == "tcp") return Transport::tcp;
  return std::nullopt;
}

// ---- PeerImpl setup -------------------------------------------------------------------------

namespace detail {

std::string local_socket_name(const Endpoint& ep) {
  return std::string(1, '\0') + "kf/" + ep.str();
}

namespace {

tcp::endpoint resolve_listen(asio::io_context& ioc, const Endpoint& ep) {
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(ep.host, ec);
  if (!ec) return tcp::endpoint(addr, ep.port);
  tcp::resolver res(ioc);
  auto results = res.resolve(ep.host, std::to_string(ep.port), ec);
  if (ec || results.empty()) {
    throw Error(make_error_code(errc::invalid_argument),
                "cannot resolve listen host '" + ep.host + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

PeerImpl::PeerImpl(PeerOptions opts)
    : opts_(std::move(opts)),
      default_algorithm_(opts_.default_algorithm),
      driver_(std::make_shared<Driver>(ioc_)),
      acceptor_(ioc_),
      local_acceptor_(ioc_) {
  if (opts_.job_token.empty()) throw std::invalid_argument("PeerOptions.job_token is empty");
  sent_ = std::make_shared<SendReq>(ex());
  sent_->ev.set({});
  mailbox_.set_claimer(
      [](void* self, const MailKeyView& key, std::span<const std::byte> payload,
         std::error_code& conn, std::string& why) {
        return static_cast<PeerImpl*>(self)->express_take(key, payload, conn, why);
      },
      this);
  const tcp::endpoint ep = resolve_listen(ioc_, opts_.listen);
  boost::system::error_code ec;
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (ec) {
    throw Error(make_error_code(errc::invalid_argument),
                "cannot listen on " + opts_.listen.str() + ": " + ec.message());
  }
  self_ = Endpoint{opts_.listen.host, acceptor_.local_endpoint().port()};
  identity_ = self_.str();
  // The same-host socket listens before the TCP port does: a peer on this host dials the former
  // first and falls back to TCP when it is refused, so in the other order a peer that dialled in
  // between would stay on TCP for good (this happened at job start, about one run in six).
  if (opts_.transport != Transport::tcp) {
    // The same-host listener is an optimisation: without it, peers on this host use TCP.
    const std::string name = local_socket_name(self_);
    local_acceptor_.open(local_stream(), ec);
    if (!ec) local_acceptor_.bind(local_stream::endpoint(name), ec);
    if (!ec) local_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      KF_LOG(info, "transport", "{}: no same-host socket ({}); peers on this host use TCP",
             identity_, ec.message());
      boost::system::error_code ignored;
      local_acceptor_.close(ignored);
    }
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(make_error_code(errc::invalid_argument),
                "cannot listen on " + opts_.listen.str() + ": " + ec.message());
  }
  // Accepting starts once nothing can throw any more (early dialers wait in the backlogs).
  asio::co_spawn(ioc_, accept_loop(acceptor_), asio::detached);
  if (local_acceptor_.is_open()) {
    asio::co_spawn(ioc_, accept_loop(local_acceptor_), asio::detached);
  }
  asio::co_spawn(ioc_, watchdog(), asio::detached);
  driver_->poll_rings = [this] { return poll_rings(); };
  driver_->rings_asleep = [this](bool asleep) { return rings_asleep(asleep); };
  driver_->run_woken = [this] { return run_woken(); };
  io_thread_ = std::thread([this] { io_loop(); });
}

PeerImpl::~PeerImpl() {
  try {
    auto done = asio::co_spawn(ioc_, shutdown(), asio::use_future);
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      KF_LOG(warn, "peer", "{}: shutdown did not finish in 5 s; closing anyway", identity_);
    }
  } catch (const std::exception& e) {
    KF_LOG(warn, "peer", "{}: shutdown failed: {}", identity_, e.what());
  }
  driver_->stopping.store(true);
  ioc_.stop();
  // From here on no user thread may run the context; wait for those inside drive_until to
  // leave it (a stopped context makes them return at once).
  driver_->closed.store(true);
  driver_->wake_io();
  for (int w; (w = driver_->wanted.load()) > 0;) driver_->wanted.wait(w);
  if (io_thread_.joinable()) io_thread_.join();
}

// The I/O thread polls for a short window after each burst of work before it blocks in epoll:
// collectives come in bursts, and a thread that is already awake picks up the next submission or
// the next frame without the wake-up (eventfd + scheduler) that costs as much as a loopback hop.
// It runs one handler at a time so that it notices promptly when a waiting user thread wants to
// run the I/O itself (Driver), and parks, without the context, while that thread drives and for
// the lease after it (Driver::leased): a user thread in a loop of collectives then runs them all
// itself, with no system call to wake or park the I/O thread for each.
void PeerImpl::io_loop() {
  pthread_setname_np(pthread_self(), "kf-io");
  auto guard = asio::make_work_guard(ioc_);
  Driver& d = *driver_;
  std::unique_lock<std::mutex> lk(d.mu);
  d.mark_running(true);
  IdleWindow idle;
  while (!ioc_.stopped()) {
    Clock::time_point recheck;
    if (d.leased(Clock::now(), recheck)) {
      // Parked: without the context, so that a user thread takes it at once. Looking again
      // takes no lock either: waiting for `mu` here would have the driver hand it over (a
      // wake-up) at the end of every collective, which is what the lease is there to avoid.
      if (lk.owns_lock()) {
        d.mark_running(false);
        lk.unlock();
      }
      std::unique_lock<std::mutex> pl(d.park_mu);
      d.park_cv.wait_until(pl, recheck, [&] { return d.closed.load() || ioc_.stopped(); });
      continue;
    }
    if (!lk.owns_lock()) {
      lk.lock();  // at most a moment: a user thread starting a collective (Driver::run_ready)
      d.mark_running(true);
      // The waiter did the work: no burst to poll after (a polling I/O thread would only take a
      // core from the thread that is about to submit the next collective).
      idle.expire();
      continue;  // a waiter may have come meanwhile: look at the lease again
    }
    if (d.poll_once() > 0) {
      idle.worked();
      continue;
    }
    if (idle.within(d.spin())) {
      d.relax();
      continue;
    }
    d.block_once();
    idle.worked();
  }
  if (lk.owns_lock()) d.mark_running(false);
}

void PeerImpl::start(const Cluster& c) { update(c); }

// Adopts a new cluster version. Connections to workers that stay are kept; only joiners are
// dialled (lazily, on the first message). Messages of older versions still buffered are dropped.
void PeerImpl::update(const Cluster& c) {
  auto r = c.rank_of(self_);
  if (!r) {
    throw Error(make_error_code(errc::not_member),
                "this peer (" + identity_ + ") is not a worker of cluster version " +
                    std::to_string(c.version));
  }
  if (!cluster_.workers.empty() && c.version <= cluster_.version) {
    throw Error(make_error_code(errc::stale_version),
                "cluster version " + std::to_string(c.version) + " is not newer than " +
                    std::to_string(cluster_.version));
  }
  const std::vector<int> peer_of_rank = on_io(
      [this, c, rank = *r]() -> awaitable<std::vector<int>> {
        std::vector<int> idx;
        for (const auto& w : c.workers) {
          const int i = peer_index(w.endpoint);
          // A member of the new version starts with a clean record (a restarted worker may
          // reuse a lost one's address).
          peers_[static_cast<std::size_t>(i)].lost = false;
          peers_[static_cast<std::size_t>(i)].departed = false;
          idx.push_back(i);
        }
        mailbox_.drop_older(c.version);
        broken_ = {};
        broken_why_.clear();
        io_cluster_ = c;
        io_rank_ = rank;
        co_return idx;
      });
  rank_to_peer_ = std::make_shared<const std::vector<int>>(peer_of_rank);
  cluster_ = c;
  rank_ = *r;
  // While every worker on this host can have a core, a polling thread spins on its own core.
  // With more workers than cores it yields the core between polls, so that the worker whose
  // turn it is gets it (pause-polling there measured slower than sleeping; yield-polling faster).
  std::size_t local = 0;
  for (const auto& w : c.workers) local += on_this_host(w.endpoint) ? 1 : 0;
  const bool crowded = local > usable_cores();
  same_host_link_ = opts_.transport == Transport::automatic && local == c.workers.size();
  const auto spin = opts_.spin ? *opts_.spin : crowded ? kCrowdedSpin : kDefaultSpin;
  driver_->spin_us.store(spin.count(), std::memory_order_relaxed);
  driver_->yield.store(crowded, std::memory_order_relaxed);
}

std::vector<Endpoint> PeerImpl::lost_peers() {
  return on_io([this]() -> awaitable<std::vector<Endpoint>> {
        std::vector<Endpoint> out;
        for (const auto& w : io_cluster_.workers) {
          auto it = peer_by_key_.find(w.endpoint.str());
          if (it != peer_by_key_.end() && peers_[static_cast<std::size_t>(it->second)].lost) {
            out.push_back(w.endpoint);
          }
        }
        co_return out;
      });
}

int PeerImpl::peer_index(const Endpoint& ep) {
  const std::string key = ep.str();
  auto it = peer_by_key_.find(key);
  if (it != peer_by_key_.end()) return it->second;
  const int idx = static_cast<int>(peers_.size());
  PeerState ps;
  ps.ep = ep;
  ps.key = key;
  peers_.push_back(std::move(ps));
  peer_by_key_.emplace(key, idx);
  return idx;
}

Algorithm PeerImpl::resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept {
  if (a == Algorithm::job_default) a = default_algorithm_.load(std::memory_order_relaxed);
  if (a == Algorithm::job_default) a = Algorithm::auto_select;
  if (a != Algorithm::auto_select) return a;
  const int p = std::max(1, cluster_.size());
  // choose() is a pure function of these three and costs as much as a small collective's
  // bookkeeping; jobs repeat the same few sizes, so each thread remembers its last answers.
  struct Memo {
    CollOp op;
    int p = 0;
    std::size_t bytes = 0;
    Algorithm a;
    bool same_host = false;
  };
  thread_local std::array<Memo, 16> memo{};
  const bool local = same_host_link_;
  Memo& m = memo[(bytes * 31 + static_cast<std::size_t>(p) * 7 + static_cast<std::size_t>(op)) %
                 memo.size()];
  if (m.p != p || m.bytes != bytes || m.op != op || m.same_host != local) {
    m = Memo{op, p, bytes,
             coll::choose(op, bytes, p, local ? coll::kSameHostLink : coll::LinkParams{}), local};
  }
  return m.a;
}

Handle PeerImpl::submit(std::shared_ptr<CollCtx> ctx) {
  ctx->state = std::make_shared<OpState>();
  ctx->state->driver = driver_;
  Handle h(ctx->state);
  auto fail = [&](const std::string& why) {
    ctx->state->complete(make_error_code(errc::invalid_argument),
                         std::string(to_string(ctx->op)) + " '" + ctx->name + "': " + why);
    return h;
  };
  if (cluster_.workers.empty()) return fail("the peer has no cluster yet (call start())");
  if (ctx->send.device != Device::cpu || ctx->recv.device != Device::cpu) {
    return fail("device buffers need the NCCL backend, which this build does not have");
  }
  ctx->version = cluster_.version;
  ctx->rank = rank_;
  ctx->size = cluster_.size();
  const auto p = static_cast<std::size_t>(ctx->size);
  if (ctx->opts.root < 0 || ctx->opts.root >= ctx->size) {
    return fail("root " + std::to_string(ctx->opts.root) + " is not a rank of this " +
                std::to_string(ctx->size) + "-worker cluster");
  }
  if (ctx->name.empty() || ctx->name.size() > transport::kMaxNameBytes) {
    return fail("a collective needs a name of 1-" + std::to_string(transport::kMaxNameBytes) +
                " bytes");
  }
  const Buffer& s = ctx->send;
  const Buffer& r = ctx->recv;
  switch (ctx->op) {
    case CollOp::allreduce:
      if (s.count != r.count || s.dtype != r.dtype) return fail("send and recv differ in shape");
      break;
    case CollOp::allgather:
    case CollOp::gather:
      if (s.dtype != r.dtype) return fail("send and recv differ in dtype");
      if ((ctx->op == CollOp::allgather || ctx->rank == ctx->opts.root) && r.count != s.count * p) {
        return fail("recv needs size*send.count = " + std::to_string(s.count * p) + " elements");
      }
      break;
    case CollOp::reduce_scatter:
      if (s.dtype != r.dtype) return fail("send and recv differ in dtype");
      if (s.count != r.count * p) {
        return fail("send needs size*recv.count = " + std::to_string(r.count * p) + " elements");
      }
      break;
    default:
      break;
  }
  if ((s.count > 0 && s.data == nullptr) || (r.count > 0 && r.data == nullptr &&
                                             !(ctx->op == CollOp::gather &&
                                               ctx->rank != ctx->opts.root))) {
    return fail("null buffer");
  }
  ctx->timeout = ctx->opts.timeout.count() > 0 ? ctx->opts.timeout : opts_.timeout;
  ctx->algorithm = resolve(ctx->op, ctx->opts.algorithm, s.bytes());
  ctx->rank_to_peer = rank_to_peer_;
  // Started here when the context is free (the I/O thread parked on a waiter's lease): its first
  // frames leave now, not when the next thread to run the context gets to it.
  driver_->start([this, ctx = std::move(ctx)]() mutable {
    const std::uint64_t posted = handlers_posted_;
    start_collective(std::move(ctx));
    return handlers_posted_ != posted;
  });
  return h;
}

namespace {

// An invitation's completion, owned by its coroutine: if that is destroyed unfinished (the peer
// was destroyed with the invitation still being dialled), the waiter learns so.
struct PendingInvite {
  std::shared_ptr<OpState> state;
  std::string to;
  PendingInvite(std::shared_ptr<OpState> s, std::string t) : state(std::move(s)), to(std::move(t)) {}
  PendingInvite(PendingInvite&&) noexcept = default;
  PendingInvite(const PendingInvite&) = delete;
  PendingInvite& operator=(const PendingInvite&) = delete;
  PendingInvite& operator=(PendingInvite&&) = delete;
  ~PendingInvite() {
    if (state && !state->ready.load(std::memory_order_acquire)) {
      state->complete(make_error_code(errc::closed),
                      "invitation to " + to + ": the peer was destroyed before it was delivered");
    }
  }
};

}  // namespace

Handle PeerImpl::invite(const Endpoint& to, std::string payload) {
  auto state = std::make_shared<OpState>();
  Handle h(state);
  if (payload.size() > transport::kMaxInvitePayload) {
    state->complete(make_error_code(errc::invalid_argument),
                    "invitation of " + std::to_string(payload.size()) +
                        " bytes exceeds the limit of " +
                        std::to_string(transport::kMaxInvitePayload));
    return h;
  }
  asio::co_spawn(
      ioc_,
      [this, to, payload = std::move(payload),
       pending = PendingInvite(state, to.str())]() -> awaitable<void> {
        const int peer = peer_index(to);
        std::vector<std::byte> bytes(payload.size());
        std::memcpy(bytes.data(), payload.data(), payload.size());
        auto req = post_control(peer, transport::FrameType::invite, std::move(bytes));
        if (!req->ev.done) co_await req->ev.timer().async_wait(asio::as_tuple(asio::use_awaitable));
        pending.state->complete(req->ev.ec, req->ev.ec ? "invitation to " + to.str() +
                                                             " was not delivered: " +
                                                             req->ev.ec.message()
                                                       : std::string());
      },
      asio::detached);
  return h;
}

std::optional<Invitation> PeerImpl::wait_invitation(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(invite_mu_);
  if (!invite_cv_.wait_for(lk, timeout, [&] { return !invitations_.empty(); })) {
    return std::nullopt;
  }
  Invitation inv = std::move(invitations_.front());
  invitations_.pop_front();
  return inv;
}

}  // namespace detail

// ---- Peer -------------------------------------------------------------------------------------

Peer::Peer(PeerOptions opts) : impl_(std::make_unique<detail::PeerImpl>(std::move(opts))) {}
Peer::~Peer() = default;

std::unique_ptr<Peer> Peer::from_environment() {
  const Env e = Env::from_environment();
  auto p = std::make_unique<Peer>(options_from(e));
  p->start(e.cluster);
  return p;
}

PeerOptions Peer::options_from(const Env& e) {
  PeerOptions o;
  o.listen = Endpoint{e.self.host, e.self.port};
  o.job_id = e.job_id;
  o.job_token = e.job_token;
  if (e.timeout) o.timeout = *e.timeout;
  if (e.spin) o.spin = *e.spin;
  if (e.express_bytes) o.express_bytes = *e.express_bytes;
  if (e.heartbeat_timeout) {
    o.heartbeat_timeout = *e.heartbeat_timeout;
    o.heartbeat_interval = *e.heartbeat_timeout / 4;
  }
  std::optional<std::string> algo = e.algorithm;
  if (!algo && e.cluster.settings.contains("algorithm") &&
      e.cluster.settings["algorithm"].is_string()) {
    algo = e.cluster.settings["algorithm"].get<std::string>();
  }
  if (algo) {
    auto a = parse_algorithm(*algo);
    if (!a) {
      throw std::invalid_argument(std::string(env::kAlgorithm) + "='" + *algo +
                                  "' is not one of auto, star, ring, tree, clique, rhd");
    }
    o.default_algorithm = *a;
  }
  if (e.transport) {
    auto t = parse_transport(*e.transport);
    if (!t) {
      throw std::invalid_argument(std::string(env::kTransport) + "='" + *e.transport +
                                  "' is not one of auto, unix, tcp");
    }
    o.transport = *t;
  }
  return o;
}

Endpoint Peer::endpoint() const { return impl_->endpoint(); }
void Peer::start(const Cluster& cluster) { impl_->start(cluster); }
void Peer::update(const Cluster& cluster) { impl_->update(cluster); }
std::vector<Endpoint> Peer::lost_peers() const { return impl_->lost_peers(); }
void Peer::set_default_algorithm(Algorithm a) noexcept {
  impl_->default_algorithm_.store(a, std::memory_order_relaxed);
}

Handle Peer::invite(const Endpoint& to, std::string payload) {
  return impl_->invite(to, std::move(payload));
}
std::optional<Invitation> Peer::wait_invitation(std::chrono::milliseconds timeout) {
  return impl_->wait_invitation(timeout);
}
TransportStats Peer::transport_stats() const noexcept {
  const auto& c = impl_->counters_;
  TransportStats t;
  t.tcp_bytes = c.tcp_bytes.load(std::memory_order_relaxed);
  t.socket_bytes = c.socket_bytes.load(std::memory_order_relaxed);
  t.single_copy_bytes = c.single_copy_bytes.load(std::memory_order_relaxed);
  t.single_copy_refused = c.single_copy_refused.load(std::memory_order_relaxed);
  t.shm_bytes = c.shm_bytes.load(std::memory_order_relaxed);
  t.early_bytes = impl_->mailbox_.early_bytes();
  return t;
}

int Peer::rank() const noexcept { return impl_->rank_; }
int Peer::size() const noexcept { return impl_->cluster_.size(); }
std::uint64_t Peer::version() const noexcept { return impl_->cluster_.version; }
const Cluster& Peer::cluster() const noexcept { return impl_->cluster_; }

Algorithm Peer::resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept {
  return impl_->resolve(op, a, bytes);
}

namespace {

std::shared_ptr<detail::CollCtx> make_ctx(CollOp op, std::string_view name, Buffer send,
                                          Buffer recv, const CollOptions& o) {
  auto c = std::make_shared<detail::CollCtx>();
  c->op = op;
  c->name = std::string(name);
  c->send = send;
  c->recv = recv;
  c->opts = o;
  return c;
}

}  // namespace

Handle Peer::allreduce(std::string_view name, Buffer send, Buffer recv, const CollOptions& o) {
  return impl_->submit(make_ctx(CollOp::allreduce, name, send, recv, o));
}
Handle Peer::broadcast(std::string_view name, Buffer buf, const CollOptions& o) {
  return impl_->submit(make_ctx(CollOp::broadcast, name, buf, buf, o));
}
Handle Peer::allgather(std::string_view name, Buffer send, Buffer recv, const CollOptions& o) {
  return impl_->submit(make_ctx(CollOp::allgather, name, send, recv, o));
}
Handle Peer::reduce_scatter(std::string_view name, Buffer send, Buffer recv,
                            const CollOptions& o) {
  return impl_->submit(make_ctx(CollOp::reduce_scatter, name, send, recv, o));
}
Handle Peer::gather(std::string_view name, Buffer send, Buffer recv, const CollOptions& o) {
  return impl_->submit(make_ctx(CollOp::gather, name, send, recv, o));
}
Handle Peer::barrier(std::string_view name, const CollOptions& o) {
  Buffer none{nullptr, 0, DType::u8, Device::cpu};
  return impl_->submit(make_ctx(CollOp::barrier, name, none, none, o));
}
Handle Peer::consensus(std::string_view name, Buffer data, bool* agreed, const CollOptions& o) {
  auto c = make_ctx(CollOp::consensus, name, data, data, o);
  c->agreed = agreed;
  return impl_->submit(std::move(c));
}

}  // namespace kf
