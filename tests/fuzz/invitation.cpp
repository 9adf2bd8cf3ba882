// SPDX-License-Identifier: Apache-2.0
// An invitation's payload (runtime/src/session/invitation.hpp), as a joiner receives it from
// another worker: decode_invitation either refuses it with std::invalid_argument, saying why, or
// gives a cluster document that validates as it did before and an invitation that encodes and
// decodes back to the same document and flag.
#include <stdexcept>

#include "check.hpp"
#include "kf/common/json.hpp"
#include "session/invitation.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kf::detail::InvitationDoc doc;
  try {
    doc = kf::detail::decode_invitation(text);
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(std::string_view(e.what()).starts_with("invitation: "), e.what());
    return 0;
  }
  KF_FUZZ_CHECK(kf::json_depth(text) <= kf::kMaxJsonDepth, "a deep invitation was accepted");
  const std::string again = kf::detail::encode_invitation(doc.cluster, doc.fresh);
  kf::detail::InvitationDoc back;
  try {
    back = kf::detail::decode_invitation(again);
  } catch (const std::invalid_argument& e) {
    KF_FUZZ_CHECK(false,
                  std::string("the encoding of an accepted invitation is refused: ") + e.what());
  }
  KF_FUZZ_CHECK(back.fresh == doc.fresh, again);
  KF_FUZZ_CHECK(back.cluster.to_json() == doc.cluster.to_json(), again);
  KF_FUZZ_CHECK(back.cluster.validate() == doc.cluster.validate(), again);
  return 0;
}
