// SPDX-License-Identifier: Apache-2.0
// kf::copy_buffer: a copy between host and device buffers in any direction (kf::State's
// snapshots of device buffers use it).
#include <cstring>
#include <stdexcept>
#include <string>

#include "device/device_api.hpp"
#include "kf/coll/types.hpp"
#include "kf/common/error.hpp"

namespace kf {

void copy_buffer(const Buffer& dst, const Buffer& src) {
  if (dst.bytes() != src.bytes()) {
    throw std::invalid_argument("copy_buffer: " + std::to_string(src.bytes()) + " bytes into " +
                                std::to_string(dst.bytes()));
  }
  if (dst.bytes() == 0) return;
  if (dst.device == Device::cpu && src.device == Device::cpu) {
    std::memcpy(dst.data, src.data, dst.bytes());
    return;
  }
  std::string why;
  const auto api = detail::device_api(why);
  if (!api) throw Error(make_error_code(errc::device_error), "copy_buffer: " + why);
  api->copy(dst.data, src.data, dst.bytes(), nullptr);
  api->synchronize(nullptr);
}

}  // namespace kf
