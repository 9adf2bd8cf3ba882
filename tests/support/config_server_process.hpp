// SPDX-License-Identifier: Apache-2.0
// Test helper: a running kf-config-server (the binary named by CONFIG_SERVER_EXE) with its
// token and state under `dir`, on a kernel-picked port announced by its "listening on" line.
// SIGKILLed on destruction unless terminate() stopped it first.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace kf::test {

class ServerProcess {
 public:
  /// `launcher`: a command that runs the server (e.g. {"prlimit", "--nofile=128"}).
  explicit ServerProcess(const std::filesystem::path& dir, std::vector<std::string> extra = {},
                         std::vector<std::string> launcher = {}) {
    const char* exe = std::getenv("CONFIG_SERVER_EXE");
    std::vector<std::string> argv = std::move(launcher);
    for (const std::string& a :
         {std::string(exe ? exe : ""), std::string("--token-file"), (dir / "token").string(),
          std::string("--state"), (dir / "state.json").string()}) {
      argv.push_back(a);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    child_ = spawn(argv, {});
    if (child_.pid <= 0) return;
    auto line = read_line(child_, std::chrono::steady_clock::now() + std::chrono::seconds(20));
    const std::string prefix = "listening on ";
    if (line && line->starts_with(prefix)) address_ = line->substr(prefix.size());
  }
  ~ServerProcess() {
    if (child_.pid > 0) {
      ::kill(child_.pid, SIGKILL);
      ::waitpid(child_.pid, nullptr, 0);
    }
    if (child_.out_fd >= 0) ::close(child_.out_fd);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  /// "http://HOST:PORT", empty when the server did not announce itself.
  std::string url() const { return address_.empty() ? "" : "http://" + address_; }
  const std::string& address() const { return address_; }
  bool alive() const { return child_.pid > 0 && ::kill(child_.pid, 0) == 0; }
  pid_t pid() const { return child_.pid; }

  /// Sends SIGTERM and returns the exit code (128 + signal when a signal ended it).
  int terminate() {
    ::kill(child_.pid, SIGTERM);
    int status = 0;
    ::waitpid(child_.pid, &status, 0);
    child_.pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  Child child_;
  std::string address_;
};

}  // namespace kf::test
