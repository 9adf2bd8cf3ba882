// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/agent_link.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <system_error>
#include <utility>

#include "kf/common/error.hpp"
#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/worker_process.hpp"

namespace kf::tools {

using Clock = std::chrono::steady_clock;

struct LinkControl {
  std::mutex mutex;  // guards the fields below
  std::condition_variable changed;
  bool stop = false;  // the thread is to end
  bool done = false;  // the thread has ended
  // The reporter's queue (unused by the watcher) and whether a request of it is running.
  std::deque<std::function<void()>> tasks;
  bool busy = false;
};

namespace {

constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr int kMaxRemoveAttempts = 20;
// How long the document is watched after an adopted member's exit (judge_adopted_exit).
constexpr std::chrono::milliseconds kAdoptedExitWindow{5000};
// How long the agent leaves a failed member's removal to the job's survivors (judge_exit).
constexpr std::chrono::milliseconds kSurvivorsRemoveWindow{500};

// Thrown inside a link thread that was told to stop while it waits.
struct Stopped {};

// Waits `period` unless told to stop first. Throws: Stopped.
void pause(LinkControl& control, std::chrono::milliseconds period) {
  std::unique_lock lock(control.mutex);
  if (control.changed.wait_for(lock, period, [&] { return control.stop; })) throw Stopped{};
}

// Runs `call` until it reaches the service: a call that cannot (errc::service_unavailable) is
// retried after a back-off that doubles up to `max_backoff`. Other errors propagate.
// Throws: Stopped when told to stop while retrying; what `call` throws.
template <class Call>
auto retrying(LinkControl& control, Outage& outage, std::chrono::milliseconds max_backoff,
              Call&& call) {
  auto backoff = kFirstBackoff;
  for (;;) {
    {
      std::lock_guard lock(control.mutex);
      if (control.stop) throw Stopped{};
    }
    try {
      auto result = call();
      outage.up();
      return result;
    } catch (const Error& e) {
      if (e.code() != errc::service_unavailable) throw;
      outage.down(e.what());
    }
    pause(control, backoff);
    backoff = std::min(backoff * 2, max_backoff);
  }
}

void mark_done(LinkControl& control) noexcept {
  {
    std::lock_guard lock(control.mutex);
    control.done = true;
  }
  control.changed.notify_all();
}

ConfigClient make_client(const LinkConfig& config) {
  ConfigClientOptions options;
  options.deadline = config.request_deadline;
  return ConfigClient(config.url, config.token, options);
}

// What the watcher does before it watches (see agent_link.hpp), run by the ClusterWatch on its
// thread with the watch's client: each call is retried on its own while the service is down, so
// that the `note` event is posted once.
class Bootstrapper {
 public:
  Bootstrapper(const LinkConfig& config, Bootstrap bootstrap, std::shared_ptr<Mailbox> mailbox,
               std::shared_ptr<Outage> outage, std::shared_ptr<LinkControl> control)
      : config_(config),
        bootstrap_(std::move(bootstrap)),
        mailbox_(std::move(mailbox)),
        outage_(std::move(outage)),
        control_(std::move(control)) {}

 private:
  template <class Call>
  auto call(Call&& c) {
    return retrying(*control_, *outage_, config_.max_backoff, std::forward<Call>(c));
  }
  void post(LinkMessage message) {
    try {
      mailbox_->post(std::move(message));
    } catch (const std::exception&) {  // out of memory: nothing better to do than drop it
    }
  }

  Cluster write_initial(ConfigClient& client) {
    const auto& ports = *bootstrap_.initial_ports;
    Cluster initial = initial_cluster(config_.host, ports, bootstrap_.algorithm);
    initial.settings.update(bootstrap_.settings);
    const std::string what = std::to_string(ports.size()) + " workers on " + config_.host;
    try {
      Cluster stored = call([&] { return client.put_cluster(initial); });
      post(LinkNote{"wrote the initial cluster: v" + std::to_string(stored.version) + ", " + what});
      call([&] {
        return client.post_event("resized", "", "initial cluster: " + what, stored.version);
      });
      return stored;
    } catch (const ConflictError& e) {
      post(LinkNote{"the cluster was written meanwhile (v" + std::to_string(e.current().version) +
                    "); following it"});
      return e.current();
    }
  }

