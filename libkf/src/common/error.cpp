// SPDX-License-Identifier: Apache-2.0
#include "kf/common/error.hpp"

namespace kf {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kf"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::ok: return "success";
      case errc::peer_lost: return "peer lost";
      case errc::timeout: return "timed out waiting for a peer";
      case errc::cancelled: return "cancelled";
      case errc::stale_version: return "stale cluster version";
      case errc::protocol_error: return "protocol error";
      case errc::auth_failed: return "authentication failed";
      case errc::invalid_argument: return "invalid argument";
      case errc::not_member: return "not a member of the cluster";
      case errc::closed: return "closed";
      case errc::service_unavailable: return "config service unavailable";
      case errc::conflict: return "version conflict";
      case errc::device_error: return "device error";
      case errc::no_progress: return "no progress while the membership changed";
    }
    return "unknown kf error " + std::to_string(ev);
  }
  bool equivalent(int code, const std::error_condition& cond) const noexcept override {
    if (cond.category() == condition_category() &&
        cond.value() == static_cast<int>(errcond::peer_failure)) {
      return code == static_cast<int>(errc::peer_lost) || code == static_cast<int>(errc::timeout);
    }
    return std::error_category::equivalent(code, cond);
  }
};

class ConditionCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kf-condition"; }
  std::string message(int ev) const override {
    return ev == static_cast<int>(errcond::peer_failure) ? "peer failure" : "unknown condition";
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const Category c;
  return c;
}
const std::error_category& condition_category() noexcept {
  static const ConditionCategory c;
  return c;
}
std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), category()}; }
std::error_condition make_error_condition(errcond e) noexcept {
  return {static_cast<int>(e), condition_category()};
}

}  // namespace kf
