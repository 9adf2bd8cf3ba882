// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include "kfrun/lib/adopt.hpp"
#include "kfrun/lib/agent_link.hpp"
#include "kfrun/lib/agent_rules.hpp"
#include "kfrun/lib/agent_setup.hpp"
#include "kfrun/lib/line_prefixer.hpp"
#include "kfrun/lib/liveness.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/private_dir.hpp"
#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/worker_env.hpp"
#include "kfrun/lib/worker_process.hpp"

namespace kf::tools {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A worker that is still running this long after the SIGTERM that ended its leave grace is
// killed.
constexpr milliseconds kTermToKill{2000};
// Once no worker runs, how long the agent waits for the service to hear of the last exits.
constexpr milliseconds kReportDeadline{5000};

std::string ms_text(milliseconds ms) { return std::to_string(ms.count()) + " ms"; }
std::string v_text(std::uint64_t version) {
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
// Thread-safety: one thread (the link threads only post to the mailbox).
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
    Bootstrap bootstrap{setup.initial_ports, options.algorithm, *options.slots, options.settings};
    watcher_ = std::make_unique<ClusterWatcher>(link, std::move(bootstrap), mailbox_, outage);
    if (ConfigClient::parse_service_url(setup.url).kind == ServiceUrl::Kind::etcd) {
      liveness_ = std::make_unique<Liveness>(setup.url, setup.token, options.host);
    }
  }

  // Runs until the job is finished or kfrun is stopped; returns the exit code (run_agent).
  int run() {
    while (!should_end()) {
      poll_once();
      on_messages();
      reap();
      enforce_deadlines();
    }
    if (const auto dropped = reporter_->finish(Clock::now() + kReportDeadline); dropped > 0) {
      say(std::to_string(dropped) + " reports could not be sent to the config service");
    }
    return exit_code();
  }

  void say(const std::string& message) noexcept { err_.write("kfrun: " + message + "\n"); }

 private:
  // ---- the loop ----

  bool should_end() {
    if (!(stopping_ || finished_) || !workers_.empty()) return false;
    if (pending_exits_.empty() || fatal_) return true;
    if (!end_by_) end_by_ = Clock::now() + kReportDeadline;
    return Clock::now() >= *end_by_;
  }

  std::optional<Clock::time_point> next_deadline() const {
    std::optional<Clock::time_point> next = end_by_;
    const auto consider = [&](Clock::time_point t) { next = next ? std::min(*next, t) : t; };
    for (const auto& [name, w] : workers_) {
      if (w.term_at && !w.kill_at) consider(*w.term_at);
      if (w.kill_at && !w.killed) consider(*w.kill_at);
    }
    if (stopping_ && !stop_killed_) consider(stop_kill_at_);
    return next;
  }

