// SPDX-License-Identifier: Apache-2.0
// The host part of an address: a config service URL, kf-config-server --listen, kfrun and
// kf-member --host, and every host of a cluster document (Cluster::validate) or an endpoint
// (Endpoint::parse).
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace kf {

/// Empty when `host` can be a host name or an IP address: letters, digits and ". - _ : %" (the
/// last for an IPv6 zone), without brackets; else what is wrong with it, naming the character
/// ("character 0x0a"), for an error message.
std::string host_problem(std::string_view host);

}  // namespace kf
