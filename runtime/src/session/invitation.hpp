// SPDX-License-Identifier: Apache-2.0
// The payload of an invitation (kf::Peer::invite), which a member sends each joiner of a new
// cluster version: {"cluster": DOCUMENT, "fresh": BOOL}, JSON. The joiner takes the document as
// the cluster it is asked into. Thread-safety: free functions.
#pragma once

#include <string>
#include <string_view>

#include "kf/cluster/cluster.hpp"

namespace kf::detail {

struct InvitationDoc {
  Cluster cluster;     ///< the version the joiner is invited into
  bool fresh = false;  ///< the job starts there (nobody has state yet)
};

/// The payload for `cluster`.
std::string encode_invitation(const Cluster& cluster, bool fresh);

/// Reads a payload from another worker. Throws: std::invalid_argument naming what is wrong (not
/// JSON, nested too deep, not an object, no or a malformed cluster document, "fresh" not a
/// boolean); nothing else.
InvitationDoc decode_invitation(std::string_view payload);

}  // namespace kf::detail
