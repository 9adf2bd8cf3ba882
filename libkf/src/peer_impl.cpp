// SPDX-License-Identifier: Apache-2.0
// PeerImpl's life: its listeners and I/O thread, the I/O thread's loop, adopting cluster
// versions, the peer table, and invitations. Collectives are submitted in backend/submit.cpp.
#include <future>
#include <stdexcept>

#include "common/cores.hpp"
#include "kf/common/log.hpp"
#include "peer_impl.hpp"

namespace kf::detail {

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
  KF_DCHECK_IO(*driver_);
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

}  // namespace kf::detail
