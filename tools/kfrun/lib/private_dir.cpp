// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/private_dir.hpp"

#include <fcntl.h>
#include <stdlib.h>

#include <cerrno>
#include <system_error>

#include "kfrun/lib/output.hpp"
#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

namespace fs = std::filesystem;

PrivateDir::PrivateDir() {
  std::string pattern = (fs::temp_directory_path() / "kfrun-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(),
                            "kfrun: cannot make a temporary directory like " + pattern);
  }
  path_ = pattern;
}

PrivateDir::~PrivateDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void write_token_file(const fs::path& file, const std::string& token) {
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.is_open() || !write_all(fd.get(), token + "\n")) {
    throw std::system_error(errno, std::generic_category(),
                            "kfrun: cannot write the job token file " + file.string());
  }
}

}  // namespace kf::tools
