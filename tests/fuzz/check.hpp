// SPDX-License-Identifier: Apache-2.0
// What the harnesses share: a property that fails aborts with a message, which libFuzzer
// reports as a crash and saves with the input that made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#define KF_FUZZ_CHECK(cond, ...)                                                     \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "  %s\n", std::string(__VA_ARGS__).c_str());              \
      std::abort();                                                                  \
    }                                                                                \
  } while (false)

namespace kf::fuzz {

/// Takes the input apart: bytes, small integers and length-prefixed pieces, front to back;
/// past the end every read gives zeros or empty pieces.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), left_(size) {}
  std::uint8_t byte() {
    if (left_ == 0) return 0;
    --left_;
    return *p_++;
  }
  bool empty() const noexcept { return left_ == 0; }
  /// A piece whose length is the next byte (up to 255), or all that is left when `rest`.
  std::string piece(bool rest = false) {
    const std::size_t n = rest ? left_ : std::min<std::size_t>(byte(), left_);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return s;
  }

 private:
  const std::uint8_t* p_;
  std::size_t left_;
};

}  // namespace kf::fuzz
