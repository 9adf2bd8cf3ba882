// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/worker_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "kf/common/fd.hpp"
#include "kf/common/log.hpp"

namespace kf::tools {

namespace {

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "kfrun: pipe2");
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Makes `fd` the child's descriptor `target`, kept open across exec. dup2 onto itself would
// keep O_CLOEXEC (possible when kfrun was started with stdin, stdout or stderr closed).
bool install_fd(int fd, int target) noexcept {
  if (fd == target) return ::fcntl(fd, F_SETFD, 0) == 0;
  return ::dup2(fd, target) == target;
}

// Runs in the child between fork and exec: async-signal-safe calls only. All signals are
// blocked on entry; `mask` is the mask to restore once the dispositions are back to default.
[[noreturn]] void exec_child(char* const* argv, char* const* envp, int stdin_fd, int out_fd,
                             int err_fd, int status_fd, const sigset_t& mask, const cpu_set_t* cpus,
                             pid_t die_with, const int* ignored, std::size_t count_ignored,
                             int inherited_fd) {
  ::setpgid(0, 0);
  // SIGKILL when the thread that forked this child ends (kfrun's main thread: kfrun itself),
  // even by kill -9. Checked once more after: kfrun may have died before this call.
  if (die_with > 0 && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != die_with)) {
    ::_exit(127);
  }
  if (cpus != nullptr && ::sched_setaffinity(0, sizeof *cpus, cpus) != 0) {
    const int error = -errno;  // negative: the affinity failed, not the exec
    [[maybe_unused]] auto n = ::write(status_fd, &error, sizeof error);
    ::_exit(127);
  }
  if (!install_fd(stdin_fd, STDIN_FILENO) || !install_fd(out_fd, STDOUT_FILENO) ||
      !install_fd(err_fd, STDERR_FILENO)) {
    const int error = errno;
    [[maybe_unused]] auto n = ::write(status_fd, &error, sizeof error);
    ::_exit(127);
  }
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) ::sigaction(sig, &action, nullptr);
  // Ignored, so that a worker outlives the pipes of an agent that dies (a restarted agent adopts
  // it; adopt.hpp): its writes then fail with EPIPE instead of killing it.
  action.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &action, nullptr);
  for (std::size_t i = 0; i < count_ignored; ++i) ::sigaction(ignored[i], &action, nullptr);
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  // Nothing of kfrun's but stdin, stdout and stderr reaches the worker: not the builtin config
  // service's sockets, not another worker's pipes (status_fd has the flag already).
  close_on_exec_from(3);
  if (inherited_fd >= 0 && ::fcntl(inherited_fd, F_SETFD, 0) != 0) {
    const int error = errno;
    [[maybe_unused]] auto n = ::write(status_fd, &error, sizeof error);
    ::_exit(127);
  }
  ::execvpe(argv[0], argv, envp);
  const int error = errno;
  [[maybe_unused]] auto n = ::write(status_fd, &error, sizeof error);
  ::_exit(127);
}

// Reads the errno a failed exec reported on the status pipe, or 0 when the exec succeeded (the
// pipe closed on exec without data).
int read_exec_status(int status_fd) noexcept {
  int error = 0;
  for (;;) {
    const auto n = ::read(status_fd, &error, sizeof error);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(sizeof error) ? error : 0;
  }
}

void set_non_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "kfrun: fcntl");
  }
}

}  // namespace

