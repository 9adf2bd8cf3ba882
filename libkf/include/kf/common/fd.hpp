// SPDX-License-Identifier: Apache-2.0
// Descriptors that must not outlive an exec. Asio opens its sockets and acceptors without
// close-on-exec, so kf marks each one it opens right after: a program the process starts (user
// code calling system(), a data loader's helper) then inherits none of kf's connections and
// listeners, and cannot keep a port bound after the worker is gone. Thread-safety: pure
// functions on the descriptor.
#pragma once

#include <optional>
#include <string>

namespace kf {

/// Sets FD_CLOEXEC on `fd`; false (errno set) when the descriptor is not open.
bool set_close_on_exec(int fd) noexcept;

/// Sets FD_CLOEXEC on every open descriptor from `first` up: for a child between fork and exec,
/// so that the program it runs gets only the descriptors it was given below `first`, whatever
/// threads of the parent opened without the flag. Async-signal-safe (close_range, or fcntl on
/// each descriptor below the open-files limit where the kernel lacks it).
void close_on_exec_from(int first) noexcept;

/// Claims `fd`, a descriptor this process inherited for one user (KF_LISTEN_FD): returns `fd`
/// the first time it is claimed in this process and -1 every time after, so that a second user
/// never takes over a descriptor the first one owns (and may have closed). Thread-safe.
int claim_inherited_fd(int fd);

/// The whole of a file, read with read(2); nullopt when it cannot be opened or a read fails.
/// Never throws on a read error, where std::ifstream's buffer does: a /proc file of a process
/// that exits while it is read (ESRCH), a directory (EISDIR).
std::optional<std::string> read_whole_file(const std::string& path);

}  // namespace kf
