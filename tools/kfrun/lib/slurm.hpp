// SPDX-License-Identifier: Apache-2.0
// kfrun --watch --slurm: an agent started by srun inside a Slurm allocation takes what it would
// otherwise be told from Slurm's environment: the number of slots (the node's GPUs, else its
// CPUs allocated to the step), its host (the address of this node that routes to the config
// service), and the workers it places on its node when it starts (one per slot, added to the
// job's cluster, or the cluster when there is none). Slurm's preemption signal (USR1, as
// `sbatch --signal=USR1@N` sends it) is a notice. docs/slurm.md shows the sbatch scripts.
// Thread-safety: free functions.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kfrun/lib/agent.hpp"

namespace kf::tools {

/// Looks up an environment variable: nullopt when unset or empty.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

/// The process's own environment.
std::optional<std::string> process_env(const char* name);

/// Fills in what --slurm takes from Slurm where the command line left it unset: `slots` from
/// SLURM_GPUS_ON_NODE (when above 0) or SLURM_CPUS_ON_NODE; `host`, when `host_given` is false,
/// from the route to the config service; `np` = the slots, with `join` set (the workers are
/// placed on this node even when the job exists); and SIGUSR1 and SIGTERM as notice signals
/// (the workers ignore both: Slurm sends them to every process of the step) unless
/// --notice-signal named any. Throws: std::invalid_argument naming what is wrong: not inside an
/// allocation (no SLURM_JOB_ID), a Slurm variable missing or not a positive integer, the builtin
/// service (it could not be reached from the other nodes), no route to the service.
void apply_slurm(AgentOptions& options, bool host_given, const EnvLookup& env);

/// --requeue (after apply_slurm): sets `requeue_job` to SLURM_JOB_ID. Throws:
/// std::invalid_argument when it is not a job id (digits, optionally "_" and an array index).
void apply_slurm_requeue(AgentOptions& options, const EnvLookup& env);

/// The local address this machine would use to reach `host`:`port` (a UDP socket connected
/// there; nothing is sent). Throws: std::invalid_argument naming the host when there is no route
/// or it does not resolve.
std::string local_address_towards(const std::string& host, std::uint16_t port);

}  // namespace kf::tools