  // The job is suspended (every worker it had was given notice and left, having written a
  // checkpoint): this host's workers take their place by compare-and-swap; they form the job
  // anew and load its checkpoint. When another agent resumed it first, its document is followed.
  Cluster resume(ConfigClient& client, const Cluster& current) {
    const auto& ports = *bootstrap_.initial_ports;
    const std::string what = std::to_string(ports.size()) + " workers on " + config_.host;
    try {
      Cluster stored =
          call([&] { return client.put_cluster(resumed_cluster(current, config_.host, ports)); });
      post(LinkNote{"resumed the suspended job: " + what + ", v" + std::to_string(current.version) +
                    " -> v" + std::to_string(stored.version)});
      call([&] {
        return client.post_event("resumed", "", host_detail(config_.host, what), stored.version);
      });
      return stored;
    } catch (const ConflictError& e) {
      post(LinkNote{"the suspended job was changed meanwhile (v" +
                    std::to_string(e.current().version) + "); following it"});
      return e.current();
    }
  }

  // Adds this host's workers to the job's cluster by compare-and-swap (rebasing on a conflict),
  // unless the cluster has workers here already; posts `added` for each.
  Cluster join_cluster(ConfigClient& client, Cluster current) {
    const auto& ports = *bootstrap_.initial_ports;
    for (int attempt = 1; attempt <= kMaxRemoveAttempts; ++attempt) {
      if (!owned_ranks(current, config_.host).empty()) return current;
      Cluster next = current;
      for (std::size_t i = 0; i < ports.size(); ++i) {
        next.workers.push_back(WorkerSpec{Endpoint{config_.host, ports[i]}, static_cast<int>(i)});
      }
      try {
        Cluster stored = call([&] { return client.put_cluster(next); });
        post(LinkNote{"joined the job: " + std::to_string(ports.size()) + " workers on " +
                      config_.host + ", v" + std::to_string(current.version) + " -> v" +
                      std::to_string(stored.version)});
        for (const auto port : ports) {
          const std::string name = Endpoint{config_.host, port}.str();
          call([&] {
            return client.post_event("added", name, "kfrun --join on " + config_.host,
                                     stored.version);
          });
        }
        return stored;
      } catch (const ConflictError& e) {
        current = e.current();
      }
    }
    throw Error(make_error_code(errc::conflict), "gave up joining the job after " +
                                                     std::to_string(kMaxRemoveAttempts) +
                                                     " compare-and-swap conflicts");
  }

 public:
  // Helpers above: their return types are deduced.
  // Throws: kf::Error (errc::cancelled once told to stop; others end the watch).
  Cluster operator()(ConfigClient& client) {
    block_pipe_signals();
    try {
      const std::string hello = "kfrun agent on " + config_.host + " watching (" +
                                std::to_string(bootstrap_.slots) + " slots)";
      call([&] { return client.post_event("note", "", hello, std::nullopt); });
      Cluster current = call([&] { return client.get_cluster(); });
      if (bootstrap_.initial_ports && current.version == 0) current = write_initial(client);
      if (bootstrap_.initial_ports && marked_suspended(current)) current = resume(client, current);
      if (bootstrap_.initial_ports && bootstrap_.join &&
          owned_ranks(current, config_.host).empty()) {
        current = join_cluster(client, std::move(current));
      }
      return current;
    } catch (const Stopped&) {
      throw Error(make_error_code(errc::cancelled), "kfrun agent: stopping");
    }
  }

