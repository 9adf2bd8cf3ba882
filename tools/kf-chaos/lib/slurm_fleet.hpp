// SPDX-License-Identifier: Apache-2.0
// kf-replay's Slurm driver (docs/chaos.md, "Through Slurm"): each worker of the replayed job is
// an allocation of one Slurm node running `srun kfrun --watch --slurm -np 1`, so that a trace's
// additions are real allocations and its removals real preemptions (a job of a higher-priority
// partition submitted onto the node: Slurm signals the allocation, whose agent drains) or, for
// the drawn share of kills, `scancel --signal=KILL`. It talks to Slurm with its commands (sbatch,
// squeue, scancel, scontrol), as a user would. Thread-safety: one thread.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kf::chaos {

struct SlurmOptions {
  std::vector<std::string> nodes;  ///< the Slurm nodes to use, one worker each
  std::string partition;           ///< where the workers' allocations go ("": Slurm's default)
  std::string preempt_partition;   ///< a partition whose jobs preempt those of `partition`
  int signal_s = 5;                ///< the allocations' --signal=USR1@N
};

/// `text` quoted for a POSIX shell (in single quotes).
std::string shell_quoted(const std::string& text);

/// The output of a shell command and its exit status.
struct CommandResult {
  int code = -1;
  std::string output;  ///< stdout and stderr
};
CommandResult run_command(const std::string& shell_command);

class SlurmFleet {
 public:
  using Clock = std::chrono::steady_clock;

  /// `agent` is the command an allocation runs on its node (kfrun and its arguments, quoted for
  /// the shell), `env` "NAME=VALUE" pairs for it; outputs go to `dir`/alloc-K.out.
  SlurmFleet(SlurmOptions options, std::string agent, std::vector<std::string> env,
             std::filesystem::path dir);
  /// Cancels every allocation it made that is still there.
  ~SlurmFleet();
  SlurmFleet(const SlurmFleet&) = delete;
  SlurmFleet& operator=(const SlurmFleet&) = delete;

  /// The nodes that hold an allocation of the job.
  std::vector<std::string> busy() const;
  /// A node without one (nor one being removed), or nullopt.
  std::optional<std::string> free_node() const;
  /// A free node, waiting (and tending the removals, poll()) until `until` at most.
  std::optional<std::string> wait_free_node(Clock::time_point until);
  /// Allocates `node` for one more worker. Throws: std::runtime_error with sbatch's answer.
  void allocate(const std::string& node);
  /// Preempts the allocation on `node` with a job of the preempting partition (it runs `true`
  /// once it has the node) and returns at once: poll() frees the node once both are gone (the
  /// allocation's agent left on the notice). Throws: std::runtime_error with sbatch's answer.
  void preempt(const std::string& node);
  /// scancel --signal=KILL of the allocation on `node` (no notice: every process of it dies);
  /// returns at once, poll() frees the node once Slurm has ended the allocation.
  void kill(const std::string& node);
  /// scancel of the allocation on `node` (SIGTERM, a notice for `kfrun --slurm`); waits until it
  /// is gone (60 s at most).
  void cancel(const std::string& node);
  /// Tends the removals under way (one squeue): frees the nodes whose jobs are all gone.
  /// Throws: std::runtime_error when an allocation was not preempted, or its preempting job did
  /// not end, within 120 s of the preempting job.
  void poll();
  /// Whether every allocation made is gone from the queue (the job ended), waiting (and tending
  /// the removals) until `until` at most; then the exit code: 0 when every one not removed on
  /// purpose completed with 0 (as far as Slurm still remembers them).
  std::optional<int> ended(Clock::time_point until);
  /// Cancels every allocation and preempting job still there.
  void cancel_all();
  /// The output of every allocation, in the order they were made.
  std::string output() const;

 private:
  /// The ids of the jobs in Slurm's queue (pending, running or completing).
  static std::optional<std::set<std::string>> queue();
  bool gone(const std::string& id) const;
  bool wait_gone(const std::string& id, std::chrono::seconds within) const;

  SlurmOptions options_;
  std::string agent_;
  std::vector<std::string> env_;
  std::filesystem::path dir_;
  // A node whose allocation is being removed: the allocation, the job preempting it (if any)
  // and when a preemption that has not happened is given up.
  struct Leaving {
    std::string id;
    std::string preemptor;
    Clock::time_point give_up;
  };

  std::map<std::string, std::string> on_node_;  // node -> job id, while allocated
  std::map<std::string, Leaving> leaving_;      // node -> its removal, until the node is free
  std::vector<std::string> made_;               // every job id, in order
  std::set<std::string> removed_;               // preempted, killed or cancelled on purpose
  std::vector<std::filesystem::path> outputs_;
};

}  // namespace kf::chaos
