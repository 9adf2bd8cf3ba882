// SPDX-License-Identifier: Apache-2.0
// How kfrun --watch learns that its machine is about to go away (a preemption notice from a
// scheduler or a cloud), so that its workers leave the job with notice instead of failing:
// SIGTERM (Kubernetes, a cloud's shutdown), a chosen signal (Slurm's --signal=USR1@N), a file
// that appears (written by a side script that watches a cloud's metadata endpoint), or a command
// that answers yes. kf-member's host notices reach the agent as events (agent_link.hpp). What the
// agent then does is in agent.cpp and docs/kfrun.md ("Notices"). Thread-safety: the free
// functions are pure; a NoticePoller runs its own thread and calls back from it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kf::tools {

/// What SIGTERM to the agent means: `leave`, a notice (the workers leave the job with notice and
/// the agent exits 0); `stop`, stop the workers at once as failures (the job's survivors recover
/// without them).
enum class OnSigterm { leave, stop };

struct NoticeOptions {
  OnSigterm on_sigterm = OnSigterm::leave;
  /// More signals that mean a notice (--notice-signal), such as SIGUSR1 for Slurm. The agent's
  /// workers start with them ignored, since a scheduler may signal every process of the job.
  std::vector<int> signals;
  std::optional<std::string> file;          ///< a notice when this file exists
  std::optional<std::string> command;       ///< a notice when this command exits 0
  std::chrono::milliseconds poll{1000};     ///< how often the file and command are looked at
  std::chrono::milliseconds grace{30'000};  ///< from a notice until the agent must be gone
};

/// A notice, from `source` ("SIGTERM", "SIGUSR1", "file PATH", "command", "kf-member notice"),
/// with the time it leaves when the source said so (else the agent's grace applies).
struct Notice {
  std::string source;
  std::optional<std::chrono::seconds> time_left;
};

/// A signal by name or number: "USR1", "SIGUSR1", "usr1" or "10". Only signals a scheduler may
/// send as a notice are taken: HUP, INT, QUIT, USR1, USR2, ALRM, TERM, XCPU, URG, PWR.
/// Throws: std::invalid_argument naming --notice-signal and the text.
int parse_notice_signal(std::string_view text);

/// "SIGUSR1" for SIGUSR1; "signal N" for one without a name here.
std::string signal_name(int sig);

/// The time left that a notice's text gives: its first line, blanks trimmed, a whole number of
/// seconds from 0 to 86400. nullopt when the line is empty or anything else (the agent's grace
/// then applies, and the agent says why).
std::optional<std::chrono::seconds> parse_time_left(std::string_view text);

/// The notice file's answer: nullopt while `path` does not exist; a notice once it does (its
/// first line may give the seconds left).
std::optional<Notice> read_notice_file(const std::string& path);

/// Runs `command` with /bin/sh -c, its stdout read and its stderr on the agent's: exit 0 is a
/// notice (its first line of output may give the seconds left); any other exit is none. A
/// command still running after `timeout` is killed and counts as none; `problem` (when not null)
/// then says so, as it does when the command cannot be started or is killed by a signal.
std::optional<Notice> run_notice_command(const std::string& command,
                                         std::chrono::milliseconds timeout,
                                         std::string* problem = nullptr);

/// The detail of an event about a whole host (`notice`, posted by kf-member notice HOST;
/// `draining`, by the agent), whose `worker` field is left empty since it names a host:port:
/// "host HOST: TEXT".
std::string host_detail(const std::string& host, const std::string& text);
/// Whether `detail` is host_detail(host, ...).
bool is_about_host(std::string_view detail, const std::string& host);

/// Looks at the notice file and runs the notice command every `poll`, on a thread of its own,
/// until one says a notice: then calls `on_notice` once (on that thread) and polls no more. A
/// command's problems (it hangs, cannot start) go to `on_problem`, once each in a row.
class NoticePoller {
 public:
  /// Starts nothing when the options name neither a file nor a command.
  /// Throws: std::system_error when the thread cannot be started.
  NoticePoller(const NoticeOptions& options, std::function<void(Notice)> on_notice,
               std::function<void(std::string)> on_problem);
  NoticePoller(const NoticePoller&) = delete;
  NoticePoller& operator=(const NoticePoller&) = delete;
  /// Stops the thread (a command in flight runs to its timeout) and joins it.
  ~NoticePoller();

 private:
  void run();

  NoticeOptions options_;
  std::function<void(Notice)> on_notice_;
  std::function<void(std::string)> on_problem_;
  std::mutex mutex_;  // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kf::tools
