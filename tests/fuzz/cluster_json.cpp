// SPDX-License-Identifier: Apache-2.0
// The cluster document and endpoints (kf/cluster/cluster.hpp), as they come from the config
// service, the environment (KF_CLUSTER) and peers' invitations: text goes through
// kf::parse_json (depth-bounded) and Cluster::from_json, which either refuses it with
// std::invalid_argument or gives a document that validates the same way after a round trip
// through to_json. An endpoint Endpoint::parse accepts prints as text that parses to it again.
// The same text as a policy run's inputs (kf-policy-replay's records): refused with
// std::invalid_argument, or taken as inputs that come back equal through to_json.
#include <stdexcept>

#include "check.hpp"
#include "kf/cluster/cluster.hpp"
#include "kf/common/json.hpp"
#include "kf/policies/policy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const kf::Endpoint e = kf::Endpoint::parse(text);
    KF_FUZZ_CHECK(kf::Endpoint::parse(e.str()) == e, e.str());
  } catch (const std::invalid_argument&) {
  }
  const nlohmann::json j = kf::parse_json_or_discard(text);
  if (j.is_discarded()) return 0;
  KF_FUZZ_CHECK(kf::json_depth(text) <= kf::kMaxJsonDepth, "a deep document was parsed");
  try {
    const kf::PolicyInputs in = kf::PolicyInputs::from_json(j);
    const kf::PolicyInputs back = kf::PolicyInputs::from_json(in.to_json());
    KF_FUZZ_CHECK(back.to_json() == in.to_json() && back.speeds.size() == in.speeds.size(),
                  in.to_json().dump());
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(std::string(e.what()).size() > 0, "a refusal must say why");
  }
  kf::Cluster c;
  try {
    c = kf::Cluster::from_json(j);
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(std::string(e.what()).size() > 0, "a refusal must say why");
    return 0;
  }
  const nlohmann::json again = c.to_json();
  kf::Cluster c2;
  try {
    c2 = kf::Cluster::from_json(again);
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(false, std::string("to_json of an accepted document is refused: ") + e.what());
  }
  KF_FUZZ_CHECK(c2.to_json() == again, again.dump());
  KF_FUZZ_CHECK(c2.version == c.version && c2.workers == c.workers && c2.agents == c.agents,
                again.dump());
  KF_FUZZ_CHECK(c2.validate() == c.validate(), c.validate());
  return 0;
}
