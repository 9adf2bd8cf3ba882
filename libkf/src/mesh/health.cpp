// SPDX-License-Identifier: Apache-2.0
// The mesh's view of its peers' health: progress deadlines of transfers, loss (a broken
// connection, silence past the heartbeat timeout, a peer's report), departure (a goodbye),
// versions moving on, and the goodbye of this peer at shutdown.
#include "kf/common/log.hpp"
#include "mesh/mesh.hpp"
#include "transport/stream/socket_io.hpp"

namespace kf::detail {

using transport::FrameHeader;
using transport::FrameType;

awaitable<std::error_code> Mesh::wait_progress(Event& ev, int peer,
                                               std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!ev.done) {
    ev.timer().expires_at(deadline);
    co_await ev.timer().async_wait(kTuple);
    if (ev.done) break;
    const auto& ps = peers_[static_cast<std::size_t>(peer)];
    const auto last = std::max(ps.last_rx, ps.last_tx) + timeout;
    const auto now = Clock::now();
    if (now >= deadline && now >= last) co_return make_error_code(errc::timeout);
    deadline = std::max(deadline, last);
  }
  co_return ev.ec;
}

void Mesh::force_close(int peer) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  boost::system::error_code ignored;
  for (auto& in : ps.in) in->sock.close(ignored);
  close_outgoing(peer);
}

void Mesh::close_outgoing(int peer) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (!ps.out) return;
  boost::system::error_code ignored;
  ps.out->closed = true;
  ps.out->sock.close(ignored);
  ps.out->signal.cancel();
}

// ---- failure bookkeeping ------------------------------------------------------------------

void Mesh::mark_lost(int peer, std::error_code ec, const std::string& why) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (ps.lost || stopping_) return;
  // A peer that said goodbye is gone by its own choice: what waited on it has already failed
  // (mark_departed), and its connections breaking afterwards is expected.
  if (ps.departed) return;
  ps.lost = true;
  const bool member = io_cluster_.rank_of(ps.ep).has_value();
  KF_LOG(warn, "transport", "{} (rank {}, v{}): peer {} lost: {}", identity_, io_rank_,
         io_cluster_.version, ps.key, why);
  if (!member) return;
  // A loss after the version broke is told too: the survivors' recovery waits for one of them
  // to write the successor, and that one must learn of every loss, also of peers it has no
  // connection to.
  if (broken_) {
    tell_lost({ps.key});
  } else {
    break_version(ec, "peer " + ps.key + " lost: " + why);
  }
}

void Mesh::mark_departed(int peer) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  ps.departed = true;
  KF_LOG(debug, "transport", "{}: peer {} said goodbye", identity_, ps.key);
  mailbox_.fail_posted(KeyMatch{peer}, make_error_code(errc::peer_lost));
}

void Mesh::note_version(int peer, std::uint64_t version) {
  KF_DCHECK_IO(driver_);
  auto& ps = peers_[static_cast<std::size_t>(peer)];
  if (version <= ps.max_version) return;
  ps.max_version = version;
  KF_LOG(debug, "transport", "{}: {} moved to version {}", identity_, ps.key, version);
  mailbox_.fail_posted(KeyMatch{peer, version}, make_error_code(errc::stale_version));
}

// A member is gone, so every collective of this cluster version fails on this worker and on
// every worker we can still tell (they may be waiting on someone other than the lost peer).
void Mesh::break_version(std::error_code ec, const std::string& why) {
  KF_DCHECK_IO(driver_);
  if (broken_) return;
  broken_ = ec;
  broken_why_ = why;
  broken_version_.store(io_cluster_.version, std::memory_order_release);
  mailbox_.fail_posted(KeyMatch{}, ec);
  std::vector<std::string> lost;
  for (auto& ps : peers_) {
    if (ps.lost) lost.push_back(ps.key);
    if (!ps.out) continue;
    for (auto& r : ps.out->queue) cancel(r, ec);
  }
  tell_lost(lost);
}

