// SPDX-License-Identifier: Apache-2.0
// kf::Peer's public surface: construction from options or the environment, and the calls that
// hand collectives and cluster versions to the peer's private side (peer_impl.hpp).
#include "kf/peer.hpp"

#include <stdexcept>

#include "common/recycle.hpp"
#include "kf/common/env.hpp"
#include "kf/common/fd.hpp"
#include "peer_impl.hpp"

namespace kf {

std::optional<Transport> parse_transport(std::string_view text) noexcept {
  if (text == "auto") return Transport::automatic;
  if (text == "unix") return Transport::unix_socket;
  if (text == "tcp") return Transport::tcp;
  return std::nullopt;
}

std::optional<DeviceBackend> parse_device_backend(std::string_view text) noexcept {
  if (text == "auto") return DeviceBackend::automatic;
  if (text == "nccl") return DeviceBackend::nccl;
  if (text == "staging") return DeviceBackend::staging;
  return std::nullopt;
}

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
  // The first peer of the process takes the inherited socket; a later one binds the port itself.
  if (e.listen_fd) o.listen_fd = claim_inherited_fd(*e.listen_fd);
  o.job_id = e.job_id;
  o.job_token = e.job_token;
  if (e.timeout) o.timeout = *e.timeout;
  if (e.spin) o.spin = *e.spin;
  if (e.express_bytes) o.express_bytes = *e.express_bytes;
  if (e.heartbeat_timeout) {
    o.heartbeat_timeout = *e.heartbeat_timeout;
    o.heartbeat_interval = *e.heartbeat_timeout / 4;
  }
  if (e.connect_timeout) o.connect_timeout = *e.connect_timeout;
  // The environment beats the cluster's settings (docs/configuration.md); the message names
  // where the bad value came from.
  std::optional<std::string> algo = e.algorithm;
  std::string source = std::string(env::kAlgorithm);
  if (!algo && e.cluster.settings.contains("algorithm") &&
      e.cluster.settings["algorithm"].is_string()) {
    algo = e.cluster.settings["algorithm"].get<std::string>();
    source = "the cluster setting algorithm";
  }
  if (algo) {
    auto a = parse_algorithm(*algo);
    if (!a) {
      throw std::invalid_argument(
          source + "='" + *algo +
          "' is not one of auto, star, ring, tree, clique, rhd, hierarchical");
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
  if (e.frame_auth) {
    const std::string& v = *e.frame_auth;
    if (v == "on" || v == "1" || v == "true") {
      o.frame_auth = true;
    } else if (v == "openssl") {
      o.frame_auth = true;
      o.frame_auth_openssl = true;
    } else if (v == "off" || v == "0" || v == "false") {
      o.frame_auth = false;
    } else {
      throw std::invalid_argument(std::string(env::kFrameAuth) + "='" + v +
                                  "' is not one of on, off, openssl");
    }
  }
  if (e.device_backend) {
    auto b = parse_device_backend(*e.device_backend);
    if (!b) {
      throw std::invalid_argument(std::string(env::kDeviceBackend) + "='" + *e.device_backend +
                                  "' is not one of auto, nccl, staging");
    }
    o.device_backend = *b;
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

Handle Peer::send(int to, std::string_view name, Buffer buf) { return impl_->send(to, name, buf); }

bool Peer::try_receive(int from, std::string_view name, Buffer buf) {
  return impl_->try_receive(from, name, buf);
}

Handle Peer::receive(int from, std::string_view name, Buffer buf) {
  return impl_->receive(from, name, buf);
}

Handle Peer::invite(const Endpoint& to, std::string payload) {
  return impl_->invite(to, std::move(payload));
}
std::optional<Invitation> Peer::wait_invitation(std::chrono::milliseconds timeout) {
  return impl_->wait_invitation(timeout);
}
std::string Peer::device_backend() const { return impl_->device_backend(); }

void Peer::watch_arrivals(std::string name) { impl_->watch_arrivals(std::move(name)); }
std::uint64_t Peer::watched_arrivals() const noexcept {
  return impl_->mailbox().watched_arrivals();
}
bool Peer::version_broken() const noexcept { return impl_->version_broken(); }

TransportStats Peer::transport_stats() const noexcept {
  const auto& c = impl_->counters();
  TransportStats t;
  t.tcp_bytes = c.tcp_bytes.load(std::memory_order_relaxed);
  t.socket_bytes = c.socket_bytes.load(std::memory_order_relaxed);
  t.single_copy_bytes = c.single_copy_bytes.load(std::memory_order_relaxed);
  t.single_copy_refused = c.single_copy_refused.load(std::memory_order_relaxed);
  t.shared_read_bytes = c.shared_read_bytes.load(std::memory_order_relaxed);
  t.shm_bytes = c.shm_bytes.load(std::memory_order_relaxed);
  t.early_bytes = impl_->mailbox().early_bytes();
  t.accept_failures = c.accept_failures.load(std::memory_order_relaxed);
  t.handshakes_refused = c.handshakes_refused.load(std::memory_order_relaxed);
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
  auto c = detail::make_recycled<detail::CollCtx>();
  c->op = op;
  // Into the recycled context's own buffer: a name as long as one it held before needs no
  // allocation. Appended to the empty name a fresh or recycled context has: the plain copy,
  // without assign's handling of a source inside the string itself.
  c->name.append(name);
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
Handle Peer::reduce_scatter(std::string_view name, Buffer send, Buffer recv, const CollOptions& o) {
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
