// SPDX-License-Identifier: Apache-2.0
// The agent's link to the config service: two threads that make all its blocking HTTP calls, so
// that the agent's poll loop (agent.cpp) never waits on the network and keeps copying the
// workers' output and reaping them while the service is slow or down.
//  - ClusterWatcher: a kf::ClusterWatch (the same watch kf::Session uses) that first announces
//    the agent (a `note` event, which also checks the token) and writes the initial cluster when
//    asked to and the service holds none, then long-polls the document and posts each new
//    version.
//  - Reporter: runs the agent's requests in order: post an event, judge a worker's exit (re-read
//    the document; remove a failed member by compare-and-swap), judge a departure (find the
//    killed/revoked/removed event that explains it, and a kf-member notice for this host), revoke
//    this host's workers on a notice.
// Both retry a call that cannot reach the service with a back-off of at most max_backoff, and
// say once per outage that the service is down and once that it is back. They answer through a
// Mailbox the loop polls. Thread-safety: Mailbox::post() from any thread; everything else from
// the thread that owns the object.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kf/cluster/cluster.hpp"
#include "kf/runtime/cluster_watch.hpp"

#include "kfrun/lib/agent_rules.hpp"
#include "kfrun/lib/notice.hpp"
#include "kfrun/lib/unique_fd.hpp"

namespace kf::tools {

/// A new version of the cluster document (the first one is the current document at start).
struct ClusterSeen {
  Cluster cluster;
};
/// One line for the agent's log.
struct LinkNote {
  std::string text;
};
/// What a worker's exit meant, once the document was re-read.
enum class ExitVerdict {
  finished,     ///< exit 0 while a member: the job is done
  left,         ///< no longer a member: it left (revoked, removed, killed)
  failed,       ///< non-zero exit or a signal while a member: removed from the cluster
  failed_last,  ///< as failed, but it is the last worker: the job cannot go on
};
struct ExitJudged {
  std::string worker;  ///< "host:port"
  ExitVerdict verdict;
};
struct DepartureJudged {
  std::string worker;
  Departure departure;
};
/// A notice that came by the service: a `notice` event naming this host (kf-member notice HOST).
struct NoticeSeen {
  Notice notice;
};
/// An error that ends the agent (the token was rejected, the service answers nonsense).
struct LinkFailed {
  std::string what;
};
using LinkMessage =
    std::variant<ClusterSeen, LinkNote, ExitJudged, DepartureJudged, NoticeSeen, LinkFailed>;

/// Messages from the link threads to the agent's poll loop.
class Mailbox {
 public:
  /// Throws: std::system_error when the wake-up pipe cannot be made.
  Mailbox();
  /// Readable while messages wait.
  int fd() const noexcept { return read_.get(); }
  /// Queues a message and wakes the loop. Thread-safe.
  void post(LinkMessage message);
  /// The messages posted so far, oldest first.
  std::vector<LinkMessage> take();

 private:
  std::mutex mutex_;  // guards messages_
  std::vector<LinkMessage> messages_;
  UniqueFd read_;
  UniqueFd write_;
};

struct LinkConfig {
  std::string url;    ///< http://HOST:PORT
  std::string token;  ///< the job token
  std::string host;   ///< the agent's host (for its messages)
  std::chrono::milliseconds request_deadline{3000};
  std::chrono::milliseconds max_backoff{1000};
  std::chrono::milliseconds watch_timeout{60'000};   ///< one long-poll
  std::chrono::milliseconds departure_window{2000};  ///< wait for the event of a departure
  std::chrono::milliseconds departure_poll{50};      ///< how often to look for it
};

/// Whether the service is down, shared by both link threads so that an outage is told once.
class Outage {
 public:
  explicit Outage(std::shared_ptr<Mailbox> mailbox) : mailbox_(std::move(mailbox)) {}
  /// A call could not reach the service: says so unless it was already known. Thread-safe.
  void down(const std::string& why);
  /// A call reached the service: says it is back if it was down. Thread-safe.
  void up();