int exit_code_of(int wait_status) noexcept {
  if (wait_status == kUnknownExit) return 1;
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string describe_exit(int wait_status) {
  if (wait_status == kUnknownExit) return "exited (status unknown: adopted)";
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "exited with code " + std::to_string(exit_code_of(wait_status));
}

WorkerProcess WorkerProcess::spawn(const std::vector<std::string>& argv,
                                   const std::vector<std::string>& env, std::optional<int> cpu,
                                   bool die_with_parent, const std::vector<int>& ignored,
                                   int inherited_fd) {
  KF_CHECK(!argv.empty(), "WorkerProcess::spawn: empty argv");
  KF_CHECK(inherited_fd < 0 || inherited_fd > STDERR_FILENO,
           "WorkerProcess::spawn: the inherited descriptor would replace stdin, stdout or stderr");
  // Built before the fork: the child makes only async-signal-safe calls.
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (cpu) {
    if (*cpu < 0 || *cpu >= CPU_SETSIZE) {
      throw ExecError("cannot hold '" + argv[0] + "' to CPU " + std::to_string(*cpu));
    }
    CPU_SET(*cpu, &cpus);
  }
  auto c_argv = c_strings(argv);
  auto c_env = c_strings(env);
  UniqueFd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.is_open()) {
    throw std::system_error(errno, std::generic_category(), "kfrun: open /dev/null");
  }
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe status = make_pipe();

  // Block every signal across fork so that the child cannot run kfrun's handlers.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t self = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    exec_child(c_argv.data(), c_env.data(), dev_null.get(), out.write.get(), err.write.get(),
               status.write.get(), previous, cpu ? &cpus : nullptr, die_with_parent ? self : 0,
               ignored.data(), ignored.size(), inherited_fd);
  }
  const int fork_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0) throw std::system_error(fork_error, std::generic_category(), "kfrun: fork");

  // Also set the group here, so that a signal sent right after spawn() reaches it. This fails
  // harmlessly when the child has already exec'd (it set its group itself before).
  ::setpgid(pid, pid);
  out.write.close();
  err.write.close();
  status.write.close();
  WorkerProcess worker(pid, std::move(out.read), std::move(err.read));
  if (const int error = read_exec_status(status.read.get()); error != 0) {
    int wait_status = 0;
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    worker.reaped_ = true;
    if (error < 0) {
      throw ExecError("cannot hold '" + argv[0] + "' to CPU " + std::to_string(cpu.value_or(-1)) +
                      ": " + std::strerror(-error));
    }
    throw ExecError("cannot execute '" + argv[0] + "': " + std::strerror(error));
  }
  set_non_blocking(worker.out_.get());
  set_non_blocking(worker.err_.get());
  return worker;
}

WorkerProcess WorkerProcess::adopt(pid_t pid) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    throw std::system_error(errno, std::generic_category(),
                            "kfrun: pidfd_open of pid " + std::to_string(pid));
  }
  UniqueFd pidfd(static_cast<int>(fd));
  // The worker's pipes, which lost their reader with the old agent: opening /proc/PID/fd/N
  // makes this process a reader of the same pipe.
  auto reopen = [pid](int n) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(n);
    UniqueFd f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    struct stat st {};
    if (f.is_open() && (::fstat(f.get(), &st) != 0 || !S_ISFIFO(st.st_mode))) f.close();
    return f;
  };
  WorkerProcess worker(pid, reopen(STDOUT_FILENO), reopen(STDERR_FILENO));
  worker.pidfd_ = std::move(pidfd);
  return worker;
}

WorkerProcess::WorkerProcess(pid_t pid, UniqueFd out, UniqueFd err) noexcept
    : pid_(pid), out_(std::move(out)), err_(std::move(err)) {}

WorkerProcess::WorkerProcess(WorkerProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      reaped_(other.reaped_),
      out_(std::move(other.out_)),
      err_(std::move(other.err_)),
      pidfd_(std::move(other.pidfd_)) {}

WorkerProcess::~WorkerProcess() {
  if (!running()) return;
  signal(SIGKILL);
  if (adopted()) return;  // not a child: its new parent reaps it
  int wait_status = 0;
  while (::waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
  }
}

void WorkerProcess::signal(int sig) noexcept {
  if (!running()) return;
  if (adopted()) {
    // Not a child, so no zombie holds its pid: signal it only while the pidfd says it lives.
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) return;
  }
  // The group exists once spawn() returned; signal the process itself should it have left it.
  if (::kill(-pid_, sig) != 0) ::kill(pid_, sig);
}

std::optional<int> WorkerProcess::try_reap() noexcept {
  if (!running()) return std::nullopt;
  if (adopted()) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    int r = 0;
    do {
      r = ::poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    if (r <= 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) return std::nullopt;
    reaped_ = true;
    return kUnknownExit;
  }
  // Looked at without reaping first: while the worker is a zombie its pid stays its process
  // group's id, so what it left running in the group can be killed without hitting anyone else.
  siginfo_t info{};
  int r = 0;
  do {
    r = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
  } while (r < 0 && errno == EINTR);
  KF_CHECK(r >= 0, "waitid on a worker failed: another part of the process reaped it");
  if (info.si_pid == 0) return std::nullopt;
  ::kill(-pid_, SIGKILL);  // children it left behind (ESRCH when there are none)
  int wait_status = 0;
  pid_t reaped = 0;
  do {
    reaped = ::waitpid(pid_, &wait_status, WNOHANG);
  } while (reaped < 0 && errno == EINTR);
  KF_CHECK(reaped == pid_, "waitpid on a worker failed after waitid saw it exit");
  reaped_ = true;
  return wait_status;
}

}  // namespace kf::tools
