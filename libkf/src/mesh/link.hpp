// SPDX-License-Identifier: Apache-2.0
// The mesh's records: one connection in each direction per pair of peers that talk (Outgoing:
// this side dials and writes; Incoming: the other side dialled and this side reads), and what
// this process knows of each remote worker (PeerState). Thread-safety: I/O context only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/asio.hpp"
#include "common/clock.hpp"
#include "kf/cluster/cluster.hpp"
#include "mailbox/request.hpp"
#include "transport/frame_mac.hpp"
#include "transport/shared_map.hpp"
#include "transport/shm/shm_ring.hpp"

namespace kf::detail {

struct Outgoing {
  Outgoing(const asio::any_io_executor& ex, int p) : sock(ex), signal(ex), peer(p) {}
  Stream sock;
  asio::steady_timer signal;  // cancelled when the queue gains an entry
  std::deque<std::shared_ptr<SendReq>> queue;
  int peer;
  bool closed = false;
  bool connected = false;  // dialled and through the handshake
  bool writing = false;    // write_frame is writing to `sock` (a heartbeat counts)
  bool local = false;      // connected over the same-host (Unix-domain) socket
  // Large payloads are left in place for the receiver to copy (transport::kFlagRemote); off
  // once the receiver has answered that it cannot.
  bool single_copy = false;
  // Small data frames go into this shared-memory ring while nothing waits in `queue`
  // (same-host connections the receiver accepted it on; the mesh's post_send).
  std::unique_ptr<transport::ShmRing> ring;
  // Frames written into the socket since the ring was set up, heartbeats not counted: each
  // ring record carries the count, so the receiver keeps the connection's order.
  std::uint64_t socket_frames = 0;
  // Tags the frames after the handshake (a TCP connection with PeerOptions::frame_auth).
  std::unique_ptr<transport::FrameMac> mac;
};

struct Incoming {
  explicit Incoming(Stream s) : sock(std::move(s)), buf(kHandshakeBufBytes) {}
  static constexpr std::size_t kBufBytes = 64 * 1024;
  // The read-ahead buffer's size until the handshake is through (Mesh::admit): a connection
  // that has not proved the job token holds little memory.
  static constexpr std::size_t kHandshakeBufBytes = 512;
  static constexpr std::size_t kReduceChunk = 256 * 1024;  // streamed reductions, cache-sized
  std::vector<std::byte> chunk;  // allocated on the first streamed reduction
  Stream sock;
  int peer = -1;
  // Read-ahead buffer: small frames (header, name, payload) usually arrive in one segment and
  // are parsed from here with one system call; large payloads bypass it.
  std::vector<std::byte> buf;
  std::size_t begin = 0, end = 0;
  // TCP: the read-ahead buffer is filled by peeking, and the bytes are dropped from the socket
  // only before the next read (read_exact). Taking the last bytes out of a TCP
  // socket has Linux send the pending ACK from inside that call (a segment through the whole
  // stack, and the peer's socket taking it in: about 1 us here); a peek leaves it for the drop,
  // which comes after the frames were delivered and the waiter saw its collective complete.
  bool peek = false;
  std::size_t peeked = 0;  // bytes in `buf` still in the socket
  // The last data frame was whole in the read-ahead buffer: the next peeking read takes bytes
  // that are there at once rather than through Asio (read_exact).
  bool small_frames = false;
  // The dialer's process on a same-host connection (SO_PEERCRED), whose memory single-copy
  // frames are read from; 0 over TCP.
  pid_t pid = 0;
  // Whether single-copy frames are copied: false for a dialer running as another user, and
  // once the kernel refused to copy from `pid`.
  bool single_copy = true;
  // The dialer's kf::SharedMemory regions this side mapped (single-copy frames that name one
  // are read in place), and whether it still tries: false once the kernel refused.
  std::unique_ptr<transport::SharedMappings> maps;
  bool map_shared = true;
  // The dialer's shared-memory ring, once it offered one and this side mapped it.
  std::unique_ptr<transport::ShmRing> ring;
  // Socket frames taken (heartbeats not counted) since the ring was set up; a ring record
  // is taken only once this reaches its socket_before.
  std::uint64_t socket_frames = 0;
  // Why the connection was closed from outside its coroutine (a bad ring record).
  std::string closed_why;
  bool tcp = false;  // accepted on the TCP port (not the same-host socket)
  // While in the handshake, what it counts under in Mesh::pending_by_source_ (empty: nothing).
  std::string source;
  // Checks the tags of the frames after the handshake (a TCP connection with frame_auth): the
  // bytes read_exact takes while it is active count towards the frame's tag.
  std::unique_ptr<transport::FrameMac> mac;
};

/// Where a data frame's payload comes from: the connection, or (single-copy) the sender's
/// memory at `remote_addr`, of which `at` bytes were taken already; read in place from `mapped`
/// when the sender's memory is a region this side has mapped.
struct PayloadSource {
  bool remote = false;
  std::uint64_t remote_addr = 0;
  const std::byte* mapped = nullptr;
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
  // Its connection to us broke without a goodbye, and it has not connected again since: most
  // likely its process is gone. Unlike `lost` this outlives a change of cluster version, so
  // that a version someone else wrote with it still in does not wait on it: a dial it refuses
  // fails at once instead of being retried until the connect timeout.
  bool died = false;
  bool no_local = false;  // its same-host socket failed the handshake: use TCP
  // The newest cluster version this peer's frames carried. Frames on a connection arrive in
  // order, so once a peer speaks version W it will never send anything of an older version: a
  // receive from it of an older version can never complete.
  std::uint64_t max_version = 0;
};

/// The abstract Unix-domain socket name of the worker at `ep` ("\0kf/HOST:PORT"): unique on a
/// host because the TCP port is, and gone when the process is.
std::string local_socket_name(const Endpoint& ep);

}  // namespace kf::detail
