// SPDX-License-Identifier: Apache-2.0
// kf::Peer is one worker's endpoint in a job: it listens for its peers, keeps one TCP
// connection per ordered pair of workers that talk (opened lazily, authenticated with the job
// token, kept open), and runs named asynchronous collectives over the current cluster.
//
// Ownership: the Peer owns its I/O context and the I/O thread ("kf-io") that drives every socket;
// collectives run on that context (driven by the I/O thread, or by a thread waiting on a Handle)
// and complete a Handle. Buffers passed to a collective belong to the caller, who keeps them alive
// until the handle completes.
// Thread-safety: collective calls may be made from any thread; calls that must be ordered the
// same way on every worker (collectives sharing a name) must be issued in the same order.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/coll/handle.hpp"
#include "kf/coll/types.hpp"

namespace kf {

/// How a peer reaches the others.
enum class Transport : std::uint8_t {
  /// Unix-domain stream sockets to workers on this host (same host string, or both on the
  /// loopback network), TCP to the others; TCP too when a peer has no local socket. Over a
  /// same-host socket, payloads of at least PeerOptions::single_copy_bytes are not written into
  /// the socket: the receiver copies them straight out of the sender's memory
  /// (process_vm_readv), one copy instead of two, and falls back to the socket when the kernel
  /// refuses (another user, Yama ptrace restrictions). A payload that lies in a
  /// kf::SharedMemory is read by the receiver in place, from a mapping of that memory, without
  /// a copy first (kf/shared_memory.hpp). Small payloads to a same-host worker that
  /// is polling go through a shared-memory ring (PeerOptions::shm_frame_bytes).
  automatic,
  unix_socket,  ///< like automatic, but every payload goes through the socket (no rings)
  tcp,          ///< TCP to every peer
};

/// "auto", "unix" or "tcp"; std::nullopt for anything else.
std::optional<Transport> parse_transport(std::string_view text) noexcept;

/// Which backend runs collectives on CUDA buffers (docs/gpu.md).
enum class DeviceBackend : std::uint8_t {
  /// NCCL when the build has it, else staging.
  automatic,
  /// NCCL: one communicator per cluster version, collectives enqueued on the caller's stream.
  nccl,
  /// The host engine through page-locked host buffers: copies to and from the device
  /// overlapped with the transfers, chunk by chunk. Works in every build with CUDA.
  staging,
};
/// "auto", "nccl" or "staging"; std::nullopt for anything else.
std::optional<DeviceBackend> parse_device_backend(std::string_view text) noexcept;

struct PeerOptions {
  Endpoint listen{"127.0.0.1", 0};  ///< port 0 picks a free port (see Peer::endpoint())
  /// A TCP socket already bound to an address of `listen` (and its port, unless that is 0), to
  /// listen on instead of binding one: kfrun binds each worker's port and hands the socket down
  /// (KF_LISTEN_FD), so that no other process can take the port between the pick and the
  /// worker's start. The peer takes it over and closes it (one it refuses is left alone).
  /// -1: the peer binds `listen` itself.
  int listen_fd = -1;
  std::string job_id = "kf";
  std::string job_token;  ///< must be non-empty
  /// A collective fails when a peer it waits on shows no progress for this long.
  std::chrono::milliseconds timeout{3000};
  /// How long a new connection may take to open and authenticate (peers may start late).
  std::chrono::milliseconds connect_timeout{20000};
  /// How long an accepted connection has to prove the job token (its hello) before it is
  /// closed, or connect_timeout where that is shorter. A genuine dialer answers the challenge
  /// at once; this bounds what a silent or slow client holds.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Accepted connections still in their handshake, at most: in all, and from one source (an
  /// IP address; same-host connections of this worker's own user are not counted against a
  /// source). Connections past either are closed at once, with a warning.
  int max_pending_handshakes = 256;
  int max_pending_handshakes_per_source = 64;
  /// Idle connections carry a heartbeat this often, and a member whose connection to us stays
  /// silent for heartbeat_timeout is lost (zero disables either).
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds heartbeat_timeout{750};
  Algorithm default_algorithm = Algorithm::auto_select;
  /// How long a thread that runs the I/O polls before it sleeps in the kernel: the I/O thread
  /// after a burst of work, and a thread waiting on a collective, which then runs the I/O
  /// itself and reads the reply that completes its collective without any thread hand-off.
  /// Zero: always sleep at once, and waiting threads leave the I/O to the I/O thread. Unset:
  /// 200 us while the workers on this host are no more than its hardware threads, else 1000 us
  /// (either way, with more workers than cores a polling thread yields its core between polls).
  /// A waiting thread doubles its window after each wait whose sleep ended within one more
  /// window, up to 8 ms (or this value, when longer), and halves it after a sleep of more than
  /// four windows.
  std::optional<std::chrono::microseconds> spin;
  Transport transport = Transport::automatic;
  /// Same-host payloads this large or larger that do not go through a shared-memory ring
  /// (shm_frame_bytes) are copied by the receiver straight from the sender's memory
  /// (Transport::automatic only). Smaller ones go through the socket, where one extra copy
  /// costs less than the reply that a single-copy transfer needs. Through the socket against
  /// single copy (kf-bench, 2 and 4 workers, rings off): frames up to 128 KiB are 10-15 % faster
  /// through the socket, 512 KiB ones even, 1-2 MiB ones 10-25 % faster single-copy.
  std::size_t single_copy_bytes = std::size_t{512} << 10;
  /// Same-host data frames up to this many payload bytes go through a shared-memory ring that
  /// the receiver polls, without a system call, while the receiver is awake and nothing waits
  /// in the connection's socket queue (Transport::automatic only; 0 turns the rings off; at
  /// most 1 MiB, the largest record of a ring). Larger ones, and frames to a receiver that
  /// sleeps in the kernel, go single-copy or through the socket. With kf-bench at 2 workers,
  /// 1 MiB allreduces (512 KiB frames) take 150-230 us through rings against 450-660
  /// single-copy, 2 MiB ones 610-740 us against 1180-1230.
  std::size_t shm_frame_bytes = std::size_t{1} << 20;
  /// SO_SNDBUF and SO_RCVBUF of every connection; 0: the system's for TCP and 4 MiB for
  /// same-host sockets (whose default of about 200 KiB makes large frames move in small copies).
  std::size_t socket_buffer_bytes = 0;
  /// Allreduces of at most this many bytes, and barriers, over a power-of-two number of
  /// workers with recursive doubling (what `auto` picks for small messages; up to 64 KiB, the
  /// plan's own limit for it) run on the express path: each round one frame to one partner,
  /// offered straight to the waiting collective, with no plan, lane or per-transfer request.
  /// Its frames are the plan's, so workers with different settings interoperate. 0 turns it
  /// off (KF_EXPRESS_BYTES). It costs about 1.5k instructions per allreduce against 2.5k through
  /// a plan (callgrind, 4 B); with kf-bench on 2 cores, same host, 2 workers at 16 KiB take 6.4
  /// us with it and 7.4-7.6 us without, 4 workers at 4 B 7.3-8 us against 9-14 us.
  std::size_t express_bytes = std::size_t{64} << 10;
  /// Device buffers: which backend moves them (KF_DEVICE_BACKEND).
  DeviceBackend device_backend = DeviceBackend::automatic;
  /// The staging backend splits allreduces and broadcasts into chunks of about this many bytes,
  /// so that one chunk's copies to and from the device overlap another's transfer.
  std::size_t staging_chunk_bytes = std::size_t{4} << 20;
  /// Every frame on a connection between hosts carries a MAC under a key of that connection
  /// (AES-256-GMAC; docs/protocol.md, "Frame MACs"), so that nobody on the path can alter or
  /// inject one. Off (KF_FRAME_AUTH=off) only on a network that is trusted; every worker of a
  /// job must have the same setting (a peer with the other one is refused at the handshake).
  /// Same-host connections carry no MACs: only processes of this user are trusted there.
  bool frame_auth = true;
  /// The MACs are computed with a vector GHASH where the processor has AVX-512 with VPCLMULQDQ
  /// (about twice OpenSSL's speed), else with OpenSSL's AES-GCM; both give the same tags. True
  /// (KF_FRAME_AUTH=openssl) takes OpenSSL's everywhere, to compare the two.
  bool frame_auth_openssl = false;
  std::size_t max_frame_bytes = std::size_t{64} << 20;  ///< larger transfers are split
  /// Frames that arrive before their receive is posted are kept while they take no more than
  /// this, each charged its payload, its name and 64 bytes of bookkeeping; one peer's no more
  /// than max_unexpected_bytes_per_peer. A peer that sends past a limit has its connection
  /// closed as a protocol violation (and counts as lost).
  std::size_t max_unexpected_bytes = std::size_t{2} << 30;
  /// Invitations (Peer::invite) received and not yet taken (wait_invitation), at most: this
  /// many, and this many payload bytes. Past either, newer ones are dropped with a warning.
  std::size_t max_invitations = 4096;
  std::size_t max_invitation_bytes = std::size_t{256} << 20;
  std::size_t max_unexpected_bytes_per_peer = std::size_t{1} << 30;
};

/// Payload bytes of the data frames this peer has sent, by the path they took.
struct TransportStats {
  std::uint64_t tcp_bytes = 0;          ///< written into TCP connections
  std::uint64_t socket_bytes = 0;       ///< written into same-host (Unix-domain) sockets
  std::uint64_t single_copy_bytes = 0;  ///< copied by the receiver straight out of this process
  /// Received single-copy payloads this worker read in place from a peer's kf::SharedMemory
  /// (mapped, without copying them out first).
  std::uint64_t shared_read_bytes = 0;
  /// Single-copy frames whose receiver could not copy from this process (they were then
  /// written into the socket, and the connection stopped trying).
  std::uint64_t single_copy_refused = 0;
  /// Small same-host payloads passed through a shared-memory ring (no system call per frame).
  std::uint64_t shm_bytes = 0;
  /// Received before the matching receive was posted: held in kf's buffers (pooled when large)
  /// and copied once more when the receive comes.
  std::uint64_t early_bytes = 0;
  /// Connections that could not be accepted (the listener failed: out of descriptors, say);
  /// each failure is followed by a growing pause, up to a second, before the next try.
  std::uint64_t accept_failures = 0;
  /// Accepted connections closed at once because too many handshakes were pending
  /// (PeerOptions::max_pending_handshakes).
  std::uint64_t handshakes_refused = 0;
};

namespace detail {
class PeerImpl;
}

struct Env;

/// A request to join a running job, received from one of its members (see Peer::invite).
struct Invitation {
  Endpoint from;              ///< the member that sent it
  std::uint64_t version = 0;  ///< the sender's cluster version when it sent it
  std::string payload;        ///< what the sender passed to invite() (kf::Session: JSON)
};

class Peer {
 public:
  /// Binds the listening socket and starts the I/O thread. Throws: kf::Error when the address
  /// cannot be bound; std::invalid_argument for an empty token.
  explicit Peer(PeerOptions opts);
  /// Sends a goodbye to every connected peer, waits a bounded time for queued frames to leave,
  /// then closes everything. Never throws.
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  /// A worker started by kfrun: options and the initial cluster from the KF_* environment,
  /// already started. Throws: std::invalid_argument naming the bad variable; kf::Error.
  static std::unique_ptr<Peer> from_environment();
  /// The options from_environment() uses: listen address, job, token, timeouts, algorithm.
  /// Throws: std::invalid_argument naming a bad variable (e.g. an unknown KF_ALGORITHM).
  static PeerOptions options_from(const Env& env);