 private:
  LinkConfig config_;
  Bootstrap bootstrap_;
  std::shared_ptr<Mailbox> mailbox_;
  std::shared_ptr<Outage> outage_;
  std::shared_ptr<LinkControl> control_;
};

}  // namespace

// ---- ClusterWatcher --------------------------------------------------------------------------

ClusterWatcher::ClusterWatcher(const LinkConfig& config, Bootstrap bootstrap,
                               std::shared_ptr<Mailbox> mailbox, std::shared_ptr<Outage> outage)
    : control_(std::make_shared<LinkControl>()) {
  ClusterWatchOptions options;
  options.url = config.url;
  options.token = config.token;
  options.request_deadline = config.request_deadline;
  options.poll = config.watch_timeout;
  options.max_backoff = config.max_backoff;
  options.start = Bootstrapper(config, std::move(bootstrap), mailbox, outage, control_);
  ClusterWatchHandlers handlers;
  handlers.on_cluster = [mailbox](const Cluster& c) { mailbox->post(ClusterSeen{c}); };
  handlers.on_error = [mailbox, outage](const Error& e) {
    if (e.code() == errc::service_unavailable) {
      outage->down(e.what());
      return true;
    }
    mailbox->post(LinkFailed{std::string("config service: ") + e.what()});
    return false;
  };
  handlers.on_reached = [outage] { outage->up(); };
  const PipeSignalsBlocked blocked;
  watch_ = std::make_unique<ClusterWatch>(std::move(options), std::move(handlers));
}

ClusterWatcher::~ClusterWatcher() { stop(); }

void ClusterWatcher::stop() noexcept {
  {
    std::lock_guard lock(control_->mutex);
    control_->stop = true;  // ends a bootstrap call's back-off
  }
  control_->changed.notify_all();
  if (watch_) watch_->stop();
}

// ---- Reporter --------------------------------------------------------------------------------

class Reporter::Runner {
 public:
  Runner(const LinkConfig& config, std::shared_ptr<Mailbox> mailbox, std::shared_ptr<Outage> outage,
         std::shared_ptr<LinkControl> control)
      : config_(config),
        mailbox_(std::move(mailbox)),
        outage_(std::move(outage)),
        control_(std::move(control)),
        client_(make_client(config_)) {}

  // Helpers first: their return types are deduced.
  template <class Call>
  auto call(Call&& c) {
    return retrying(*control_, *outage_, config_.max_backoff, std::forward<Call>(c));
  }
  void post(LinkMessage message) {
    try {
      mailbox_->post(std::move(message));
    } catch (const std::exception&) {  // out of memory: nothing better to do than drop it
    }
  }

