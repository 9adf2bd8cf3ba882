// SPDX-License-Identifier: Apache-2.0
// PeerImpl's life: it composes the driver, mailbox, mesh and engine, starts the I/O thread and
// runs its loop, and adopts cluster versions. Collectives are submitted in backend/submit.cpp.
#include "peer_impl.hpp"

#include <algorithm>
#include <future>
#include <stdexcept>

#include "common/cores.hpp"
#include "kf/common/log.hpp"

namespace kf::detail {

namespace {

// The options, refused before anything listens when they cannot work.
PeerOptions checked(PeerOptions opts) {
  if (opts.job_token.empty()) throw std::invalid_argument("PeerOptions.job_token is empty");
  return opts;
}

}  // namespace

PeerImpl::PeerImpl(PeerOptions opts)
    : default_algorithm_(opts.default_algorithm),
      opts_(checked(std::move(opts))),
      driver_(std::make_shared<Driver>(ioc_)) {
  mesh_.start();
  driver_->poll_rings = [this] { return mesh_.poll_rings(); };
  driver_->rings_asleep = [this](bool asleep) { return mesh_.rings_asleep(asleep); };
  driver_->run_woken = [this] { return engine_.run_woken(); };
  io_thread_ = std::thread([this] { io_loop(); });
}

PeerImpl::~PeerImpl() {
  close_device();
  try {
    auto done = asio::co_spawn(ioc_, mesh_.shutdown(), asio::use_future);
    if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      KF_LOG(warn, "peer", "{}: shutdown did not finish in 5 s; closing anyway", mesh_.identity());
    }
  } catch (const std::exception& e) {
    KF_LOG(warn, "peer", "{}: shutdown failed: {}", mesh_.identity(), e.what());
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
  std::unique_lock<RunLock> lk(d.mu);
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
      // Until the lease ends, or is ended early: a long collective was handed to this thread
      // (Driver::start_on_io).
      d.park_cv.wait_until(pl, recheck, [&] {
        return d.closed.load() || ioc_.stopped() ||
               (d.lease_until.load(std::memory_order_relaxed) == 0 &&
                d.wanted.load(std::memory_order_relaxed) == 0);
      });
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

std::uint64_t PeerImpl::next_resolve_key() noexcept {
  static std::atomic<std::uint64_t> taken{0};
  return taken.fetch_add(1, std::memory_order_relaxed) + 1;
}

// Adopts a new cluster version. Connections to workers that stay are kept; only joiners are
// dialled (lazily, on the first message). Messages of older versions still buffered are dropped.
void PeerImpl::update(const Cluster& c) {
  auto r = c.rank_of(mesh_.self());
  if (!r) {
    throw Error(make_error_code(errc::not_member), "this peer (" + mesh_.identity() +
                                                       ") is not a worker of cluster version " +
                                                       std::to_string(c.version));
  }
  if (!cluster_.workers.empty() && c.version <= cluster_.version) {
    throw Error(make_error_code(errc::stale_version),
                "cluster version " + std::to_string(c.version) + " is not newer than " +
                    std::to_string(cluster_.version));
  }
  const int rank = *r;
  const std::vector<int> peer_of_rank = on_io([this, &c, rank]() -> awaitable<std::vector<int>> {
    std::vector<int> idx = mesh_.adopt(c, rank);
    co_return idx;
  });
  rank_to_peer_ = std::make_shared<const std::vector<int>>(peer_of_rank);
  cluster_ = c;
  rank_ = *r;
  // While every worker on this host can have a core, a polling thread spins on its own core.
  // With more workers than cores it yields the core between polls, so that the worker whose
  // turn it is gets it (pause-polling there measured slower than sleeping; yield-polling faster).
  std::size_t local = 0;
  std::vector<std::string> host_names{""};  // "" is this host
  std::vector<int> host_of_rank;
  std::vector<int> per_host{0};
  for (const auto& w : c.workers) {
    const bool here = mesh_.on_this_host(w.endpoint);
    local += here ? 1 : 0;
    const std::string name = here ? std::string() : w.endpoint.host;
    auto it = std::find(host_names.begin(), host_names.end(), name);
    if (it == host_names.end()) {
      host_names.push_back(name);
      per_host.push_back(0);
      it = host_names.end() - 1;
    }
    const auto h = static_cast<std::size_t>(it - host_names.begin());
    host_of_rank.push_back(static_cast<int>(h));
    ++per_host[h];
  }
  host_of_rank_ = std::make_shared<const std::vector<int>>(std::move(host_of_rank));
  topology_ = coll::Topology{static_cast<int>(per_host.size()),
                             *std::min_element(per_host.begin(), per_host.end()),
                             *std::max_element(per_host.begin(), per_host.end())};
  const bool crowded = local > usable_cores();
  same_host_link_ = opts_.transport == Transport::automatic && local == c.workers.size();
  resolve_key_ = next_resolve_key();
  auto spin = opts_.spin ? *opts_.spin : crowded ? kCrowdedSpin : kDefaultSpin;
  if (kOnlyIoThreadRuns) spin = std::chrono::microseconds(0);
  driver_->spin_us.store(spin.count(), std::memory_order_relaxed);
  driver_->yield.store(crowded, std::memory_order_relaxed);
}

void PeerImpl::watch_arrivals(std::string name) {
  on_io([this, n = std::move(name)]() mutable -> awaitable<void> {
    mailbox_.watch(std::move(n));
    co_return;
  });
}

std::vector<Endpoint> PeerImpl::lost_peers() {
  return on_io([this]() -> awaitable<std::vector<Endpoint>> { co_return mesh_.lost_peers(); });
}

}  // namespace kf::detail