 private:
  std::mutex mutex_;  // guards down_
  bool down_ = false;
  std::shared_ptr<Mailbox> mailbox_;
};

/// A link thread's stop flag, shared with the thread (which may outlive its owner, see
/// ClusterWatcher::stop()).
struct LinkControl;

/// What the watcher does before it watches.
struct Bootstrap {
  /// The ports of the initial cluster (-np K): written when the service holds version 0.
  std::optional<std::vector<std::uint16_t>> initial_ports;
  std::optional<std::string> algorithm;
  /// Join: add those workers to a cluster the service holds, when none of its workers is on this
  /// host (AgentOptions::join).
  bool join = false;
  int slots = 0;                                       ///< for the `note` event
  nlohmann::json settings = nlohmann::json::object();  ///< added to the initial cluster's settings
};

class ClusterWatcher {
 public:
  ClusterWatcher(const LinkConfig& config, Bootstrap bootstrap, std::shared_ptr<Mailbox> mailbox,
                 std::shared_ptr<Outage> outage);
  ClusterWatcher(const ClusterWatcher&) = delete;
  ClusterWatcher& operator=(const ClusterWatcher&) = delete;
  /// Calls stop().
  ~ClusterWatcher();
  /// Stops the watch: a long-poll or back-off in flight is cut short and the thread joined.
  void stop() noexcept;

 private:
  std::shared_ptr<LinkControl> control_;
  std::unique_ptr<ClusterWatch> watch_;
};

class Reporter {
 public:
  Reporter(const LinkConfig& config, std::shared_ptr<Mailbox> mailbox,
           std::shared_ptr<Outage> outage);
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;
  /// Calls finish() with a deadline of now.
  ~Reporter();

  /// POST /v1/events.
  void post_event(std::string type, std::string worker, std::string detail, std::uint64_t version);
  /// Posts `exited` ("exit 0") or `failed` (describe_exit), re-reads the document and answers
  /// ExitJudged; a member that failed is first removed by compare-and-swap (event `removed`,
  /// detail "failed: ...").
  void judge_exit(std::string worker, int wait_status, std::uint64_t version);
  /// For a worker that could not be started: posts `failed` with `why`, removes it from the
  /// cluster like judge_exit does and answers ExitJudged (failed or failed_last).
  void fail_worker(std::string worker, std::string why, std::uint64_t version);
  /// Looks for the event that explains why `worker` left after `after_version` (kf-member posts
  /// it just after its change), for up to departure_window; answers DepartureJudged (unknown
  /// when no event came).
  void judge_departure(std::string worker, std::uint64_t after_version);
  /// Leaves on a notice from `source`: posts `draining` for this host, removes those of
  /// `workers` still in the cluster by compare-and-swap and posts `revoked` for each with the
  /// notice ("agent of HOST, SOURCE, notice Ns"). When that would leave the cluster empty (they
  /// are all the job has), suspends the job instead (settings "suspended", a `suspended` event):
  /// the workers write a checkpoint and leave at their next step.
  void leave_on_notice(std::vector<std::string> workers, std::string source,
                       std::chrono::seconds notice, std::uint64_t version);
  /// Gives `worker` (not started: its port is in use on this host) the address `to` in the
  /// document by compare-and-swap, keeping its rank and slot, and posts `removed` and `added`
  /// saying so. Nothing when it is no member any more.
  void move_worker(std::string worker, Endpoint to);

  /// Waits until the queued requests are done or `deadline` passes, then stops the thread and
  /// returns how many requests were dropped. noexcept.
  std::size_t finish(std::chrono::steady_clock::time_point deadline) noexcept;

 private:
  class Runner;
  void enqueue(std::function<void(Runner&)> task);

  std::shared_ptr<LinkControl> control_;
  std::unique_ptr<Runner> runner_;  // used by thread_ only
  std::thread thread_;
};

}  // namespace kf::tools
