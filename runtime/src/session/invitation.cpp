// SPDX-License-Identifier: Apache-2.0
#include "session/invitation.hpp"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "kf/common/json.hpp"

namespace kf::detail {

std::string encode_invitation(const Cluster& cluster, bool fresh) {
  return nlohmann::json{{"cluster", cluster.to_json()}, {"fresh", fresh}}.dump();
}

InvitationDoc decode_invitation(std::string_view payload) {
  nlohmann::json doc;
  try {
    doc = parse_json(payload);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("invitation: not JSON: ") + e.what());
  } catch (const std::invalid_argument& e) {  // nested too deep
    throw std::invalid_argument(std::string("invitation: ") + e.what());
  }
  if (!doc.is_object()) throw std::invalid_argument("invitation: not a JSON object");
  const auto cluster = doc.find("cluster");
  if (cluster == doc.end()) throw std::invalid_argument("invitation: no \"cluster\"");
  InvitationDoc out;
  try {
    out.cluster = Cluster::from_json(*cluster);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("invitation: ") + e.what());
  }
  if (const auto fresh = doc.find("fresh"); fresh != doc.end()) {
    if (!fresh->is_boolean()) throw std::invalid_argument("invitation: \"fresh\" is not a boolean");
    out.fresh = fresh->get<bool>();
  }
  return out;
}

}  // namespace kf::detail
