// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/ports.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <stdexcept>
#include <system_error>

namespace kf::tools {

namespace {

std::uint16_t parse_port(std::string_view digits, std::string_view text) {
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc{} || ptr != digits.data() + digits.size() || port == 0 ||
      port > 65535) {
    throw std::invalid_argument("port range '" + std::string(text) + "': '" + std::string(digits) +
                                "' is not a port number in 1-65535");
  }
  return static_cast<std::uint16_t>(port);
}

// The address to test-bind: the first one `host` resolves to, with port 0.
sockaddr_storage resolve(const std::string& host, socklen_t& length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    throw std::invalid_argument("host '" + host + "' does not resolve: " + ::gai_strerror(rc));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return address;
}

void set_port(sockaddr_storage& address, std::uint16_t port) {
  if (address.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6&>(address).sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in&>(address).sin_port = htons(port);
  }
}

// A socket bound to the port (not open when the port is in use). Throws: std::invalid_argument
// when the address cannot be bound at all (not local), std::system_error when no socket can be
// made.
UniqueFd bind_port(sockaddr_storage address, socklen_t length, std::uint16_t port,
                   const std::string& host) {
  set_port(address, port);
  UniqueFd fd(::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.is_open()) throw std::system_error(errno, std::generic_category(), "socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0) {
    if (fd.get() > STDERR_FILENO) return fd;
    // Started with stdin, stdout or stderr closed: move it above them (a worker's 0-2 are set).
    UniqueFd moved(::fcntl(fd.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
    if (!moved.is_open()) throw std::system_error(errno, std::generic_category(), "fcntl");
    return moved;
  }
  const int error = errno;
  if (error == EADDRINUSE || error == EACCES) return {};
  throw std::invalid_argument("cannot bind a port on host '" + host +
                              "' (is it an address of this machine?): " + std::strerror(error));
}

// True when the port could be bound; false when it is in use. Throws: as bind_port.
bool try_bind(sockaddr_storage address, socklen_t length, std::uint16_t port,
              const std::string& host) {
  return bind_port(address, length, port, host).is_open();
}

}  // namespace

PortRange PortRange::parse(std::string_view text) {
  const auto dash = text.find('-');
  if (dash == std::string_view::npos) {
    throw std::invalid_argument("port range '" + std::string(text) + "' is not of the form A-B");
  }
  PortRange range{parse_port(text.substr(0, dash), text), parse_port(text.substr(dash + 1), text)};
  if (range.first > range.last) {
    throw std::invalid_argument("port range '" + std::string(text) + "' is empty (A > B)");
  }
  return range;
}

bool is_local_host(const std::string& host) {
  socklen_t length = 0;
  sockaddr_storage address = resolve(host, length);
  set_port(address, 0);
  const int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), length);
  ::close(fd);
  return rc == 0;
}

UniqueFd bind_worker_port(const std::string& host, std::uint16_t port) {
  socklen_t length = 0;
  const sockaddr_storage address = resolve(host, length);
  return bind_port(address, length, port, host);
}

bool port_is_free(const std::string& host, std::uint16_t port) {
  socklen_t length = 0;
  const sockaddr_storage address = resolve(host, length);
  return try_bind(address, length, port, host);
}

PortPick pick_ports_for(const std::string& host, PortRange range, int count_ports,
                        const std::vector<std::uint16_t>& taken) {
  const auto is_taken = [&](std::uint16_t p) {
    return std::find(taken.begin(), taken.end(), p) != taken.end();
  };
  PortPick pick;
  if (is_local_host(host)) {
    pick.ports = pick_free_ports(host, range, count_ports, taken);
    return pick;
  }
  pick.checked = false;
  const std::size_t span = range.count_ports();
  std::random_device seed;
  const std::size_t start = std::uniform_int_distribution<std::size_t>(0, span - 1)(seed);
  for (std::size_t i = 0; i < span && std::ssize(pick.ports) < count_ports; ++i) {
    const auto port = static_cast<std::uint16_t>(range.first + (start + i) % span);
    if (!is_taken(port)) pick.ports.push_back(port);
  }
  if (std::ssize(pick.ports) < count_ports) {
    throw std::invalid_argument("port range " + range.str() + " has only " +
                                std::to_string(pick.ports.size()) + " ports left for " + host +
                                ", " + std::to_string(count_ports) + " needed (use --port-range)");
  }
  return pick;
}

std::vector<std::uint16_t> pick_free_ports(const std::string& host, PortRange range,
                                           int count_ports,
                                           const std::vector<std::uint16_t>& skip) {
  socklen_t length = 0;
  const sockaddr_storage address = resolve(host, length);
  const std::size_t span = range.count_ports();
  std::random_device seed;
  const std::size_t start = std::uniform_int_distribution<std::size_t>(0, span - 1)(seed);
  std::vector<std::uint16_t> ports;
  for (std::size_t i = 0; i < span && std::ssize(ports) < count_ports; ++i) {
    const auto port = static_cast<std::uint16_t>(range.first + (start + i) % span);
    if (std::find(skip.begin(), skip.end(), port) != skip.end()) continue;
    if (try_bind(address, length, port, host)) ports.push_back(port);
  }
  if (std::ssize(ports) < count_ports) {
    throw std::invalid_argument("port range " + range.str() + " has only " +
                                std::to_string(ports.size()) + " free ports on " + host + ", " +
                                std::to_string(count_ports) + " needed (use --port-range)");
  }
  return ports;
}

}  // namespace kf::tools
