// SPDX-License-Identifier: Apache-2.0
// The mesh's setup and its table of peers: the listeners, cluster versions adopted, lost
// members, and invitations (mesh/mesh.hpp).
#include "mesh/mesh.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

#include "kf/common/fd.hpp"
#include "kf/common/log.hpp"

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

Mesh::Mesh(const PeerOptions& opts, asio::io_context& ioc, Driver& driver, Mailbox& mailbox)
    : opts_(opts),
      peer_key_(derive_key(opts.job_token, KeyUse::peers)),
      ioc_(ioc),
      driver_(driver),
      mailbox_(mailbox),
      acceptor_(ioc),
      local_acceptor_(ioc),
      sent_(std::make_shared<SendReq>(ioc.get_executor())) {
  sent_->ev.set({});
  const tcp::endpoint ep = resolve_listen(ioc_, opts_.listen);
  boost::system::error_code ec;
  if (opts_.listen_fd >= 0) {
    adopt_listener(ep);
  } else {
    acceptor_.open(ep.protocol(), ec);
    if (!ec) set_close_on_exec(acceptor_.native_handle());
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (ec) {
      throw Error(make_error_code(errc::invalid_argument),
                  "cannot listen on " + opts_.listen.str() + ": " + ec.message());
    }
  }
  self_ = Endpoint{opts_.listen.host, acceptor_.local_endpoint().port()};
  identity_ = self_.str();
  if (!opts_.frame_auth) {
    KF_LOG(warn, "transport",
           "{}: frame MACs are off (KF_FRAME_AUTH=off): frames from other hosts are not "
           "authenticated, so anyone on the network path could alter or inject them; for "
           "trusted networks only",
           identity_);
  }
  // The same-host socket listens before the TCP port does: a peer on this host dials the former
  // first and falls back to TCP when it is refused, so in the other order a peer that dialled in
  // between would stay on TCP for good (this happened at job start, about one run in six).
  if (opts_.transport != Transport::tcp) {
    // The same-host listener is an optimisation: without it, peers on this host use TCP.
    const std::string name = local_socket_name(self_);
    local_acceptor_.open(local_stream(), ec);
    if (!ec) set_close_on_exec(local_acceptor_.native_handle());
    if (!ec) local_acceptor_.bind(local_stream::endpoint(name), ec);
    if (!ec) local_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec == boost::asio::error::address_in_use) {
      // Another process holds this worker's name: one left from an earlier run, or one squatting
      // on it. Peers on this host that dial the name reach that process, which cannot prove the
      // job token (nor passes their user check), and fall back to TCP.
      KF_LOG(warn, "transport",
             "{}: the same-host socket name of this worker is taken by another process; peers "
             "on this host reach it over TCP",
             identity_);
    } else if (ec) {
      KF_LOG(info, "transport", "{}: no same-host socket ({}); peers on this host use TCP",
             identity_, ec.message());
    }
    if (ec) {
      boost::system::error_code ignored;
      local_acceptor_.close(ignored);
    }
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Error(make_error_code(errc::invalid_argument),
                "cannot listen on " + opts_.listen.str() + ": " + ec.message());
  }
}

