// SPDX-License-Identifier: Apache-2.0
// Finding the workers an earlier agent of this host started and left behind (it was killed or
// crashed while they ran), so that a restarted agent adopts them instead of starting second
// copies that could not bind their ports. A worker of an agent carries KF_AGENT_PID (the pid of
// the agent that started it) in its environment; once that agent is gone the kernel gives the
// worker another parent, which is how an orphan is told from a worker whose agent still runs.
// Linux only (/proc, pidfd_open). Thread-safety: free functions.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kf/common/env.hpp"

namespace kf::tools {

/// The environment variable that names the agent that started a worker.
inline constexpr const char* kAgentPidVariable = env::kAgentPid;

/// What /proc says of one process.
struct ProcessFacts {
  pid_t pid = 0;
  pid_t parent = 0;
  pid_t group = 0;
  std::vector<std::string> environment;  ///< "NAME=VALUE"
};

/// A worker left behind by an earlier agent: its pid and its name ("host:port", its KF_SELF).
struct Orphan {
  pid_t pid = 0;
  std::string name;
};

/// Whether `p` is an orphaned worker of job `job_id` on `host`: a process group leader (the
/// worker itself, not a helper it forked) whose KF_JOB_ID is `job_id`, whose KF_SELF is on
/// `host`, and whose parent is not the agent named by its KF_AGENT_PID. Its name when it is.
std::optional<Orphan> orphan_of(const ProcessFacts& p, std::string_view job_id,
                                std::string_view host);

/// The facts of one process from /proc/PID/stat and /proc/PID/environ; nullopt when it is gone,
/// belongs to another user or cannot be read.
std::optional<ProcessFacts> read_process(pid_t pid);

/// Every orphaned worker of job `job_id` on `host` among this user's processes, by pid.
std::vector<Orphan> find_orphans(std::string_view job_id, std::string_view host);

}  // namespace kf::tools
