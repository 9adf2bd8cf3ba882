// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/signal_pipe.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <system_error>

#include "kf/common/log.hpp"

namespace kf::tools {

namespace {

constexpr std::array kAlwaysHandled = {SIGCHLD, SIGINT, SIGTERM, SIGPIPE};

// Global by necessity: a signal handler has no other way to reach the pipe. Written only while
// no handler is installed (constructor before sigaction, destructor after restoring).
volatile sig_atomic_t g_write_fd = -1;

// What block_pipe_signals() blocks: the caught signals. Written by the constructor before any
// thread that reads it starts.
sigset_t g_caught;

void on_signal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  // A full pipe already holds a wake-up; dropping this byte loses at most a repeated signal.
  [[maybe_unused]] auto n = ::write(g_write_fd, &byte, 1);
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe(const std::vector<int>& extra)
    : handled_(kAlwaysHandled.begin(), kAlwaysHandled.end()) {
  KF_CHECK(g_write_fd == -1, "only one SignalPipe may exist at a time");
  for (int sig : extra) {
    if (std::find(handled_.begin(), handled_.end(), sig) == handled_.end()) handled_.push_back(sig);
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "kfrun: pipe2");
  }
  read_ = UniqueFd(fds[0]);
  write_ = UniqueFd(fds[1]);
  g_write_fd = write_.get();
  sigemptyset(&g_caught);
  previous_.resize(handled_.size());
  for (std::size_t i = 0; i < handled_.size(); ++i) {
    struct sigaction action {};
    action.sa_handler = handled_[i] == SIGPIPE ? SIG_IGN : on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | (handled_[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    if (::sigaction(handled_[i], &action, &previous_[i]) != 0) {
      const int error = errno;
      for (std::size_t j = 0; j < i; ++j) ::sigaction(handled_[j], &previous_[j], nullptr);
      g_write_fd = -1;
      throw std::system_error(error, std::generic_category(), "kfrun: sigaction");
    }
    if (handled_[i] != SIGPIPE) sigaddset(&g_caught, handled_[i]);
  }
}

SignalPipe::~SignalPipe() {
  for (std::size_t i = 0; i < handled_.size(); ++i) {
    ::sigaction(handled_[i], &previous_[i], nullptr);
  }
  g_write_fd = -1;
}

std::vector<int> SignalPipe::drain() noexcept {
  std::vector<int> signals;
  std::array<unsigned char, 64> bytes;
  for (;;) {
    const auto n = ::read(read_.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    signals.insert(signals.end(), bytes.begin(), bytes.begin() + n);
  }
  return signals;
}

void block_pipe_signals() noexcept { ::pthread_sigmask(SIG_BLOCK, &g_caught, nullptr); }

PipeSignalsBlocked::PipeSignalsBlocked() noexcept {
  ::pthread_sigmask(SIG_BLOCK, &g_caught, &previous_);
}

PipeSignalsBlocked::~PipeSignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

}  // namespace kf::tools
