// SPDX-License-Identifier: Apache-2.0
// The agent's poll loop (run_agent, agent.hpp), shared by the files that define it: agent.cpp
// (the loop, what the link reports, notices) and agent_workers.cpp (adopting, starting, exits,
// grace periods, stopping). Private to kfrun's agent library. Thread-safety: one thread (the
// link threads and the notice poller only post to the mailbox).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kfrun/lib/agent.hpp"
#include "kfrun/lib/agent_link.hpp"
#include "kfrun/lib/agent_setup.hpp"
#include "kfrun/lib/autoscaler.hpp"
#include "kfrun/lib/line_prefixer.hpp"
#include "kfrun/lib/liveness.hpp"
#include "kfrun/lib/notice.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/private_dir.hpp"
#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/worker_env.hpp"
#include "kfrun/lib/worker_process.hpp"

namespace kf::tools::agent_detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A worker that is still running this long after the SIGTERM that ended its leave grace is
// killed.
inline constexpr milliseconds kTermToKill{2000};
// Once no worker runs, how long the agent waits for the service to hear of the last exits.
inline constexpr milliseconds kReportDeadline{5000};

inline std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }
inline std::string v_text(std::uint64_t version) {
  // Appended: GCC 12 warns falsely (-Wrestrict) on "v" + std::string&&.
  std::string text = "v";
  return text.append(std::to_string(version));
}

// A worker this agent started and that has not been reaped yet.
struct LocalWorker {
  WorkerProcess process;
  LinePrefixer out_lines;
  LinePrefixer err_lines;
  bool member = true;                        // in the newest document
  std::uint64_t last_member_version;         // the newest version that listed it
  Clock::time_point left_at{};               // when it left the document (member == false)
  std::optional<Clock::time_point> term_at;  // its leave grace ends: SIGTERM
  std::optional<Clock::time_point> kill_at;  // SIGTERM went unheeded: SIGKILL
  bool killed = false;                       // SIGKILL sent
};

// An exit the reporter is judging (is the worker still a member?).
struct PendingExit {
  int wait_status;
  bool member;  // as the agent last saw it: the verdict if the service cannot be asked
};

// The agent's poll loop: the workers, their output, the signals and the link's messages.
// Thread-safety: one thread (the link threads and the notice poller only post to the mailbox).
class Agent {
 public:
  Agent(const AgentOptions& options, AgentSetup& setup, SignalPipe& signals, FdWriter& err)
      : options_(options),
        job_(setup.job),
        signals_(signals),
        out_(options.out_fd, options.err_fd),
        err_(err),
        base_env_(current_environment()),
        mailbox_(std::make_shared<Mailbox>()) {
    LinkConfig link;
    link.url = setup.url;
    link.token = setup.token;
    link.host = options.host;
    auto outage = std::make_shared<Outage>(mailbox_);
    reporter_ = std::make_unique<Reporter>(link, mailbox_, outage);
    Bootstrap bootstrap{setup.initial_ports, options.algorithm, options.join, *options.slots,
                        options.settings};
    watcher_ = std::make_unique<ClusterWatcher>(link, std::move(bootstrap), mailbox_, outage);
    liveness_ = std::make_unique<Liveness>(setup.url, setup.token, options.host, *options.slots);
    autoscaler_ = std::make_unique<Autoscaler>(
        AutoscalerConfig{setup.url, setup.token, options.host, options.ports},
        [mailbox = mailbox_](std::string line) { mailbox->post(LinkNote{std::move(line)}); });
    // A scheduler may send them to every process of the job: the workers must outlive them to
    // leave at their boundary. SIGTERM among them too (named with --notice-signal): a worker
    // that ignores it is stopped by the SIGKILL that follows the agent's SIGTERM.
    ignored_by_workers_ = options.notice.signals;
    notice_poller_ = std::make_unique<NoticePoller>(
        options.notice, [mailbox = mailbox_](Notice n) { mailbox->post(NoticeSeen{std::move(n)}); },
        [mailbox = mailbox_](std::string problem) { mailbox->post(LinkNote{std::move(problem)}); });
  }

