// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace kf::detail {

/// The cores this process may run on: its affinity mask (taskset, a container's cpuset), or
/// every online core where that cannot be read. A host's workers poll with sched_yield() when
/// they outnumber these (PeerImpl::update).
unsigned usable_cores() noexcept;

}  // namespace kf::detail
