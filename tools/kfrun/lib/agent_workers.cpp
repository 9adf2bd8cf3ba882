// SPDX-License-Identifier: Apache-2.0
// The agent's workers (agent_loop.hpp): adopting those an earlier agent left running, starting
// those the document places here, reaping their exits, their grace periods, and stopping them.
#include <nlohmann/json.hpp>

#include "kf/runtime/atomic_file.hpp"
#include "kfrun/lib/adopt.hpp"
#include "kfrun/lib/agent_loop.hpp"
#include "kfrun/lib/agent_rules.hpp"

namespace kf::tools::agent_detail {

// The workers an earlier agent of this host left running (it was killed or crashed while they
// ran): adopted once, at the first document and before anything is started, so that no
// worker is started twice. Their membership is then judged like that of any other worker.
void Agent::adopt_orphans(const Cluster& c) {
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

// Starts the owned workers of the newest document that were never started, while the slots
// last: workers of the cluster that run count against --slots; leaving workers make a new one
// wait until they exit.
void Agent::start_missing() {
  if (!cluster_ || finished_ || stopping_ || marked_suspended(*cluster_)) return;
  if (draining_) {
    for (const int rank : owned_ranks(*cluster_, options_.host)) {
      const std::string name = cluster_->workers[static_cast<std::size_t>(rank)].endpoint.str();
      if (started_.contains(name)) continue;
      say("error: cannot start " + name + " of " + v_text(cluster_->version) + ": " +
          options_.host + " is going away (a notice came)");
      fail_to_start(name, options_.host + " is going away (a notice came)");
    }
    return;
  }
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
    if (start(cluster_->workers[static_cast<std::size_t>(rank)], rank)) {
      ++members;
      ++running;
    }
  }
  // Hot spares take the slots that are left: a worker never waits for a spare.
  for (const WorkerSpec& spare : owned_spares(*cluster_, options_.host)) {
    const std::string name = spare.endpoint.str();
    if (started_.contains(name)) continue;
    if (members >= slots || running >= slots) {
      const std::string why = "no free slot for a spare: the " + std::to_string(slots) +
                              " slots of " + options_.host + " are in use";
      say("error: cannot start the spare " + name + " of " + v_text(cluster_->version) + ": " +
          why);
      fail_to_start(name, why);
      continue;
    }
    if (start(spare, std::nullopt)) {
      ++members;
      ++running;
    }
  }
}

// A worker placed here from another machine (kf-member add --host) has a port nobody could
// test on this host. When it is in use here, the worker is given a free one in the document
// instead (the next version then lists it under its new address), and the old address is
// never started. Returns whether it moves.
bool Agent::move_if_port_taken(int rank) {
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
bool Agent::start(const WorkerSpec& spec, std::optional<int> rank) {
  const Cluster& c = *cluster_;
  const std::string name = spec.endpoint.str();
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
    auto env =
        rank ? worker_environment(job, *rank, base_env_) : spare_environment(job, spec, base_env_);
    // So that an agent restarted after this one died can tell the worker was orphaned.
    std::erase_if(env, [](const std::string& e) {
      return e.rfind(std::string(kAgentPidVariable) + "=", 0) == 0;
    });
    env.push_back(std::string(kAgentPidVariable) + "=" + std::to_string(::getpid()));
    // The port is bound here and the worker listens on this socket: from now on no other
    // process can take it (one that did, since the pick, makes the start fail).
    const UniqueFd listener = worker_listener(spec.endpoint);
    add_listen_fd(env, listener.get());
    auto process = WorkerProcess::spawn(options_.command, env, std::nullopt,
                                        orphans_for(options_) == Orphans::kill, ignored_by_workers_,
                                        listener.get());
    const auto pid = std::to_string(process.pid());
    // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string&&.
    std::string prefix = "[";
    prefix.append(name).append("] ");
    workers_.emplace(
        name, LocalWorker{
                  std::move(process), LinePrefixer(prefix, [this](auto line) { out_.write(line); }),
                  LinePrefixer(prefix, [this](auto line) { err_.write(line); }), true, c.version});
    say("started " + name + " (pid " + pid + ") as " +
        (rank ? "rank " + std::to_string(*rank) : std::string("a hot spare")) + " of " +
        v_text(c.version));
    reporter_->post_event("started", name, "pid " + pid, c.version);
    return true;
  } catch (const ExecError& e) {
    say("failed " + name + " of " + v_text(c.version) + ": " + e.what());
    fail_to_start(name, e.what());
    return false;
  }
}

void Agent::fail_to_start(const std::string& name, const std::string& why) {
  started_.insert(name);
  reporter_->fail_worker(name, why, cluster_->version);
}

void Agent::reap() {
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
        std::to_string(w.process.pid()) + "): " + (ok ? "exit 0" : describe_exit(*status)) + " (" +
        v_text(cluster_->version) + (w.member ? "" : ", after it left") + ")");
    pending_exits_[name] = PendingExit{*status, w.member};
    reporter_->judge_exit(name, *status, cluster_->version);
    it = workers_.erase(it);
    freed = true;
  }
  if (freed) start_missing();
}

void Agent::enforce_deadlines() {
  const auto now = Clock::now();
  for (auto& [name, w] : workers_) {
    const std::string who = name + " (pid " + std::to_string(w.process.pid()) + ")";
    if (const auto term = term_of(w); term && !w.kill_at && now >= *term) {
      if (w.term_at && now >= *w.term_at) {
        say("stopping " + who + ": still running " +
            ms_text(std::chrono::ceil<milliseconds>(now - w.left_at)) +
            " after it left the cluster; sending SIGTERM");
      } else {
        say("stopping " + who + ": the notice's time is nearly over; sending SIGTERM");
      }
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

void Agent::begin_stop() {
  stopping_ = true;
  stop_kill_at_ = Clock::now() + options_.stop_grace;
  for (auto& [name, w] : workers_) w.process.signal(SIGTERM);
}

void Agent::kill_all() {
  stop_killed_ = true;
  for (auto& [name, w] : workers_) {
    w.process.signal(SIGKILL);
    w.killed = true;
  }
}

int Agent::exit_code() const {
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

// --metrics-sd-file: one target group per running worker of the document (member or spare),
// its metrics port the base plus its slot, as kfrun gives them (KF_METRICS_PORT). The workers
// serve on KF_METRICS_HOST, 127.0.0.1 unless set: set it to an address Prometheus reaches.
void Agent::write_targets() {
  if (!options_.metrics_sd_file || !options_.metrics_port || *options_.metrics_port == 0 ||
      !cluster_) {
    return;
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [name, worker] : workers_) {
    const WorkerSpec* spec = nullptr;
    for (const auto* list : {&cluster_->workers, &cluster_->spares}) {
      for (const WorkerSpec& w : *list) {
        if (w.endpoint.str() == name) spec = &w;
      }
    }
    const long port = spec ? static_cast<long>(*options_.metrics_port) + spec->slot : 0;
    if (spec == nullptr || port > 65535) continue;
    groups.push_back({{"targets", {spec->endpoint.host + ":" + std::to_string(port)}},
                      {"labels", {{"kf_job", job_.job_id}, {"kf_worker", name}}}});
  }
  std::string text = groups.dump(2) + "\n";
  if (text == targets_written_) return;
  try {
    write_file_atomically(*options_.metrics_sd_file, {text}, 0644);
  } catch (const std::exception& e) {
    say("--metrics-sd-file: " + std::string(e.what()) + " (tried again when the workers change)");
  }
  targets_written_ = std::move(text);
}

}  // namespace kf::tools::agent_detail