// Sends a notice_lost for each of `lost` to every member not known to be gone.
void Mesh::tell_lost(const std::vector<std::string>& lost) {
  KF_DCHECK_IO(driver_);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].lost || peers_[i].departed || !io_cluster_.rank_of(peers_[i].ep)) continue;
    if (peers_[i].key == identity_) continue;  // this worker knows already
    for (const auto& who : lost) {
      std::vector<std::byte> payload(reinterpret_cast<const std::byte*>(who.data()),
                                     reinterpret_cast<const std::byte*>(who.data()) + who.size());
      post_control(static_cast<int>(i), FrameType::notice_lost, std::move(payload));
    }
  }
}

// Members that send us data also send heartbeats while idle; one that stays silent past the
// heartbeat timeout (a stopped process, a lost machine: nothing closes its connection) is lost.
//
// Silence counts only while this thread runs on time. A tick that comes late means this
// process did not run for that long (a loaded machine, a paused VM), and most likely neither
// did its peers on the same host: what they wrote meanwhile may still be unread, or not yet
// written by a peer that got its core back later than this one. From such a tick on, every
// member's silence counts afresh (`awake_since`). Judging only the late tick itself, as this
// did first, lost members across two stalls in a row, and whenever a peer got its core back
// after this one (PeerLoss.AHostWidePauseLosesNobody). The price: a process starved without
// pause finds its silent peers late (the collectives' own deadlines still hold).
awaitable<void> Mesh::watchdog() {
  KF_DCHECK_IO(driver_);
  const auto timeout = opts_.heartbeat_timeout;
  asio::steady_timer t(ex());
  const auto tick = std::max(timeout / 4, std::chrono::milliseconds(10));
  Clock::time_point awake_since{};
  while (!stopping_ && timeout.count() > 0) {
    const auto due = Clock::now() + tick;
    t.expires_at(due);
    auto [ec] = co_await t.async_wait(kTuple);
    if (ec || stopping_) co_return;
    const auto now = Clock::now();
    if (now - due > tick / 2) {
      awake_since = now;
      continue;
    }
    for (const auto& w : io_cluster_.workers) {
      auto it = peer_by_key_.find(w.endpoint.str());
      if (it == peer_by_key_.end()) continue;
      const auto& ps = peers_[static_cast<std::size_t>(it->second)];
      if (ps.in.empty() || ps.lost || ps.departed) continue;
      if (now - std::max(ps.last_rx, awake_since) < timeout) continue;
      bool pending = false;  // bytes waiting in the kernel mean the peer is alive
      for (const auto& in : ps.in) {
        boost::system::error_code aec;
        pending = pending || in->sock.available(aec) > 0;
      }
      if (pending) continue;
      mark_lost(it->second, make_error_code(errc::timeout),
                "no heartbeat for " + std::to_string(timeout.count()) + " ms");
    }
  }
}

// Says goodbye on every open connection, so that those peers know this one left by choice, and
// waits for the goodbyes to be written: 2 s for all of them together. A connection still being
// dialled gets no goodbye: its peer never heard from this one (or has left: at the end of a job
// the peers go one after another), and waiting for the dial would hold the shutdown up to the
// connect timeout. From the start nothing is marked lost and nothing new is dialled: a peer
// that leaves has nobody left to tell.
awaitable<void> Mesh::shutdown() {
  KF_DCHECK_IO(driver_);
  stopping_ = true;
  std::vector<std::shared_ptr<SendReq>> byes;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const auto& out = peers_[i].out;
    if (!out || out->closed) continue;
    if (out->connected) {
      byes.push_back(post_control(static_cast<int>(i), FrameType::bye, {}));
    } else {
      out->closed = true;  // dial() gives up at its next attempt
      for (auto& r : out->queue) r->ev.set(make_error_code(errc::closed));
      out->queue.clear();
    }
  }
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  for (auto& b : byes) {
    if (!b->ev.done) {
      b->ev.timer().expires_at(deadline);
      co_await b->ev.timer().async_wait(kTuple);
    }
  }
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  local_acceptor_.close(ignored);
  for (std::size_t i = 0; i < peers_.size(); ++i) force_close(static_cast<int>(i));
}

}  // namespace kf::detail
