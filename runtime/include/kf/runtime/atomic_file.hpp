// SPDX-License-Identifier: Apache-2.0
// Files replaced atomically and durably (the config service's state file, kf::State's
// checkpoints): the new content goes to a temporary of a fresh, unique name in the same
// directory, created with O_EXCL and O_NOFOLLOW (a file or symbolic link planted there is never
// written through), is fsynced, renamed over the file, and the directory is fsynced. A crash
// leaves the old content or the new one.
// Thread-safety: one writer per file at a time.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

namespace kf {

/// Replaces `path` with the concatenation of `pieces`, created with permissions `mode`. Throws:
/// std::runtime_error "<step> '<file>': <reason>" when a step before the rename fails (the
/// temporary is removed, the file is as it was). Once the rename is done the new content is in
/// place and counts as written: a failing sync of the directory after it is passed to `warn`
/// (when given), not thrown.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                           mode_t mode,
                           const std::function<void(const std::string&)>& warn = nullptr);

/// For tests: `sync` replaces fsync(2) of the directory after the rename (it returns -1 and
/// sets errno to fail it), until it is given nullptr again. Not for concurrent use.
void set_directory_sync_for_testing(int (*sync)(int fd));

}  // namespace kf