  // The thread's body: runs the queued requests in order until told to stop.
  void run() noexcept {
    block_pipe_signals();
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(control_->mutex);
        control_->changed.wait(lock, [&] { return control_->stop || !control_->tasks.empty(); });
        if (control_->stop) break;
        task = std::move(control_->tasks.front());
        control_->tasks.pop_front();
        control_->busy = true;
      }
      bool stopped = false;
      try {
        task();
      } catch (const Stopped&) {
        stopped = true;
      } catch (const std::exception& e) {
        post(LinkFailed{std::string("config service: ") + e.what()});
      }
      {
        std::lock_guard lock(control_->mutex);
        control_->busy = false;
      }
      control_->changed.notify_all();
      if (stopped) break;
    }
    mark_done(*control_);
  }

  void post_event(const std::string& type, const std::string& worker, const std::string& detail,
                  std::uint64_t version) {
    call([&] { return client_.post_event(type, worker, detail, version); });
  }

  void judge_exit(const std::string& worker, int wait_status, std::uint64_t version) {
    if (wait_status == kUnknownExit) return judge_adopted_exit(worker, version);
    const bool ok = exit_code_of(wait_status) == 0;
    const std::string detail = ok ? "exit 0" : describe_exit(wait_status);
    post_event(ok ? "exited" : "failed", worker, detail, version);
    Cluster current = call([&] { return client_.get_cluster(); });
    ExitVerdict verdict = ExitVerdict::left;
    if (is_member(current, worker) && ok) {
      // A member that exits 0 ended the job, or left it suspended as every worker of it does.
      if (!marked_suspended(current)) verdict = ExitVerdict::finished;
    } else if (is_member(current, worker)) {
      // A failed member's connections broke with it, so the job's survivors are recovering and
      // remove it themselves within milliseconds: the agent writes only when they have not
      // after a while (they are stuck, or there are none), so that its write does not compete
      // with theirs on the control plane during the recovery.
      current = watch_while(std::move(current), kSurvivorsRemoveWindow,
                            [&](const Cluster& c) { return c.size() > 1 && is_member(c, worker); });
      // Removed by the survivors, it left as a member lost by the job does.
      if (is_member(current, worker)) verdict = remove_member(current, worker, "failed: " + detail);
    }
    post(ExitJudged{worker, verdict});
  }

  // An adopted worker's exit status is unknown, so the document decides. A worker of a finished
  // job ended it; one that is no member any more left. One that is still a member of a running
  // job may have ended the job a moment before rank 0 marked it finished, or have failed a
  // moment before the survivors removed it: the document is watched for either for a while.
  // Still a member of a running job after that, it failed and is removed like any failed worker.
  void judge_adopted_exit(const std::string& worker, std::uint64_t version) {
    const Cluster current = watch_while(
        call([&] { return client_.get_cluster(); }), kAdoptedExitWindow, [&](const Cluster& c) {
          return is_member(c, worker) && !marked_finished(c) && !marked_suspended(c);
        });
    ExitVerdict verdict = ExitVerdict::left;
    if (is_member(current, worker) && marked_suspended(current)) {
      post_event("exited", worker, "status unknown (adopted), the job is suspended", version);
    } else if (is_member(current, worker) && marked_finished(current)) {
      post_event("exited", worker, "status unknown (adopted), the job is finished", version);
      verdict = ExitVerdict::finished;
    } else if (is_member(current, worker)) {
      post_event("failed", worker, "status unknown (adopted), still a member", version);
      verdict = remove_member(current, worker, "failed: exited while a member (adopted)");
    } else {
      post_event("exited", worker, "status unknown (adopted), not a member", version);
    }
    post(ExitJudged{worker, verdict});
  }

  void fail_worker(const std::string& worker, const std::string& why, std::uint64_t version) {
    post_event("failed", worker, why, version);
    const Cluster current = call([&] { return client_.get_cluster(); });
    post(ExitJudged{worker, remove_member(current, worker, "failed: " + why)});
  }

  void move_worker(const std::string& worker, const Endpoint& to) {
    Cluster current = call([&] { return client_.get_cluster(); });
    for (int attempt = 1; attempt <= kMaxRemoveAttempts; ++attempt) {
      Cluster next = current;
      auto it = std::find_if(next.workers.begin(), next.workers.end(),
                             [&](const WorkerSpec& w) { return w.endpoint.str() == worker; });
      if (it == next.workers.end()) return;
      it->endpoint = to;
      try {
        const Cluster stored = call([&] { return client_.put_cluster(next); });
        post(LinkNote{"moved " + worker + " to " + to.str() + " (its port is in use here): v" +
                      std::to_string(current.version) + " -> v" + std::to_string(stored.version)});
        post_event("removed", worker, "its port is in use on its host; moved to " + to.str(),
                   stored.version);
        post_event("added", to.str(), "in place of " + worker + " (its port was in use)",
                   stored.version);
        return;
      } catch (const ConflictError& e) {
        current = e.current();
      }
    }
    post(LinkNote{"error: gave up moving " + worker + " after " +
                  std::to_string(kMaxRemoveAttempts) + " compare-and-swap conflicts"});
  }

  void leave_on_notice(const std::vector<std::string>& workers, const std::string& source,
                       std::chrono::seconds notice, std::uint64_t version) {
    const std::string within = "notice " + std::to_string(notice.count()) + "s";
    post_event("draining", "",
               host_detail(config_.host, source + ", its workers leave the job, " + within),
               version);
    Cluster current = call([&] { return client_.get_cluster(); });
    for (int attempt = 1; attempt <= kMaxRemoveAttempts; ++attempt) {
      if (marked_suspended(current)) return;  // every worker was given notice already
      Cluster next = current;
      std::vector<std::string> leaving;
      for (const auto& w : workers) {
        if (!is_member(next, w)) continue;
        next = without_worker(std::move(next), w);
        leaving.push_back(w);
      }
      if (leaving.empty()) return;  // gone already (kf-member notice took them out)
      // Hot spares on other hosts take the places of the workers (not spares) that leave.
      const auto promoted =
          promote_spares(next, current.workers.size() - next.workers.size(), {config_.host});
      try {
        if (next.workers.empty()) {
          suspend(current, source, within);
          return;
        }
        const Cluster stored = call([&] { return client_.put_cluster(next); });
        std::string names;
        for (const auto& w : leaving) names.append(names.empty() ? "" : ", ").append(w);
        post(LinkNote{"revoked " + names + " (" + source + ", " + within + "): v" +
                      std::to_string(current.version) + " -> v" + std::to_string(stored.version)});
        // "notice Ns" last: agents read the grace from the last "notice " of a detail.
        for (const auto& w : leaving) {
          post_event(is_member(current, w) && !current.is_spare(Endpoint::parse(w)) ? "revoked"
                                                                                    : "released",
                     w, "agent of " + config_.host + ", " + source + ", " + within, stored.version);
        }
        for (const auto& w : promoted) {
          post_event(
              "promoted", w.endpoint.str(),
              "a hot spare, in place of the workers of " + config_.host + " (" + source + ")",
              stored.version);
        }
        return;
      } catch (const ConflictError& e) {
        current = e.current();
      }
    }
    post(LinkNote{"error: gave up revoking this host's workers after " +
                  std::to_string(kMaxRemoveAttempts) + " compare-and-swap conflicts"});
  }

  // Every worker the job has left was given notice: a job keeps at least one worker, so instead
  // of leaving it the job is suspended (its workers write a checkpoint and leave at their next
  // step), for the next agent that starts workers to resume. Throws: ConflictError.
  void suspend(const Cluster& current, const std::string& source, const std::string& within) {
    const Cluster stored = call([&] { return client_.put_cluster(suspended_cluster(current)); });
    post(LinkNote{"suspended the job (" + source + ", " + within +
                  "): every worker it has was given notice; they write a checkpoint and leave at "
                  "their next step, and the next agent started with workers resumes the job: v" +
                  std::to_string(current.version) + " -> v" + std::to_string(stored.version)});
    post_event(
        "suspended", "",
        host_detail(config_.host, source + ", every worker of the job was given notice, " + within),
        stored.version);
  }

  void judge_departure(const std::string& worker, std::uint64_t after_version) {
    const auto end = Clock::now() + config_.departure_window;
    for (;;) {
      read_departures();
      if (auto found = find_departure(departures_, worker, after_version)) {
        post(DepartureJudged{worker, *found});
        return;
      }
      if (Clock::now() >= end) break;
      pause(*control_, config_.departure_poll);
    }
    post(DepartureJudged{worker, Departure{}});
  }

 private:
  // Reads the document every departure_poll while `waiting` holds for the last one read (from
  // `current` on), for up to `window`; returns the last one.
  template <class Waiting>
  Cluster watch_while(Cluster current, std::chrono::milliseconds window, Waiting waiting) {
    const auto end = Clock::now() + window;
    while (waiting(current) && Clock::now() < end) {
      pause(*control_, config_.departure_poll);
      current = call([&] { return client_.get_cluster(); });
    }
    return current;
  }

  // Removes `worker` by compare-and-swap, starting from `current` and rebasing on each conflict,
  // and posts `removed` with `detail`; returns failed (also when someone else removed it first),
  // or failed_last when it is the last worker: the service accepts no empty cluster.
  // Throws: kf::Error (errc::conflict) when out of attempts.
  ExitVerdict remove_member(Cluster current, const std::string& worker, const std::string& detail) {
    for (int attempt = 1; attempt <= kMaxRemoveAttempts; ++attempt) {
      if (!is_member(current, worker)) return ExitVerdict::failed;
      const Cluster next = without_worker(current, worker);
      if (next.workers.empty()) return ExitVerdict::failed_last;
      try {
        const Cluster stored = call([&] { return client_.put_cluster(next); });
        post(LinkNote{"removed " + worker + " from the cluster (" + detail + "): v" +
                      std::to_string(current.version) + " -> v" + std::to_string(stored.version)});
        post_event("removed", worker, detail, stored.version);
        return ExitVerdict::failed;
      } catch (const ConflictError& e) {
        current = e.current();
      }
    }
    throw Error(make_error_code(errc::conflict), "gave up removing " + worker + " after " +
                                                     std::to_string(kMaxRemoveAttempts) +
                                                     " compare-and-swap conflicts");
  }

  // Reads the events not seen yet and keeps those that explain a departure.
  void read_departures() {
    const auto events = call([&] { return client_.get_events(last_seq_); });
    for (const auto& e : events) {
      last_seq_ = std::max(last_seq_, e.seq);
      if (is_departure_event(e.type)) departures_.push_back(e);
      // kf-member notice HOST: this host goes away; its workers are revoked in the same change.
      if (e.type == "notice" && is_about_host(e.detail, config_.host)) {
        post(NoticeSeen{Notice{"kf-member notice", parse_notice(e.detail)}});
      }
    }
  }

  LinkConfig config_;
  std::shared_ptr<Mailbox> mailbox_;
  std::shared_ptr<Outage> outage_;
  std::shared_ptr<LinkControl> control_;
  ConfigClient client_;
  std::vector<ConfigEvent> departures_;  // killed/revoked/removed events read so far
  std::uint64_t last_seq_ = 0;
};

