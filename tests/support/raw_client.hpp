// SPDX-License-Identifier: Apache-2.0
// Test helpers that talk to a kf::Peer the way another worker would, byte by byte: connect over
// TCP or the same-host socket, read and write frames, and run the dialer's side of the handshake.
// For the robustness tests and the frame-reader fuzz harness. Thread-safety: free functions.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kf/cluster/cluster.hpp"
#include "kf/common/keys.hpp"
#include "transport/auth.hpp"
#include "transport/frame.hpp"
#include "transport/frame_mac.hpp"

namespace kf::test {

/// connect(2) that a signal does not cut short: the connection goes on in the kernel, so an
/// interrupted call waits for it to finish. True when connected.
inline bool connect_socket(int s, const sockaddr* a, socklen_t len) {
  if (::connect(s, a, len) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{s, POLLOUT, 0};
  while (::poll(&p, 1, 10'000) < 0 && errno == EINTR) {
  }
  int error = 0;
  socklen_t size = sizeof error;
  return ::getsockopt(s, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0 &&
         (p.revents & POLLOUT) != 0;
}

/// A TCP connection to `ep`'s port on 127.0.0.1, or -1.
inline int connect_to(const Endpoint& ep) {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(ep.port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (!connect_socket(s, reinterpret_cast<sockaddr*>(&a), sizeof a)) {
    ::close(s);
    return -1;
  }
  return s;
}

/// A connection to the worker's same-host socket ("\0kf/HOST:PORT"), or -1.
inline int connect_local(const Endpoint& ep) {
  const std::string name = std::string(1, '\0') + "kf/" + ep.str();
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (!connect_socket(s, reinterpret_cast<sockaddr*>(&a), len)) {
    ::close(s);
    return -1;
  }
  return s;
}

inline bool read_all(int s, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t got = ::recv(s, b, n, 0);
    if (got < 0 && errno == EINTR) continue;  // a signal (a fuzzer's timer), not the peer
    if (got <= 0) return false;
    b += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

/// Reads one frame's header and payload (the handshake's frames).
inline bool read_frame(int s, transport::FrameHeader& h, std::vector<std::byte>& payload) {
  transport::HeaderBytes hb;
  std::string why;
  if (!read_all(s, hb.data(), hb.size()) || !transport::decode(hb, 1 << 20, h, why)) return false;
  payload.resize(h.payload_bytes);
  return read_all(s, payload.data(), payload.size());
}

/// Writes a frame of type `t` with no name. False when the connection would not take it all.
inline bool send_frame(int s, transport::FrameType t, const std::vector<std::byte>& payload) {
  transport::FrameHeader h;
  h.type = t;
  h.payload_bytes = payload.size();
  const auto hb = transport::encode(h);
  std::vector<std::byte> frame(hb.begin(), hb.end());
  frame.insert(frame.end(), payload.begin(), payload.end());
  // One write: a frame in two would wait on TCP's delayed acknowledgement.
  ssize_t n = 0;
  do {
    n = ::send(s, frame.data(), frame.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(frame.size());
}

/// The dialer's side of the handshake, as `identity`, for job "kf" with `token` (frame MACs on,
/// as the test peers have them). Returns the connection's key, whose FrameMac tags what this
/// side sends over TCP; nullopt when the handshake failed.
inline std::optional<Key> authenticate(int s, const std::string& identity,
                                       const std::string& token = "test-token") {
  transport::FrameHeader h;
  std::vector<std::byte> payload;
  if (!read_frame(s, h, payload) || h.type != transport::FrameType::challenge) return std::nullopt;
  transport::Nonce theirs;
  if (payload.size() < theirs.size()) return std::nullopt;
  std::memcpy(theirs.data(), payload.data(), theirs.size());
  const Key peers = derive_key(token, KeyUse::peers);
  // The worker meant: the one at the other end of `s`, a TCP address (test workers listen on
  // 127.0.0.1) or a same-host socket named "\0kf/HOST:PORT".
  sockaddr_storage to{};
  socklen_t to_len = sizeof to;
  if (::getpeername(s, reinterpret_cast<sockaddr*>(&to), &to_len) != 0) return std::nullopt;
  const bool tcp = to.ss_family == AF_INET;
  std::string meant;
  if (tcp) {
    meant =
        "127.0.0.1:" + std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(&to)->sin_port));
  } else {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&to);
    const std::size_t n = to_len - offsetof(sockaddr_un, sun_path);
    meant = std::string(un->sun_path, n);
    if (meant.rfind(std::string(1, '\0') + "kf/", 0) != 0) return std::nullopt;
    meant = meant.substr(4);
  }
  transport::Hello hello{"kf", identity, transport::random_nonce(), {}, true};
  hello.mac = transport::hello_mac(peers, true, tcp, "kf", identity, meant, theirs);
  if (!send_frame(s, transport::FrameType::hello, transport::encode(hello))) return std::nullopt;
  if (!read_frame(s, h, payload) || h.type != transport::FrameType::welcome) return std::nullopt;
  const auto w = transport::decode_welcome(payload);
  if (!w) return std::nullopt;
  return transport::connection_key(peers, theirs, hello.nonce, identity, w->identity);
}

}  // namespace kf::test