  int run();

  void say(const std::string& message) noexcept { err_.write("kfrun: " + message + "\n"); }

 private:
  // ---- the loop ----

  bool should_end();
  void requeue();
  std::optional<Clock::time_point> next_deadline() const;
  void poll_once();
  void on_signals();
  void on_messages();

  // ---- what the link reports ----

  void on_message(ClusterSeen& m);

  void on_message(LinkNote& m) { say(m.text); }

  void on_message(NoticeSeen& m) { on_notice(m.notice); }

  void on_message(LinkFailed& m);
  void on_message(DepartureJudged& m);
  void on_message(ExitJudged& m);

  // ---- notices ----

  bool is_notice_signal(int sig) const;
  void on_notice(const Notice& notice);
  std::optional<Clock::time_point> term_of(const LocalWorker& w) const;

  // ---- adopting ----

  void adopt_orphans(const Cluster& c);

  // ---- starting ----

  void start_missing();
  bool move_if_port_taken(int rank);
  /// Starts worker `rank` of the document, or (no rank) its spare `spec`.
  bool start(const WorkerSpec& spec, std::optional<int> rank);
  void fail_to_start(const std::string& name, const std::string& why);

  // ---- exits, grace periods, stopping ----

  void reap();
  void enforce_deadlines();
  /// --metrics-sd-file: the file's content for the workers running now, written when it changed.
  void write_targets();
  void begin_stop();
  void kill_all();
  int exit_code() const;

  const AgentOptions& options_;
  const JobSpec& job_;
  std::optional<PrivateDir> spill_dir_;  // cluster documents too large for the environment
  SignalPipe& signals_;
  FdWriter out_;
  FdWriter& err_;
  const std::vector<std::string> base_env_;
  std::shared_ptr<Mailbox> mailbox_;
  std::unique_ptr<Reporter> reporter_;
  std::unique_ptr<ClusterWatcher> watcher_;
  std::unique_ptr<Liveness> liveness_;           // the lease that lists this agent's slots
  std::unique_ptr<Autoscaler> autoscaler_;       // acts when the job has `autoscale`
  std::unique_ptr<NoticePoller> notice_poller_;  // with --notice-file or --notice-command
  std::vector<int> ignored_by_workers_;          // the notice signals

  std::optional<Cluster> cluster_;              // the newest document
  std::map<std::string, LocalWorker> workers_;  // running, by "host:port"
  std::set<std::string> started_;               // ever started (or failed to): never again
  std::set<std::string> waiting_;               // told to wait for a slot
  bool looked_for_orphans_ = false;             // adopt_orphans ran
  std::map<std::string, PendingExit> pending_exits_;
  // A member exited 0, the job is marked finished, or its last worker failed: start nothing
  // more, end when none runs.
  bool finished_ = false;
  bool failure_ = false;   // a member failed after the finish, or the last worker failed
  bool fatal_ = false;     // the link failed: stopping with exit code 1
  bool stopping_ = false;  // SIGTERM sent to all; SIGKILL at stop_kill_at_
  bool stop_killed_ = false;
  std::optional<int> stop_signal_;
  // A notice came: this host's workers leave, nothing starts, the agent ends when none runs.
  bool draining_ = false;
  bool drained_said_ = false;
  bool suspended_said_ = false;  // "job suspended" said for the suspension in force
  Clock::time_point notice_at_{};
  std::optional<Clock::time_point> drain_term_at_;  // the notice's SIGTERM to what still runs
  std::optional<int> notice_signal_;                // the signal the first notice came by
  Clock::time_point stop_kill_at_{};
  std::optional<Clock::time_point> end_by_;  // give up waiting for the verdicts of exits
  std::array<char, 64 * 1024> buffer_;
  std::string targets_written_;  // the last content of --metrics-sd-file
};

}  // namespace kf::tools::agent_detail