Reporter::Reporter(const LinkConfig& config, std::shared_ptr<Mailbox> mailbox,
                   std::shared_ptr<Outage> outage)
    : control_(std::make_shared<LinkControl>()),
      runner_(std::make_unique<Runner>(config, std::move(mailbox), std::move(outage), control_)) {
  thread_ = std::thread([this] { runner_->run(); });
}

Reporter::~Reporter() { finish(Clock::now()); }

void Reporter::enqueue(std::function<void(Runner&)> task) {
  Runner* runner = runner_.get();  // outlives the thread, which outlives the queue
  auto run = [runner, task = std::move(task)] { task(*runner); };
  {
    std::lock_guard lock(control_->mutex);
    control_->tasks.push_back(std::move(run));
  }
  control_->changed.notify_all();
}

void Reporter::post_event(std::string type, std::string worker, std::string detail,
                          std::uint64_t version) {
  enqueue([=](Runner& r) { r.post_event(type, worker, detail, version); });
}

void Reporter::move_worker(std::string worker, Endpoint to) {
  enqueue([=](Runner& r) { r.move_worker(worker, to); });
}

void Reporter::judge_exit(std::string worker, int wait_status, std::uint64_t version) {
  enqueue([=](Runner& r) { r.judge_exit(worker, wait_status, version); });
}

void Reporter::fail_worker(std::string worker, std::string why, std::uint64_t version) {
  enqueue([=](Runner& r) { r.fail_worker(worker, why, version); });
}

void Reporter::leave_on_notice(std::vector<std::string> workers, std::string source,
                               std::chrono::seconds notice, std::uint64_t version) {
  enqueue([=](Runner& r) { r.leave_on_notice(workers, source, notice, version); });
}

void Reporter::judge_departure(std::string worker, std::uint64_t after_version) {
  enqueue([=](Runner& r) { r.judge_departure(worker, after_version); });
}

std::size_t Reporter::finish(Clock::time_point deadline) noexcept {
  if (!thread_.joinable()) return 0;
  std::size_t dropped = 0;
  {
    std::unique_lock lock(control_->mutex);
    control_->changed.wait_until(lock, deadline, [&] {
      return control_->done || (control_->tasks.empty() && !control_->busy);
    });
    dropped = control_->tasks.size() + (control_->busy ? 1 : 0);
    control_->stop = true;
  }
  control_->changed.notify_all();
  thread_.join();
  return dropped;
}

}  // namespace kf::tools
