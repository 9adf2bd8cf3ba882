// SPDX-License-Identifier: Apache-2.0
// The handshake's hello and welcome codecs (transport/auth.hpp): a payload that decodes
// encodes back to the same bytes, and a value encoded from the input decodes to itself.
#include <cstring>

#include "check.hpp"
#include "transport/auth.hpp"

using namespace kf::transport;

namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> v(s.size());
  if (!s.empty()) std::memcpy(v.data(), s.data(), s.size());
  return v;
}

template <std::size_t N>
void fill(std::array<std::byte, N>& a, kf::fuzz::Input& in) {
  for (auto& b : a) b = static_cast<std::byte>(in.byte());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const auto payload = bytes_of(raw);
  if (const auto h = decode_hello(payload)) {
    KF_FUZZ_CHECK(encode(*h) == payload, "an accepted hello must re-encode to its bytes");
  }
  if (const auto w = decode_welcome(payload)) {
    KF_FUZZ_CHECK(encode(*w) == payload, "an accepted welcome must re-encode to its bytes");
  }
  // Values made from the input round-trip.
  kf::fuzz::Input in(data, size);
  Hello h;
  h.frame_auth = in.byte() & 1;
  fill(h.nonce, in);
  fill(h.mac, in);
  h.job_id = in.piece();
  h.identity = in.piece();
  const auto hb = encode(h);
  const auto h2 = decode_hello(hb);
  KF_FUZZ_CHECK(h2 && h2->job_id == h.job_id && h2->identity == h.identity &&
                    h2->nonce == h.nonce && h2->mac == h.mac && h2->frame_auth == h.frame_auth,
                "a hello must decode to what was encoded");
  Welcome w;
  w.frame_auth = in.byte() & 1;
  fill(w.mac, in);
  w.identity = in.piece(true);
  const auto w2 = decode_welcome(encode(w));
  KF_FUZZ_CHECK(
      w2 && w2->identity == w.identity && w2->mac == w.mac && w2->frame_auth == w.frame_auth,
      "a welcome must decode to what was encoded");
  return 0;
}
