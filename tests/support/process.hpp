// SPDX-License-Identifier: Apache-2.0
// Test helper: start a child process with extra environment variables and its stdout on a
// pipe; read its lines with a deadline; wait for its exit with a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kf::test {

struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string pending;  // bytes read but not yet returned as a line
};

inline Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  return Child{pid, fds[0], {}};
}

/// The next line of the child's stdout, or nullopt at EOF or when the deadline passes.
inline std::optional<std::string> read_line(Child& c, std::chrono::steady_clock::time_point until) {
  for (;;) {
    const auto nl = c.pending.find('\n');
    if (nl != std::string::npos) {
      std::string line = c.pending.substr(0, nl);
      c.pending.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{c.out_fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(c.out_fd, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    c.pending.append(buf, static_cast<std::size_t>(n));
  }
}

/// Waits for the child's exit; returns its wait status, or nullopt if it did not exit before
/// the deadline: then it is killed (SIGKILL) and reaped, unless `kill_late` is false. Looks at
/// least once, even when the deadline has passed.
inline std::optional<int> wait_exit(Child& c, std::chrono::steady_clock::time_point until,
                                    bool kill_late = true) {
  int status = 0;
  for (bool first = true; first || std::chrono::steady_clock::now() < until; first = false) {
    const pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      char buf[4096];
      ssize_t n;
      while ((n = read(c.out_fd, buf, sizeof buf)) > 0)
        c.pending.append(buf, static_cast<std::size_t>(n));
      return status;
    }
    // Block on the child's stdout instead of sleeping: EOF or output wakes us early.
    pollfd pfd{c.out_fd, POLLIN, 0};
    if (poll(&pfd, 1, 10) > 0) {
      char buf[4096];
      const ssize_t n = read(c.out_fd, buf, sizeof buf);
      if (n > 0) c.pending.append(buf, static_cast<std::size_t>(n));
    }
  }
  if (kill_late) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  }
  return std::nullopt;
}

struct Ran {
  int exit_code = -1;
  std::string output;
};

/// Runs a shell command to completion; stdout and stderr together.
inline Ran run_shell(const std::string& command) {
  Ran ran;
  std::FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return ran;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, p)) > 0;) {
    ran.output.append(buffer, n);
  }
  const int status = ::pclose(p);
  ran.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return ran;
}

/// Polls `condition` until it holds or `timeout` passes (the state it waits for is produced by
/// other processes; there is nothing to block on).
inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

/// Whether process `pid` has ended: gone, or a zombie nobody reaped yet.
inline bool ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || text[close + 2] == 'Z' ||
         text[close + 2] == 'X';
}

/// Waits (polling) until `pid` has ended or `until` passes; whether it ended.
inline bool wait_ended(pid_t pid, std::chrono::steady_clock::time_point until) {
  while (!ended(pid) && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  return ended(pid);
}

/// What `ls -l /proc/self/fd/` printed, among other lines: the descriptor numbers, and which of
/// them are sockets.
struct ListedFds {
  std::set<int> fds;
  std::set<int> sockets;
  bool socket = false;  ///< !sockets.empty()
};
inline ListedFds listed_fds(const std::string& output) {
  ListedFds l;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const auto arrow = line.find(" -> ");
    if (arrow == std::string::npos || arrow == 0) continue;
    const auto name = line.rfind(' ', arrow - 1);
    if (name == std::string::npos) continue;
    const int fd = std::atoi(line.substr(name + 1, arrow - name - 1).c_str());
    l.fds.insert(fd);
    if (line.find("socket:", arrow) != std::string::npos) l.sockets.insert(fd);
    l.socket = !l.sockets.empty();
  }
  return l;
}

}  // namespace kf::test
