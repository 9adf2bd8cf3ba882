// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/notice.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/unique_fd.hpp"

extern char** environ;

namespace kf::tools {

namespace {

using Clock = std::chrono::steady_clock;

// A notice command may take this long even when the poll is shorter (a metadata endpoint that
// answers slowly is still an answer).
constexpr std::chrono::milliseconds kLeastCommandTime{2000};

struct NamedSignal {
  const char* name;
  int number;
};
constexpr std::array kNoticeSignals = {NamedSignal{"HUP", SIGHUP},   NamedSignal{"INT", SIGINT},
                                       NamedSignal{"QUIT", SIGQUIT}, NamedSignal{"USR1", SIGUSR1},
                                       NamedSignal{"USR2", SIGUSR2}, NamedSignal{"ALRM", SIGALRM},
                                       NamedSignal{"TERM", SIGTERM}, NamedSignal{"XCPU", SIGXCPU},
                                       NamedSignal{"URG", SIGURG},   NamedSignal{"PWR", SIGPWR}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

int parse_notice_signal(std::string_view text) {
  const std::string_view given = trim(text);
  std::string upper;
  for (char c : given)
    upper.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (upper.starts_with("SIG")) upper.erase(0, 3);
  int number = 0;
  const auto [end, ec] = std::from_chars(upper.data(), upper.data() + upper.size(), number);
  const bool numeric = !upper.empty() && ec == std::errc{} && end == upper.data() + upper.size();
  for (const auto& s : kNoticeSignals) {
    if ((numeric && s.number == number) || (!numeric && upper == s.name)) return s.number;
  }
  std::string known;
  for (const auto& s : kNoticeSignals) known.append(known.empty() ? "" : ", ").append(s.name);
  throw std::invalid_argument("--notice-signal '" + std::string(text) +
                              "' is not a signal a notice may come by (one of " + known + ")");
}

std::string signal_name(int sig) {
  for (const auto& s : kNoticeSignals) {
    if (s.number == sig) return std::string("SIG") + s.name;
  }
  return "signal " + std::to_string(sig);
}

std::optional<std::chrono::seconds> parse_time_left(std::string_view text) {
  const std::string_view line = trim(text.substr(0, text.find('\n')));
  long seconds = 0;
  const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), seconds);
  if (line.empty() || ec != std::errc{} || end != line.data() + line.size()) return std::nullopt;
  if (seconds < 0 || seconds > 86'400) return std::nullopt;
  return std::chrono::seconds(seconds);
}

std::string host_detail(const std::string& host, const std::string& text) {
  return "host " + host + ": " + text;
}

bool is_about_host(std::string_view detail, const std::string& host) {
  const std::string prefix = "host " + host + ": ";
  return detail.substr(0, prefix.size()) == prefix;
}

std::optional<Notice> read_notice_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string first;
  std::getline(in, first);
  return Notice{"file " + path, parse_time_left(first)};
}

std::optional<Notice> run_notice_command(const std::string& command,
                                         std::chrono::milliseconds timeout, std::string* problem) {
  const auto say = [&](std::string what) {
    if (problem != nullptr) *problem = std::move(what);
    return std::nullopt;
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return say(std::string("pipe: ") + std::strerror(errno));
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  // The command runs with every signal unblocked and at its default, whatever kfrun's threads
  // block or ignore (SIGPIPE), in a process group of its own so that a timeout kills it all.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigset_t defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::string sh = "/bin/sh";
  std::string dash_c = "-c";
  std::string text = command;
  char* argv[] = {sh.data(), dash_c.data(), text.data(), nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) return say("cannot start /bin/sh: " + std::string(std::strerror(spawned)));
  write_end.close();

  std::string output;
  const auto deadline = Clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{read_end.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // the deadline check above ends the loop
    std::array<char, 4096> buffer;
    const auto n = ::read(read_end.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the command (and whatever holds its stdout) is done writing
    if (output.size() < 64 * 1024) output.append(buffer.data(), static_cast<std::size_t>(n));
  }
  if (timed_out) ::kill(-pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return say("the notice command ran longer than " + std::to_string(timeout.count()) +
               " ms and was killed");
  }
  if (WIFSIGNALED(status)) {
    return say("the notice command was killed by signal " + std::to_string(WTERMSIG(status)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return Notice{"command", parse_time_left(output)};
}

NoticePoller::NoticePoller(const NoticeOptions& options, std::function<void(Notice)> on_notice,
                           std::function<void(std::string)> on_problem)
    : options_(options), on_notice_(std::move(on_notice)), on_problem_(std::move(on_problem)) {
  if (!options_.file && !options_.command) return;
  thread_ = std::thread([this] { run(); });
}

NoticePoller::~NoticePoller() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NoticePoller::run() {
  block_pipe_signals();  // the agent's loop takes them
  std::string last_problem;
  for (;;) {
    std::optional<Notice> notice;
    if (options_.file) notice = read_notice_file(*options_.file);
    if (!notice && options_.command) {
      std::string problem;
      notice = run_notice_command(*options_.command, std::max(options_.poll, kLeastCommandTime),
                                  &problem);
      if (!problem.empty() && problem != last_problem) on_problem_(problem);
      last_problem = problem;
    }
    if (notice) {
      on_notice_(std::move(*notice));
      return;
    }
    std::unique_lock lock(mutex_);
    if (wake_.wait_for(lock, options_.poll, [this] { return stop_; })) return;
  }
}

}  // namespace kf::tools