  /// The address this peer listens on (with the actual port when 0 was asked for).
  Endpoint endpoint() const;

  /// Adopts a cluster: this peer's rank is its index there. Call before the first collective.
  /// Throws: kf::Error(errc::not_member) when this peer is not in the cluster.
  void start(const Cluster& cluster);

  /// Moves to a newer cluster version (after a resize or a failure): this peer's rank becomes
  /// its index there, connections to workers that stay are kept and joiners are dialled on first
  /// use; a broken version's failure state is cleared. Call between steps, with no collective
  /// of this peer in flight.
  /// Throws: kf::Error(errc::not_member) when this peer is not in `cluster`;
  /// kf::Error(errc::stale_version) when its version is not newer than the current one.
  void update(const Cluster& cluster);

  /// The members of the current version this peer knows to be gone (connection broken without
  /// a goodbye, no progress within the timeout, or reported by another member).
  std::vector<Endpoint> lost_peers() const;

  /// Sends `payload` (at most 1 MiB) to the worker listening at `to`, which need not be a
  /// member of the current cluster; it is dialled if needed. The handle completes when the
  /// frame has been written, and fails when `to` cannot be reached within connect_timeout.
  Handle invite(const Endpoint& to, std::string payload);
  /// Waits up to `timeout` for an invitation from any authenticated peer; invitations are kept
  /// in arrival order until taken (at most PeerOptions::max_invitations and
  /// max_invitation_bytes of them). Returns nullopt on timeout.
  std::optional<Invitation> wait_invitation(std::chrono::milliseconds timeout);

