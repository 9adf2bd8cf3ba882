// SPDX-License-Identifier: Apache-2.0
// The backend seam: a collective is run by the backend of its buffers' device. CPU buffers go
// to the host engine (engine/), which runs plans over kf's own mesh. Device (CUDA) buffers go
// to a device backend (backend/device.cpp): NCCL, or the host engine through staging buffers.
// Thread-safety: free functions of their arguments.
#pragma once

#include <cstdint>

#include "kf/coll/types.hpp"

namespace kf::detail {

enum class BackendKind : std::uint8_t { host, device };

/// The backend of a collective with these buffers: the host engine when both are in CPU
/// memory, the device backend otherwise.
inline BackendKind backend_for(const Buffer& send, const Buffer& recv) noexcept {
  return send.device == Device::cpu && recv.device == Device::cpu ? BackendKind::host
                                                                  : BackendKind::device;
}

}  // namespace kf::detail
