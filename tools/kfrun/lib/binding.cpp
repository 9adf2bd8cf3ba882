// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/binding.hpp"

#include <sched.h>

namespace kf::tools {

std::optional<Bind> parse_bind(const std::string& text) {
  if (text == "auto") return Bind::automatic;
  if (text == "none") return Bind::none;
  return std::nullopt;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::optional<int> cpu_for_slot(Bind bind, int slot, int local_workers,
                                const std::vector<int>& cpus) {
  if (bind == Bind::none || cpus.empty() || slot < 0) return std::nullopt;
  if (local_workers <= static_cast<int>(cpus.size())) return std::nullopt;
  return cpus[static_cast<std::size_t>(slot) % cpus.size()];
}

}  // namespace kf::tools