  int rank() const noexcept;
  int size() const noexcept;
  std::uint64_t version() const noexcept;
  const Cluster& cluster() const noexcept;

  // ---- point-to-point messages: two workers only, no collective ----

  /// Sends `buf` (host memory) to the worker of rank `to` as the message `name`, in frames of
  /// at most max_frame_bytes. Only the two workers take part: the receiver takes the message
  /// with try_receive() whenever it looks; until then its worker keeps it, counted against
  /// max_unexpected_bytes and max_unexpected_bytes_per_peer (a sender that goes past them has
  /// its connection closed and is lost, so bound what is outstanding, e.g. by an answer).
  /// Messages of one name from one sender are received in the order sent. A message belongs to
  /// the cluster version it was sent in: a receiver that has moved to another version never
  /// takes it. Names share the mailbox with collectives: give messages names of their own.
  /// The handle completes when the frames are written (then `buf` may change), and fails when
  /// `to` cannot be reached; it fails at once with invalid_argument for a bad rank (self
  /// included), name or device buffer.
  Handle send(int to, std::string_view name, Buffer buf);
  /// Takes the message `name` from rank `from` of the current version if the whole of it has
  /// arrived: copies it into `buf` and returns true. Returns false at once when it has not (yet).
  /// Throws: kf::Error(invalid_argument) for a bad rank, name or buffer;
  /// kf::Error(protocol_error) when the message that came is not buf's size (it is dropped).
  bool try_receive(int from, std::string_view name, Buffer buf);
  /// Receives the message `name` from rank `from` of the current version into `buf`: the
  /// handle completes once the whole of it is there (at once when it came before). It fails
  /// when `from` is lost or the version breaks, like a collective's receive, and at once with
  /// invalid_argument for a bad rank, name or buffer; a frame of another size than `buf`
  /// expects fails it and closes that connection (as a collective's frame would). `buf` is
  /// written until the handle completes: wait for it before `buf` goes. A receive takes the next
  /// message of its name; while one is pending, do not try_receive that name from that sender.
  Handle receive(int from, std::string_view name, Buffer buf);

