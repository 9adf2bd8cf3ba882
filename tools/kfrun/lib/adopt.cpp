// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/adopt.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <sstream>

#include "kf/common/fd.hpp"

namespace kf::tools {

namespace {

std::optional<std::string_view> value_of(const std::vector<std::string>& env,
                                         std::string_view name) {
  for (const auto& entry : env) {
    if (entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 &&
        entry[name.size()] == '=') {
      return std::string_view(entry).substr(name.size() + 1);
    }
  }
  return std::nullopt;
}

std::optional<long> to_long(std::string_view s) {
  long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<Orphan> orphan_of(const ProcessFacts& p, std::string_view job_id,
                                std::string_view host) {
  if (p.pid <= 0 || p.group != p.pid) return std::nullopt;
  const auto job = value_of(p.environment, "KF_JOB_ID");
  const auto self = value_of(p.environment, "KF_SELF");
  const auto agent = value_of(p.environment, kAgentPidVariable);
  if (!job || *job != job_id || !self || !agent) return std::nullopt;
  const auto colon = self->rfind(':');
  if (colon == std::string_view::npos || self->substr(0, colon) != host) return std::nullopt;
  const auto agent_pid = to_long(*agent);
  if (!agent_pid || *agent_pid == p.parent) return std::nullopt;  // its agent still runs
  return Orphan{p.pid, std::string(*self)};
}

std::optional<ProcessFacts> read_process(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || st.st_uid != ::geteuid()) return std::nullopt;
  const auto stat_text = read_whole_file(dir + "/stat");
  if (!stat_text) return std::nullopt;
  // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses, so parse after the
  // last ')'.
  const auto close = stat_text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat_text->substr(close + 1));
  std::string state;
  long parent = 0, group = 0;
  if (!(fields >> state >> parent >> group)) return std::nullopt;
  const auto env_text = read_whole_file(dir + "/environ");
  if (!env_text) return std::nullopt;
  ProcessFacts p{pid, static_cast<pid_t>(parent), static_cast<pid_t>(group), {}};
  std::size_t start = 0;
  while (start < env_text->size()) {
    const auto end = std::min(env_text->find('\0', start), env_text->size());
    if (end > start) p.environment.emplace_back(env_text->substr(start, end - start));
    start = end + 1;
  }
  return p;
}

std::vector<Orphan> find_orphans(std::string_view job_id, std::string_view host) {
  std::vector<Orphan> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const auto pid = to_long(entry.path().filename().string());
    if (!pid || *pid <= 0 || *pid == ::getpid()) continue;
    const auto facts = read_process(static_cast<pid_t>(*pid));
    if (!facts) continue;
    if (auto orphan = orphan_of(*facts, job_id, host)) out.push_back(std::move(*orphan));
  }
  std::sort(out.begin(), out.end(), [](const Orphan& a, const Orphan& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace kf::tools