void Mesh::adopt_listener(const tcp::endpoint& ep) {
  const int fd = opts_.listen_fd;
  const std::string what =
      "the listening socket handed down (descriptor " + std::to_string(fd) + ", KF_LISTEN_FD)";
  // A descriptor that is refused is left open: the number may name something else of this
  // process (a wrong KF_LISTEN_FD), which is not the peer's to close.
  const auto refuse = [&](const std::string& why) {
    throw Error(make_error_code(errc::invalid_argument), what + " " + why);
  };
  int domain = 0;
  int type = 0;
  socklen_t length = sizeof domain;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &length) != 0) {
    const int error = errno;
    refuse(error == EBADF ? "is not an open descriptor"
                          : std::string("is not a socket: ") + std::strerror(error));
  }
  length = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
      (domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM) {
    refuse("is not a TCP socket");
  }
  sockaddr_storage bound{};
  length = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    refuse(std::string("has no address: ") + std::strerror(errno));
  }
  tcp::endpoint at;
  if (length > at.capacity()) refuse("has an address too long for TCP");
  std::memcpy(at.data(), &bound, length);
  at.resize(length);
  if (at.port() == 0 || (opts_.listen.port != 0 && at.port() != opts_.listen.port)) {
    refuse("is bound to port " + std::to_string(at.port()) + ", not to " + opts_.listen.str() +
           "'s");
  }
  // Peers dial the listen address: the socket must be bound to it (or to every address).
  if (!at.address().is_unspecified() && at.address() != ep.address()) {
    boost::system::error_code ec;
    tcp::resolver resolver(ioc_);
    bool found = false;
    for (const auto& entry : resolver.resolve(opts_.listen.host, "", ec)) {
      found = found || entry.endpoint().address() == at.address();
    }
    if (!found) {
      refuse("is bound to " + at.address().to_string() + ", not to an address of " +
             opts_.listen.host);
    }
  }
  boost::system::error_code ec;
  acceptor_.assign(domain == AF_INET ? tcp::v4() : tcp::v6(), fd, ec);
  if (ec) refuse("cannot be used: " + ec.message());
  set_close_on_exec(fd);
}

void Mesh::start() {
  // Accepting starts once nothing can throw any more (early dialers wait in the backlogs).
  asio::co_spawn(ioc_, accept_loop(acceptor_), asio::detached);
  if (local_acceptor_.is_open()) {
    asio::co_spawn(ioc_, accept_loop(local_acceptor_), asio::detached);
  }
  asio::co_spawn(ioc_, watchdog(), asio::detached);
}

std::vector<int> Mesh::adopt(const Cluster& c, int rank) {
  KF_DCHECK_IO(driver_);
  std::vector<int> idx;
  for (const auto& w : c.workers) {
    const int i = peer_index(w.endpoint);
    // A member of the new version starts with a clean record (a restarted worker may reuse a
    // lost one's address).
    peers_[static_cast<std::size_t>(i)].lost = false;
    peers_[static_cast<std::size_t>(i)].departed = false;
    idx.push_back(i);
  }
  mailbox_.drop_older(c.version);
  broken_ = {};
  broken_why_.clear();
  io_cluster_ = c;
  io_rank_ = rank;
  return idx;
}

std::vector<Endpoint> Mesh::lost_peers() const {
  KF_DCHECK_IO(driver_);
  std::vector<Endpoint> out;
  for (const auto& w : io_cluster_.workers) {
    auto it = peer_by_key_.find(w.endpoint.str());
    if (it != peer_by_key_.end() && peers_[static_cast<std::size_t>(it->second)].lost) {
      out.push_back(w.endpoint);
    }
  }
  return out;
}

int Mesh::peer_index(const Endpoint& ep) {
  KF_DCHECK_IO(driver_);
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
  PendingInvite(std::shared_ptr<OpState> s, std::string t)
      : state(std::move(s)), to(std::move(t)) {}
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

Handle Mesh::invite(const Endpoint& to, std::string payload) {
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
        pending.state->complete(req->ev.ec, req->ev.ec
                                                ? "invitation to " + to.str() +
                                                      " was not delivered: " + req->ev.ec.message()
                                                : std::string());
      },
      asio::detached);
  return h;
}

std::optional<Invitation> Mesh::wait_invitation(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(invite_mu_);
  // A zero timeout only looks: a timed wait that has expired already still enters the kernel,
  // and on a busy machine gives the core away (the session looks once per step).
  if (invitations_.empty() && (timeout.count() <= 0 || !invite_cv_.wait_for(lk, timeout, [&] {
        return !invitations_.empty();
      }))) {
    return std::nullopt;
  }
  Invitation inv = std::move(invitations_.front());
  invitations_.pop_front();
  invitation_bytes_ -= inv.payload.size();
  return inv;
}

}  // namespace kf::detail
