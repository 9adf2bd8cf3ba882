// SPDX-License-Identifier: Apache-2.0
// A port for a worker that a policy adds on this host. Thread-safety: free function.
#pragma once

#include <cstdint>
#include <string>

#include "kf/cluster/cluster.hpp"

namespace kf::detail {

/// A port on `host` that the kernel gave out just now and that `cluster` does not use (the worker
/// that will listen on it is started by the agent on that host, moments later). An `host` that is
/// not an IPv4 address is asked on 127.0.0.1. Throws: std::runtime_error when no port can be had.
std::uint16_t free_port(const std::string& host, const Cluster& cluster);

}  // namespace kf::detail
