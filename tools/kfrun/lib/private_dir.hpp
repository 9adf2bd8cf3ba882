// SPDX-License-Identifier: Apache-2.0
// A fresh temporary directory only this user can enter (0700), removed with everything in it
// when the object goes; and the 0600 job-token file kfrun makes in one when the user gave none.
// Thread-safety: none needed (one owner).
#pragma once

#include <filesystem>
#include <string>

namespace kf::tools {

/// Bytes of randomness in a token kfrun makes (hex: twice as many characters).
inline constexpr std::size_t kTokenBytes = 32;

class PrivateDir {
 public:
  /// Makes $TMPDIR/kfrun-XXXXXX. Throws: std::system_error naming the pattern when it cannot.
  PrivateDir();
  ~PrivateDir();
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
};

/// Writes `token` and a newline to the new file `file`, readable by this user only (created
/// with O_EXCL: an existing file is an error). Throws: std::system_error naming the file.
void write_token_file(const std::filesystem::path& file, const std::string& token);

}  // namespace kf::tools
