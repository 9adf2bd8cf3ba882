// SPDX-License-Identifier: Apache-2.0
// Choosing the TCP ports of a static job: a port range ("A-B") and a picker that test-binds
// candidates on the host, starting at a random offset so that concurrent jobs on one host rarely
// race for the same ports. A picked port is only known to have been free when it was tested;
// kfrun binds it again when it starts the worker (bind_worker_port) and hands the worker that
// socket, so the port is held from then on. Thread-safety: free functions and a value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

/// An inclusive range of TCP ports, first <= last, both in 1..65535.
struct PortRange {
  // Below Linux's ephemeral range (32768-60999 by default): a port in it can be taken by an
  // outgoing connection between the pick and the worker's bind, and listen() then fails.
  std::uint16_t first = 10000;
  std::uint16_t last = 32767;

  std::size_t count_ports() const noexcept { return std::size_t{last} - first + 1; }
  std::string str() const { return std::to_string(first) + "-" + std::to_string(last); }

  /// Parses "A-B" with 1 <= A <= B <= 65535. Throws: std::invalid_argument saying what is wrong.
  static PortRange parse(std::string_view text);
  friend bool operator==(const PortRange&, const PortRange&) = default;
};

/// Picks `count_ports` distinct ports of `range` that can be bound on `host` now (a name or an
/// address literal; the first address it resolves to is tested). Each candidate is bound without
/// SO_REUSEADDR and closed at once; a port in use, or one in `skip`, is passed over. The search
/// starts at a random offset and wraps around the range once.
/// Throws: std::invalid_argument when `host` does not resolve or is not an address of this
/// machine, or when the range cannot supply `count_ports` free ports (the message names the
/// range); std::system_error when a socket cannot be created.
std::vector<std::uint16_t> pick_free_ports(const std::string& host, PortRange range,
                                           int count_ports,
                                           const std::vector<std::uint16_t>& skip = {});

/// Whether `host` resolves to an address of this machine (one a socket can be bound to).
/// Throws: std::invalid_argument when it does not resolve; std::system_error when a socket
/// cannot be created.
bool is_local_host(const std::string& host);

/// A TCP socket (close-on-exec) bound to `port` of `host` (an address of this machine, the first
/// it resolves to), not listening, for a worker to take over (KF_LISTEN_FD): bound without
/// SO_REUSEADDR, so no other socket, of any user, can bind the port while it is open. Not open
/// when the port is in use. Throws: as pick_free_ports.
UniqueFd bind_worker_port(const std::string& host, std::uint16_t port);

/// Whether `port` can be bound on `host` (an address of this machine) now: false when it is in
/// use. Throws: as pick_free_ports.
bool port_is_free(const std::string& host, std::uint16_t port);

/// Ports for workers on `host`, none of them in `taken`: test-bound free ones (pick_free_ports)
/// when `host` is this machine; otherwise `count_ports` distinct ones drawn at random from
/// `range` and not checked (`checked` false), for the host's agent to move should one be in
/// use there. Throws: std::invalid_argument when `host` does not resolve or the range has too
/// few ports.
struct PortPick {
  std::vector<std::uint16_t> ports;
  bool checked = true;
};
PortPick pick_ports_for(const std::string& host, PortRange range, int count_ports,
                        const std::vector<std::uint16_t>& taken);

}  // namespace kf::tools
