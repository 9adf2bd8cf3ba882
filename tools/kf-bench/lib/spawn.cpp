// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/spawn.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kf/common/fd.hpp"

extern char** environ;

namespace kf::tools::bench {

bool executable_file(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

namespace {

using Clock = std::chrono::steady_clock;

// Once every member has exited, how long descendants that hold its pipes open (daemons a member
// left behind) may keep them; then they are killed, if still in the group, and the pipes closed.
constexpr auto kStrayGrace = std::chrono::seconds(2);
// The longest poll() between two checks for exited members.
constexpr auto kPollSlice = std::chrono::milliseconds(50);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Member {
  pid_t pid = -1;
  Fd out;
  Fd err;
  bool exited = false;
};

std::vector<std::string> child_environment(const std::vector<EnvChange>& changes) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  for (const EnvChange& change : changes) {
    const std::string key = change.name + "=";
    std::erase_if(env, [&key](const std::string& e) { return e.rfind(key, 0) == 0; });
    if (change.value) env.push_back(key + *change.value);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// Makes `fd` the child's descriptor `target`, kept open across exec (dup2 onto itself would keep
// O_CLOEXEC, possible when this process was started with a standard descriptor closed).
bool install_fd(int fd, int target) noexcept {
  if (fd == target) return ::fcntl(fd, F_SETFD, 0) == 0;
  return ::dup2(fd, target) == target;
}

struct ChildFds {
  int in;
  int out;
  int err;
  int status;  // written the errno of a failed exec; closed by a successful one
};

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(pid_t group, char* const* argv, char* const* envp, const ChildFds& fds,
                             const sigset_t& mask) {
  ::setpgid(0, group);
  if (install_fd(fds.in, STDIN_FILENO) && install_fd(fds.out, STDOUT_FILENO) &&
      install_fd(fds.err, STDERR_FILENO)) {
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    close_on_exec_from(3);  // the member gets none of kf-bench's other pipes
    ::execve(argv[0], argv, envp);
  }
  const int error = errno;
  [[maybe_unused]] const auto n = ::write(fds.status, &error, sizeof error);
  ::_exit(127);
}

int exit_code_of(int wait_status) noexcept {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return -1;
}

// Starts one member in process group `group` (0: a new group led by it). Returns an empty
// string, or what failed (the member is then not running).
std::string start(const Command& command, pid_t group, int dev_null, const sigset_t& mask,
                  Member& member, ProcessResult& result) {
  int out[2];
  int err[2];
  int status[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  Fd out_read(out[0]);
  Fd out_write(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  Fd err_read(err[0]);
  Fd err_write(err[1]);
  if (::pipe2(status, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  Fd status_read(status[0]);
  Fd status_write(status[1]);

  std::vector<std::string> argv = command.argv;
  std::vector<std::string> envp = child_environment(command.env);
  const std::vector<char*> c_argv = c_strings(argv);
  const std::vector<char*> c_envp = c_strings(envp);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    exec_child(group, c_argv.data(), c_envp.data(),
               ChildFds{dev_null, out_write.get(), err_write.get(), status_write.get()}, mask);
  }
  // Also here, so that the group exists before the next member joins it or a signal is sent.
  ::setpgid(pid, group == 0 ? pid : group);
  member.pid = pid;
  member.out = std::move(out_read);
  member.err = std::move(err_read);
  status_write.reset();
  int error = 0;
  ssize_t n;
  while ((n = ::read(status_read.get(), &error, sizeof error)) < 0 && errno == EINTR) {
  }
  if (n == static_cast<ssize_t>(sizeof error)) {
    result.err = "cannot execute " + command.argv[0] + ": " + std::strerror(error) + "\n";
  }
  return {};
}

// Appends what `fd` has to `text`; closes it at end of file or on an error.
void drain(Fd& fd, std::string& text) {
  char buffer[65536];
  const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
  if (n > 0) {
    text.append(buffer, static_cast<std::size_t>(n));
  } else if (n == 0 || errno != EINTR) {
    fd.reset();
  }
}

}  // namespace

bool GroupResult::ok() const noexcept {
  return error.empty() && !timed_out && interrupted_by == 0 &&
         std::all_of(processes.begin(), processes.end(),
                     [](const ProcessResult& p) { return p.exit_code == 0; });
}

GroupResult run_group(const std::vector<Command>& commands, const GroupLimits& limits) {
  GroupResult result;
  result.processes.resize(commands.size());
  sigset_t stop_signals;
  sigset_t old_mask;
  ::sigemptyset(&stop_signals);
  ::sigaddset(&stop_signals, SIGINT);
  ::sigaddset(&stop_signals, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  Fd signals(::signalfd(-1, &stop_signals, SFD_CLOEXEC | SFD_NONBLOCK));
  Fd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));

  std::vector<Member> members(commands.size());
  pid_t group = 0;
  for (std::size_t i = 0; i < commands.size() && result.error.empty(); ++i) {
    result.error =
        start(commands[i], group, dev_null.get(), old_mask, members[i], result.processes[i]);
    if (group == 0) group = members[i].pid;
  }
  for (Member& m : members) m.exited = m.pid < 0;

  const auto deadline = Clock::now() + limits.timeout;
  std::optional<Clock::time_point> kill_at;  // SIGTERM sent; SIGKILL then
  bool killed = false;
  std::optional<Clock::time_point> all_exited_at;
  const auto stop = [&](Clock::time_point now) {
    if (kill_at || group <= 0) return;
    ::kill(-group, SIGTERM);
    kill_at = now + limits.grace;
  };
  if (!result.error.empty()) stop(Clock::now());

  for (;;) {
    const auto now = Clock::now();
    for (std::size_t i = 0; i < members.size(); ++i) {
      Member& m = members[i];
      int status = 0;
      if (m.exited || ::waitpid(m.pid, &status, WNOHANG) != m.pid) continue;
      m.exited = true;
      result.processes[i].exit_code = exit_code_of(status);
      if (result.processes[i].exit_code != 0) stop(now);
    }
    const bool all_exited =
        std::all_of(members.begin(), members.end(), [](const Member& m) { return m.exited; });
    const bool pipes_open = std::any_of(members.begin(), members.end(), [](const Member& m) {
      return m.out.get() >= 0 || m.err.get() >= 0;
    });
    if (all_exited && !pipes_open) break;
    if (all_exited && !all_exited_at) all_exited_at = now;
    if (all_exited && now >= *all_exited_at + kStrayGrace) {
      if (!killed && group > 0) ::kill(-group, SIGKILL);
      break;
    }
    if (!kill_at && now >= deadline) {
      result.timed_out = true;
      stop(now);
    }
    if (kill_at && !killed && now >= *kill_at) {
      ::kill(-group, SIGKILL);
      killed = true;
    }

    std::vector<pollfd> fds{{signals.get(), POLLIN, 0}};
    std::vector<std::pair<Fd*, std::string*>> sources;
    for (std::size_t i = 0; i < members.size(); ++i) {
      for (auto [fd, text] : {std::pair{&members[i].out, &result.processes[i].out},
                              std::pair{&members[i].err, &result.processes[i].err}}) {
        if (fd->get() < 0) continue;
        fds.push_back({fd->get(), POLLIN, 0});
        sources.emplace_back(fd, text);
      }
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(kPollSlice.count())) <= 0) continue;
    if (fds[0].revents != 0) {
      signalfd_siginfo info{};
      if (::read(signals.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        result.interrupted_by = static_cast<int>(info.ssi_signo);
        stop(Clock::now());
      }
    }
    for (std::size_t k = 0; k < sources.size(); ++k) {
      if (fds[k + 1].revents != 0) drain(*sources[k].first, *sources[k].second);
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return result;
}

}  // namespace kf::tools::bench
