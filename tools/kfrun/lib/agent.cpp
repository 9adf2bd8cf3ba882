// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent.hpp"

#include <cstdio>

#include "kfrun/lib/agent_loop.hpp"

namespace kf::tools {

namespace agent_detail {

// Runs until the job is finished or kfrun is stopped; returns the exit code (run_agent).
int Agent::run() {
  while (!should_end()) {
    poll_once();
    on_messages();
    reap();
    enforce_deadlines();
    write_targets();
  }
  if (const auto dropped = reporter_->finish(Clock::now() + kReportDeadline); dropped > 0) {
    say(std::to_string(dropped) + " reports could not be sent to the config service");
  }
  return exit_code();
}

bool Agent::should_end() {
  if (!(stopping_ || finished_ || draining_) || !workers_.empty()) return false;
  if (draining_ && !stopping_ && !drained_said_) {
    drained_said_ = true;
    say("left on the notice: no worker of this host runs, " +
        ms_text(std::chrono::ceil<milliseconds>(Clock::now() - notice_at_)) + " after the notice");
    if (options_.requeue_job && notice_signal_ && *notice_signal_ != SIGTERM) requeue();
  }
  if (pending_exits_.empty() || fatal_) return true;
  if (!end_by_) end_by_ = Clock::now() + kReportDeadline;
  return Clock::now() >= *end_by_;
}

// --requeue: Slurm puts the allocation back in the queue (and stops this step); when it runs
// again its agents join the job as a new allocation's do. Slurm makes a requeued job wait about
// two minutes before it may start again. At most 10 s: the notice's grace is running.
void Agent::requeue() {
  const std::string cmd = "timeout 10 scontrol requeue " + *options_.requeue_job + " 2>&1";
  std::string out;
  int status = -1;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buffer[512];
    std::size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, p)) > 0) out.append(buffer, n);
    status = ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (status == 0) {
    say("requeued allocation " + *options_.requeue_job +
        " (scontrol requeue): it runs again "
        "once Slurm lets it, and its agents rejoin the job");
  } else {
    say("error: scontrol requeue " + *options_.requeue_job + " failed" +
        (out.empty() ? std::string() : ": " + out));
  }
}

std::optional<Clock::time_point> Agent::next_deadline() const {
  std::optional<Clock::time_point> next = end_by_;
  const auto consider = [&](Clock::time_point t) { next = next ? std::min(*next, t) : t; };
  for (const auto& [name, w] : workers_) {
    if (const auto term = term_of(w); term && !w.kill_at) consider(*term);
    if (w.kill_at && !w.killed) consider(*w.kill_at);
  }
  if (stopping_ && !stop_killed_) consider(stop_kill_at_);
  return next;
}

void Agent::poll_once() {
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

void Agent::on_signals() {
  for (int sig : signals_.drain()) {
    if (is_notice_signal(sig)) {
      if (!notice_signal_) notice_signal_ = sig;
      on_notice(Notice{signal_name(sig), std::nullopt});
      continue;
    }
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

void Agent::on_messages() {
  for (auto& message : mailbox_->take()) {
    std::visit([this](auto& m) { on_message(m); }, message);
  }
}

void Agent::on_message(ClusterSeen& m) {
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
  const bool suspended = marked_suspended(*cluster_);
  if (suspended && !suspended_said_) {
    say("job suspended: " + v_text(cluster_->version) +
        " is marked suspended; starting no workers until an agent resumes it");
  }
  suspended_said_ = suspended;
  start_missing();
}

void Agent::on_message(LinkFailed& m) {
  say("error: " + m.what);
  if (fatal_) return;
  fatal_ = true;
  begin_stop();
}

void Agent::on_message(DepartureJudged& m) {
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
void Agent::on_message(ExitJudged& m) {
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
      say("job finished: " + m.worker + " exited 0 while in the cluster; starting no more workers");
      return;
  }
}

bool Agent::is_notice_signal(int sig) const {
  const auto& n = options_.notice;
  if (std::find(n.signals.begin(), n.signals.end(), sig) != n.signals.end()) return true;
  // A second SIGTERM while the workers leave stops them (a service manager that cannot wait).
  return sig == SIGTERM && n.on_sigterm == OnSigterm::leave && !draining_;
}

// This host goes away: its workers leave the job with notice (revoked in the document; each
// finishes its step and exits 0), nothing more starts here, and the agent ends once none runs.
// Whatever still runs when the grace is about to end gets SIGTERM, then SIGKILL at its end.
void Agent::on_notice(const Notice& notice) {
  if (stopping_) return;
  const auto now = Clock::now();
  milliseconds grace = options_.notice.grace;
  if (notice.time_left) grace = std::min(grace, milliseconds(*notice.time_left));
  const auto term_at = now + std::max(grace - kTermToKill, milliseconds(0));
  if (draining_) {
    if (term_at < *drain_term_at_) {
      drain_term_at_ = term_at;
      say("notice from " + notice.source + ": the workers' time is now " + ms_text(grace));
    }
    return;
  }
  draining_ = true;
  notice_at_ = now;
  drain_term_at_ = term_at;
  // Its slots are no longer offered, and it places nothing any more (docs/autoscale.md).
  liveness_->retire();
  autoscaler_->stop();
  std::vector<std::string> leaving;
  for (const auto& [name, w] : workers_) {
    if (w.member) leaving.push_back(name);
  }
  if (cluster_) {
    for (const int rank : owned_ranks(*cluster_, options_.host)) {
      const std::string name = cluster_->workers[static_cast<std::size_t>(rank)].endpoint.str();
      if (started_.insert(name).second) leaving.push_back(name);  // never to be started
    }
    for (const WorkerSpec& spare : owned_spares(*cluster_, options_.host)) {
      if (started_.insert(spare.endpoint.str()).second) leaving.push_back(spare.endpoint.str());
    }
  }
  say("notice from " + notice.source + ": this host goes away within " + ms_text(grace) +
      (notice.time_left && grace < options_.notice.grace ? " (the time the notice gave)" : "") +
      "; " +
      (leaving.empty() ? std::string("no worker of the job is here")
                       : "its " + std::to_string(leaving.size()) +
                             " workers leave the job at their next step") +
      ", and none starts here any more");
  const auto notice_seconds = std::chrono::floor<std::chrono::seconds>(term_at - now);
  reporter_->leave_on_notice(std::move(leaving), notice.source, notice_seconds,
                             cluster_ ? cluster_->version : 0);
}

// When a worker gets SIGTERM: at the end of its leave grace, or of the notice's, whichever
// comes first.
std::optional<Clock::time_point> Agent::term_of(const LocalWorker& w) const {
  auto term = w.term_at;
  if (drain_term_at_ && (!term || *drain_term_at_ < *term)) term = drain_term_at_;
  return term;
}

}  // namespace agent_detail

int run_agent(const AgentOptions& options) {
  check_agent_options(options);
  // Handlers first: the threads started below must find SIGPIPE ignored, and they block the
  // signals the loop polls.
  SignalPipe signals(options.notice.signals);
  FdWriter err(options.err_fd, options.err_fd);
  AgentSetup setup = prepare_agent(options, err);
  agent_detail::Agent agent(options, setup, signals, err);
  const int code = agent.run();
  // The agent's reports are done. Stopping the builtin service ends the watcher's long-poll, so
  // that ~Agent joins the watcher at once.
  if (setup.builtin) setup.builtin->stop();
  return code;
}

}  // namespace kf::tools
