// SPDX-License-Identifier: Apache-2.0
// One worker process of a kfrun job: started with fork+exec in a process group of its own (so
// that signals reach the shell pipelines and helpers it starts, and the terminal's Ctrl-C reaches
// only kfrun, which forwards it), stdin on /dev/null, stdout and stderr on pipes that kfrun reads.
// A worker that is still running when its object is destroyed is killed (SIGKILL) and reaped,
// so that an exception in kfrun leaves no orphans. Thread-safety: one thread per object.
#pragma once

#include <sys/types.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

/// The program of a worker could not be executed (not found, not executable, …).
class ExecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class WorkerProcess {
 public:
  /// Starts argv[0] (searched in PATH as execvp does) with argv and the environment `env`
  /// ("NAME=VALUE" strings), held to CPU `cpu` when one is given (its affinity mask, set before
  /// the exec; see binding.hpp). It inherits no descriptor of this process but its stdin
  /// (/dev/null), the pipes of its stdout and stderr, and `inherited_fd`. With `die_with_parent` it
  /// gets SIGKILL when the calling thread ends (PR_SET_PDEATHSIG; call it from the main thread):
  /// even kfrun killed by kill -9 leaves no worker behind. The signals in `ignored` start ignored
  /// in the worker (an agent's notice signals, which a scheduler may send to every process). The
  /// worker also inherits `inherited_fd` (> 2) when one is given, under the same number (its
  /// listening socket; ports.hpp bind_worker_port). Returns once the program runs, i.e. after the
  /// exec succeeded. Throws: ExecError naming the program and the reason when the exec fails or the
  /// CPU cannot be set (the child is reaped); std::system_error when a pipe cannot be made or fork
  /// fails.
  static WorkerProcess spawn(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env,
                             std::optional<int> cpu = std::nullopt, bool die_with_parent = false,
                             const std::vector<int>& ignored = {}, int inherited_fd = -1);

  /// Takes over a running worker that an earlier agent started (adopt.hpp). It is not a child of
  /// this process: its exit shows on exit_fd() (a pidfd) and its status is unknown
  /// (kUnknownExit). Its output is read again through /proc/PID/fd/1 and /2 where those are
  /// pipes (what it wrote while nobody read them is lost). Throws: std::system_error when the
  /// process cannot be watched (gone: ESRCH; a kernel without pidfd_open: ENOSYS).
  static WorkerProcess adopt(pid_t pid);

  WorkerProcess(WorkerProcess&& other) noexcept;
  WorkerProcess& operator=(WorkerProcess&&) = delete;
  ~WorkerProcess();

  pid_t pid() const noexcept { return pid_; }
  bool running() const noexcept { return pid_ > 0 && !reaped_; }
  /// Whether it was adopted rather than started here.
  bool adopted() const noexcept { return pidfd_.is_open(); }
  /// Adopted: a descriptor that turns readable when the worker exits; -1 for a child (whose
  /// exit comes as SIGCHLD).
  int exit_fd() const noexcept { return pidfd_.is_open() ? pidfd_.get() : -1; }
  /// Read ends (non-blocking) of the worker's stdout and stderr; the caller closes them at EOF.
  UniqueFd& out() noexcept { return out_; }
  UniqueFd& err() noexcept { return err_; }

  /// Sends `sig` to the worker's process group. Does nothing once the worker is reaped (its
  /// process group id may then belong to someone else).
  void signal(int sig) noexcept;

  /// Reaps the worker if it has exited. Returns its waitpid() status (see exit_code_of), or
  /// kUnknownExit for an adopted worker; nullopt while it runs (and after it was reaped). A
  /// worker started here has, first, whatever it left running in its process group killed
  /// (SIGKILL): a child that outlives its worker would hold the worker's pipes and resources.
  /// (An adopted worker's group is left alone: its id may be reused once nobody waits on it.)
  std::optional<int> try_reap() noexcept;

 private:
  WorkerProcess(pid_t pid, UniqueFd out, UniqueFd err) noexcept;

  pid_t pid_ = -1;
  bool reaped_ = false;
  UniqueFd out_;
  UniqueFd err_;
  UniqueFd pidfd_;  // adopted workers only
};

/// try_reap()'s status for an adopted worker, whose exit status only its old parent could read.
/// Never a waitpid() status (those are 16-bit and non-negative).
inline constexpr int kUnknownExit = -1;

/// The exit code a shell would report for a waitpid() status: the exit status, or 128 + signal
/// (1 for kUnknownExit).
int exit_code_of(int wait_status) noexcept;

/// "exited with code 3" or "was killed by signal 9 (Killed)", for a waitpid() status;
/// "exited (status unknown: adopted)" for kUnknownExit.
std::string describe_exit(int wait_status);

}  // namespace kf::tools
