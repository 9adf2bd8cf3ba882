// SPDX-License-Identifier: Apache-2.0
// What the harnesses share: a property that fails aborts with a message, which libFuzzer
// reports as a crash and saves with the input that made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unistd.h>

#define KF_FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "property failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "  %s\n", std::string(__VA_ARGS__).c_str());                  \
      std::abort();                                                                      \
    }                                                                                    \
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
  std::size_t remaining() const noexcept { return left_; }
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

/// A folder of this process's own under the temporary folder, made on first use.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "kf-fuzz-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    return std::filesystem::path(t);
  }();
  return dir;
}

}  // namespace kf::fuzz