  void poll_once() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}, {mailbox_->fd(), POLLIN, 0}};
    std::vector<std::pair<UniqueFd*, LinePrefixer*>> streams;
    // Adopted workers' exits: their pidfds (no SIGCHLD comes for them); reap() looks after each
    // wake-up. Listed before the streams, whose indices follow.
    std::size_t exit_fds = 0;
    for (auto& [name, w] : workers_) {
      if (w.process.exit_fd() < 0) continue;
      fds.push_back({w.process.exit_fd(), POLLIN, 0});
      ++exit_fds;
    }
    for (auto& [name, w] : workers_) {
      for (auto [fd, lines] :
           {std::pair{&w.process.out(), &w.out_lines}, std::pair{&w.process.err(), &w.err_lines}}) {
        if (!fd->is_open()) continue;
        fds.push_back({fd->get(), POLLIN, 0});
        streams.emplace_back(fd, lines);
      }
    }
    int timeout_ms = -1;
    if (const auto next = next_deadline()) {
      const auto left = std::chrono::ceil<milliseconds>(*next - Clock::now());
      timeout_ms = static_cast<int>(std::max<milliseconds::rep>(left.count(), 0));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) return;
      throw std::system_error(errno, std::generic_category(), "kfrun: poll");
    }
    if (fds[0].revents != 0) on_signals();
    const std::size_t first_stream = 2 + exit_fds;
    for (std::size_t i = first_stream; i < fds.size(); ++i) {
      if (fds[i].revents != 0) {
        read_chunk(*streams[i - first_stream].first, *streams[i - first_stream].second, buffer_);
      }
    }
  }

  void on_signals() {
    for (int sig : signals_.drain()) {
      if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: reap() follows
      const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      if (!stopping_) {
        stop_signal_ = sig;
        say("received " + name + "; stopping the workers");
        begin_stop();
      } else if (!stop_killed_) {
        say("received " + name + " again; sending SIGKILL to the workers");
        kill_all();
      }
    }
  }

  void on_messages() {
    for (auto& message : mailbox_->take()) {
      std::visit([this](auto& m) { on_message(m); }, message);
    }
  }

  // ---- what the link reports ----

  void on_message(ClusterSeen& m) {
    Cluster& c = m.cluster;
    const auto owned = owned_ranks(c, options_.host);
    say("cluster " + v_text(c.version) + ": " + std::to_string(c.size()) + " workers, " +
        std::to_string(owned.size()) + " on " + options_.host);
    if (!looked_for_orphans_) adopt_orphans(c);
    for (auto& [name, w] : workers_) {
      if (!w.member) continue;  // already leaving; a worker is never taken back
      if (is_member(c, name)) {
        w.last_member_version = c.version;
        continue;
      }
      w.member = false;
      w.left_at = Clock::now();
      w.term_at = w.left_at + options_.leave_grace;
      say("left " + name + " (pid " + std::to_string(w.process.pid()) + "): not in " +
          v_text(c.version) + "; it may finish its step and exit");
      reporter_->judge_departure(name, w.last_member_version);
    }
    cluster_ = std::move(c);
    if (marked_finished(*cluster_) && !finished_) {
      finished_ = true;
      say("job finished: " + v_text(cluster_->version) +
          " is marked finished; starting no more workers");
    }
    start_missing();
  }

  void on_message(LinkNote& m) { say(m.text); }

  void on_message(LinkFailed& m) {
    say("error: " + m.what);
    if (fatal_) return;
    fatal_ = true;
    begin_stop();
  }

  void on_message(DepartureJudged& m) {
    const auto it = workers_.find(m.worker);
    if (it == workers_.end() || it->second.member) return;  // gone meanwhile
    LocalWorker& w = it->second;
    const std::string who = m.worker + " (pid " + std::to_string(w.process.pid()) + ")";
    if (m.departure.kind == Departure::Kind::killed) {
      say("killed " + who + ": killed without notice; sending SIGKILL");
      w.process.signal(SIGKILL);
      w.killed = true;
      return;
    }
    if (w.kill_at) return;  // its grace is over already
    const milliseconds grace = grace_for(m.departure, options_.leave_grace);
    w.term_at = w.left_at + grace;
    const std::string then = "SIGTERM if it still runs " + ms_text(grace) + " after it left";
    if (m.departure.kind == Departure::Kind::unknown) {
      say("no event tells why " + who + " left: " + then);
    } else if (m.departure.notice) {
      say(std::string(to_string(m.departure.kind)) + " " + who + ", notice " +
          std::to_string(m.departure.notice->count()) + "s: " + then);
    } else {
      say(std::string(to_string(m.departure.kind)) + " " + who + ": " + then);
    }
  }

  // A failure during the job was dealt with by dropping the worker (the job goes on without it,
  // and the events record it); it counts against the exit code only once the job is finished,
  // or when the worker was the last one and the job cannot go on.
  void on_message(ExitJudged& m) {
    pending_exits_.erase(m.worker);
    switch (m.verdict) {
      case ExitVerdict::left: return;
      case ExitVerdict::failed: failure_ = failure_ || finished_; return;
      case ExitVerdict::failed_last:
        failure_ = true;
        if (std::exchange(finished_, true)) return;
        say("error: " + m.worker +
            " was the last worker of the cluster: the job cannot go on; starting no more workers");
        return;
      case ExitVerdict::finished:
        if (std::exchange(finished_, true)) return;
        say("job finished: " + m.worker +
            " exited 0 while in the cluster; starting no more workers");
        return;
    }
  }

  // ---- adopting ----

  // The workers an earlier agent of this host left running (it was killed or crashed while they
  // ran): adopted once, at the first document and before anything is started, so that no
  // worker is started twice. Their membership is then judged like that of any other worker.
  void adopt_orphans(const Cluster& c) {
    looked_for_orphans_ = true;
    for (const Orphan& o : find_orphans(job_.job_id, options_.host)) {
      if (workers_.contains(o.name)) continue;
      try {
        auto process = WorkerProcess::adopt(o.pid);
        const bool output = process.out().is_open() || process.err().is_open();
        std::string prefix = "[";
        prefix.append(o.name).append("] ");
        workers_.emplace(
            o.name, LocalWorker{std::move(process),
                                LinePrefixer(prefix, [this](auto line) { out_.write(line); }),
                                LinePrefixer(prefix, [this](auto line) { err_.write(line); }), true,
                                c.version});
        started_.insert(o.name);
        say("adopted " + o.name + " (pid " + std::to_string(o.pid) +
            "), left running by an earlier agent" +
            (output ? "; what it wrote while no agent read it is lost"
                    : "; its output is not a pipe and is not shown"));
        reporter_->post_event("adopted", o.name, "pid " + std::to_string(o.pid), c.version);
      } catch (const std::system_error& e) {
        say("cannot adopt " + o.name + " (pid " + std::to_string(o.pid) + "): " + e.what());
      }
    }
  }

  // ---- starting ----

  // Starts the owned workers of the newest document that were never started, while the slots
  // last: workers of the cluster that run count against --slots; leaving workers make a new one
  // wait until they exit.
  void start_missing() {
    if (!cluster_ || finished_ || stopping_) return;
    const int slots = *options_.slots;
    int members = 0;
    for (const auto& [name, w] : workers_) members += w.member ? 1 : 0;
    int running = static_cast<int>(workers_.size());
    for (const int rank : owned_ranks(*cluster_, options_.host)) {
      const std::string name = cluster_->workers[static_cast<std::size_t>(rank)].endpoint.str();
      if (started_.contains(name)) continue;
      if (members >= slots) {
        const std::string why = "no free slot: the " + std::to_string(slots) + " slots of " +
                                options_.host + " hold workers of the cluster";
        say("error: cannot start " + name + " of " + v_text(cluster_->version) + ": " + why);
        fail_to_start(name, why);
        continue;
      }
      if (running >= slots) {
        if (waiting_.insert(name).second) {
          say(name + " of " + v_text(cluster_->version) +
              " waits for a slot: a worker that left the cluster still runs");
        }
        continue;
      }
      if (move_if_port_taken(rank)) continue;
      if (start(rank)) {
        ++members;
        ++running;
      }
    }
  }

  // A worker placed here from another machine (kf-member add --host) has a port nobody could
  // test on this host. When it is in use here, the worker is given a free one in the document
  // instead (the next version then lists it under its new address), and the old address is
  // never started. Returns whether it moves.
  bool move_if_port_taken(int rank) {
    const Cluster& c = *cluster_;
    const Endpoint& ep = c.workers[static_cast<std::size_t>(rank)].endpoint;
    try {
      if (port_is_free(options_.host, ep.port)) return false;
      std::vector<std::uint16_t> taken;
      for (const auto& w : c.workers) {
        if (w.endpoint.host == options_.host) taken.push_back(w.endpoint.port);
      }
      const auto pick = pick_ports_for(options_.host, options_.ports, 1, taken);
      const Endpoint to{options_.host, pick.ports.at(0)};
      started_.insert(ep.str());
      say("port " + std::to_string(ep.port) + " of " + ep.str() + " (" + v_text(c.version) +
          ") is in use on this host: moving the worker to " + to.str());
      reporter_->move_worker(ep.str(), to);
      return true;
    } catch (const std::exception&) {
      // Not an address of this machine, or no free port: the start reports what goes wrong.
      return false;
    }
  }

  // Returns whether the worker runs.
  bool start(int rank) {
    const Cluster& c = *cluster_;
    const std::string name = c.workers[static_cast<std::size_t>(rank)].endpoint.str();
    started_.insert(name);
    waiting_.erase(name);
    JobSpec job = job_;
    job.cluster = c;
    try {
      if (!fits_environment(c)) {
        // A document too large for the environment goes by file, in a directory of this
        // agent's (it outlives the agent only when the agent is killed).
        try {
          if (!spill_dir_) spill_dir_.emplace();
          job.cluster_file = write_cluster_file(c, spill_dir_->path());
        } catch (const std::system_error& e) {
          throw ExecError(e.what());  // this worker cannot start; the agent goes on
        }
      }
      auto env = worker_environment(job, rank, base_env_);
      // So that an agent restarted after this one died can tell the worker was orphaned.
      std::erase_if(env, [](const std::string& e) {
        return e.rfind(std::string(kAgentPidVariable) + "=", 0) == 0;
      });
      env.push_back(std::string(kAgentPidVariable) + "=" + std::to_string(::getpid()));
      auto process = WorkerProcess::spawn(options_.command, env, std::nullopt,
                                          options_.orphans == Orphans::kill);
      const auto pid = std::to_string(process.pid());
      // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string&&.
      std::string prefix = "[";
      prefix.append(name).append("] ");
      workers_.emplace(
          name, LocalWorker{std::move(process),
                            LinePrefixer(prefix, [this](auto line) { out_.write(line); }),
                            LinePrefixer(prefix, [this](auto line) { err_.write(line); }), true,
                            c.version});
      say("started " + name + " (pid " + pid + ") as rank " + std::to_string(rank) + " of " +
          v_text(c.version));
      reporter_->post_event("started", name, "pid " + pid, c.version);
      return true;
    } catch (const ExecError& e) {
      say("failed " + name + " of " + v_text(c.version) + ": " + e.what());
      fail_to_start(name, e.what());
      return false;
    }
  }

  void fail_to_start(const std::string& name, const std::string& why) {
    started_.insert(name);
    reporter_->fail_worker(name, why, cluster_->version);
  }

  // ---- exits, grace periods, stopping ----

  void reap() {
    bool freed = false;
    for (auto it = workers_.begin(); it != workers_.end();) {
      LocalWorker& w = it->second;
      const auto status = w.process.try_reap();
      if (!status) {
        ++it;
        continue;
      }
      drain(w.process.out(), w.out_lines, buffer_);
      drain(w.process.err(), w.err_lines, buffer_);
      const std::string& name = it->first;
      const bool unknown = *status == kUnknownExit;
      const bool ok = !unknown && exit_code_of(*status) == 0;
      say(std::string(ok || unknown ? "exited " : "failed ") + name + " (pid " +
          std::to_string(w.process.pid()) + "): " + (ok ? "exit 0" : describe_exit(*status)) +
          " (" + v_text(cluster_->version) + (w.member ? "" : ", after it left") + ")");
      pending_exits_[name] = PendingExit{*status, w.member};
      reporter_->judge_exit(name, *status, cluster_->version);
      it = workers_.erase(it);
      freed = true;
    }
    if (freed) start_missing();
  }

  void enforce_deadlines() {
    const auto now = Clock::now();
    for (auto& [name, w] : workers_) {
      const std::string who = name + " (pid " + std::to_string(w.process.pid()) + ")";
      if (w.term_at && !w.kill_at && now >= *w.term_at) {
        say("stopping " + who + ": still running " +
            ms_text(std::chrono::ceil<milliseconds>(now - w.left_at)) +
            " after it left the cluster; sending SIGTERM");
        w.process.signal(SIGTERM);
        w.kill_at = now + kTermToKill;
      } else if (w.kill_at && !w.killed && now >= *w.kill_at) {
        say("killing " + who + ": still running " + ms_text(kTermToKill) +
            " after SIGTERM; sending SIGKILL");
        w.process.signal(SIGKILL);
        w.killed = true;
      }
    }
    if (stopping_ && !stop_killed_ && now >= stop_kill_at_ && !workers_.empty()) {
      say("workers still running " + ms_text(options_.stop_grace) +
          " after SIGTERM; sending SIGKILL");
      kill_all();
    }
  }

  void begin_stop() {
    stopping_ = true;
    stop_kill_at_ = Clock::now() + options_.stop_grace;
    for (auto& [name, w] : workers_) w.process.signal(SIGTERM);
  }

  void kill_all() {
    stop_killed_ = true;
    for (auto& [name, w] : workers_) {
      w.process.signal(SIGKILL);
      w.killed = true;
    }
  }

  int exit_code() const {
    if (stop_signal_) return 128 + *stop_signal_;
    if (fatal_) return 1;
    bool failed = failure_;
    // Exits the service could not judge in time (the job is finished): as the agent last saw
    // them.
    for (const auto& [name, e] : pending_exits_) {
      failed = failed || (e.member && exit_code_of(e.wait_status) != 0);
    }
    return failed ? 1 : 0;
  }

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
  std::unique_ptr<Liveness> liveness_;  // with etcd

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
  Clock::time_point stop_kill_at_{};
  std::optional<Clock::time_point> end_by_;  // give up waiting for the verdicts of exits
  std::array<char, 64 * 1024> buffer_;
};

}  // namespace

int run_agent(const AgentOptions& options) {
  check_agent_options(options);
  // Handlers first: the threads started below must find SIGPIPE ignored, and they block the
  // signals the loop polls.
  SignalPipe signals;
  FdWriter err(options.err_fd, options.err_fd);
  AgentSetup setup = prepare_agent(options, err);
  Agent agent(options, setup, signals, err);
  const int code = agent.run();
  // The agent's reports are done. Stopping the builtin service ends the watcher's long-poll, so
  // that ~Agent joins the watcher at once.
  if (setup.builtin) setup.builtin->stop();
  return code;
}

}  // namespace kf::tools
