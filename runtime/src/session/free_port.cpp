// SPDX-License-Identifier: Apache-2.0
#include "session/free_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace kf::detail {

std::uint16_t free_port(const std::string& host, const Cluster& cluster) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(fd);
    if (!ok) break;
    const auto port = ntohs(a.sin_port);
    bool used = false;
    for (const auto& w : cluster.workers)
      used = used || (w.endpoint.host == host && w.endpoint.port == port);
    if (!used) return port;
  }
  throw std::runtime_error("cannot find a free port on " + host);
}

}  // namespace kf::detail