  /// recv = OP over all workers of send (send and recv may be the same buffer).
  Handle allreduce(std::string_view name, Buffer send, Buffer recv, const CollOptions& o = {});
  /// buf on every worker = buf on opts.root.
  Handle broadcast(std::string_view name, Buffer buf, const CollOptions& o = {});
  /// recv (size * send.count elements) = every worker's send, in rank order.
  Handle allgather(std::string_view name, Buffer send, Buffer recv, const CollOptions& o = {});
  /// send has size * recv.count elements; worker r gets block r of the reduction. recv may
  /// overlap send (e.g. be its first block).
  Handle reduce_scatter(std::string_view name, Buffer send, Buffer recv, const CollOptions& o = {});
  /// recv on opts.root (size * send.count elements) = every worker's send; ignored elsewhere.
  Handle gather(std::string_view name, Buffer send, Buffer recv, const CollOptions& o = {});
  /// Completes on every worker once all workers have entered it.
  Handle barrier(std::string_view name, const CollOptions& o = {});
  /// *agreed = whether every worker passed the same bytes (same length and content).
  Handle consensus(std::string_view name, Buffer data, bool* agreed, const CollOptions& o = {});

  /// Changes the job's default algorithm (what Algorithm::job_default resolves to) for
  /// collectives started from now on. Every worker must change it at the same point of the
  /// job (kf::Session does so at a step boundary).
  void set_default_algorithm(Algorithm a) noexcept;

  /// The algorithm a call with these options would use for `bytes` (resolves job_default and
  /// auto through the cost model).
  Algorithm resolve(CollOp op, Algorithm a, std::size_t bytes) const noexcept;

  /// The backend that runs this peer's collectives on device buffers: "nccl" or "staging" once
  /// the first one ran, "none" before, "unavailable: REASON" when device buffers cannot work
  /// here (no CUDA in the build, no device).
  std::string device_backend() const;
  /// What the data frames sent so far took: which transport, and how much went single-copy.
  /// Thread-safe.
  TransportStats transport_stats() const noexcept;

  /// Counts the messages named `name` that arrive before their receive (from any sender, of
  /// any version), so that a loop polling a rare message need not call try_receive() (a
  /// hand-off to the I/O thread per sender) while watched_arrivals() has not changed: read it
  /// first, then try_receive() what came. One name per peer; a later call replaces it.
  void watch_arrivals(std::string name);
  /// The count of watch_arrivals(); thread-safe and without a hand-off.
  std::uint64_t watched_arrivals() const noexcept;
  /// Whether the current cluster version broke (a member lost, a peer on a newer version):
  /// every collective of it fails from then on. Thread-safe and without a hand-off.
  bool version_broken() const noexcept;

 private:
  std::unique_ptr<detail::PeerImpl> impl_;
};

}  // namespace kf
