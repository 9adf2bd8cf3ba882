// SPDX-License-Identifier: Apache-2.0
// Which core a worker that kfrun starts is held to. With more workers on a host than cores
// they take turns on the cores, and where the scheduler happens to put them decides how long
// each turn waits: three on one core and one alone on the other make a 4-byte allreduce of 4
// workers on 2 cores 2.3x slower than two on each, and a run keeps whichever placement it begins
// with (docs/performance.md). Held to core slot % cores, a host's workers are spread evenly and
// stay so. With no more workers than cores nothing is held: each worker polls on a core of its
// own wherever the scheduler puts it, and its threads (a framework's compute threads among
// them) keep every core it may use. Static jobs only (kfrun -np): an agent's workers come and
// go, and workers held by slot could end up sharing a core while another idles.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kf::tools {

enum class Bind {
  automatic,  ///< hold each worker to one core when the host has more workers than cores
  none,       ///< never
};

/// "auto" or "none"; nullopt for anything else.
std::optional<Bind> parse_bind(const std::string& text);

/// The CPUs this process may run on (its affinity mask), in increasing order; empty when the
/// mask cannot be read.
std::vector<int> allowed_cpus();

/// The CPU that the worker in `slot` is held to, or nullopt to leave it where the scheduler
/// puts it. `local_workers` is the number of workers on this host (kfrun -np); `cpus` is
/// allowed_cpus().
std::optional<int> cpu_for_slot(Bind bind, int slot, int local_workers,
                                const std::vector<int>& cpus);

}  // namespace kf::tools
