// SPDX-License-Identifier: Apache-2.0
// The self-pipe trick: while a SignalPipe lives, SIGCHLD, SIGINT, SIGTERM and the extra signals
// it is given (an agent's notice signals) are caught and each delivery writes its signal number
// into a non-blocking pipe, so that a poll() loop wakes for child exits and for signals to forward
// without racing against them. SIGPIPE is ignored (a closed output is reported by write()). The
// previous dispositions are restored on destruction. Thread-safety: at most one SignalPipe per
// process at a time (the handler needs the pipe in a global); construct, use and destroy it on one
// thread.
#pragma once

#include <csignal>
#include <vector>

#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

class SignalPipe {
 public:
  /// Also catches `extra` (such as SIGUSR1). Throws: std::system_error when the pipe cannot be
  /// made or a handler not installed.
  explicit SignalPipe(const std::vector<int>& extra = {});
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  ~SignalPipe();

  /// Becomes readable when a signal has arrived since the last drain().
  int fd() const noexcept { return read_.get(); }

  /// The signals that arrived since the last call, in order (SIGCHLD may be coalesced).
  std::vector<int> drain() noexcept;

 private:
  UniqueFd read_;
  UniqueFd write_;
  std::vector<int> handled_;
  std::vector<struct sigaction> previous_;  // of handled_, restored by the destructor
};

/// Blocks the signals the SignalPipe catches (SIGCHLD, SIGINT, SIGTERM and its extra ones) in the
/// calling thread, so that the process delivers them to a thread that does not (the one that
/// polls the SignalPipe). For threads kfrun starts while the SignalPipe lives.
void block_pipe_signals() noexcept;

/// Blocks the same signals while it lives and then restores the mask: a thread started meanwhile
/// by code that does not call block_pipe_signals() itself inherits the mask.
class PipeSignalsBlocked {
 public:
  PipeSignalsBlocked() noexcept;
  ~PipeSignalsBlocked();
  PipeSignalsBlocked(const PipeSignalsBlocked&) = delete;
  PipeSignalsBlocked& operator=(const PipeSignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace kf::tools
