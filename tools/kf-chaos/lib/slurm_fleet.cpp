// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/slurm_fleet.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "kf-chaos/lib/job.hpp"

namespace kf::chaos {

std::string shell_quoted(const std::string& text) {
  std::string q = "'";
  for (const char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CommandResult run_command(const std::string& shell_command) {
  CommandResult r;
  FILE* p = ::popen((shell_command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, p)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

SlurmFleet::SlurmFleet(SlurmOptions options, std::string agent, std::vector<std::string> env,
                       std::filesystem::path dir)
    : options_(std::move(options)),
      agent_(std::move(agent)),
      env_(std::move(env)),
      dir_(std::move(dir)) {}

SlurmFleet::~SlurmFleet() { cancel_all(); }

std::vector<std::string> SlurmFleet::busy() const {
  std::vector<std::string> nodes;
  for (const auto& [node, id] : on_node_) nodes.push_back(node);
  return nodes;
}

std::optional<std::string> SlurmFleet::free_node() const {
  for (const auto& n : options_.nodes) {
    if (!on_node_.contains(n) && !leaving_.contains(n)) return n;
  }
  return std::nullopt;
}

std::optional<std::string> SlurmFleet::wait_free_node(Clock::time_point until) {
  for (;;) {
    if (auto n = free_node()) return n;
    if (Clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // squeue is polled
    poll();
  }
}

void SlurmFleet::allocate(const std::string& node) {
  const auto out = dir_ / ("alloc-" + std::to_string(made_.size() + 1) + ".out");
  std::string cmd = "env";
  for (const auto& e : env_) cmd += " " + shell_quoted(e);
  cmd += " sbatch --parsable -N1 -w " + shell_quoted(node) + " --exclusive --signal=USR1@" +
         std::to_string(options_.signal_s) + " --output=" + shell_quoted(out.string());
  if (!options_.partition.empty()) cmd += " -p " + shell_quoted(options_.partition);
  cmd += " --wrap " + shell_quoted("srun --ntasks-per-node=1 " + agent_);
  const CommandResult r = run_command(cmd);
  std::smatch m;
  if (r.code != 0 || !std::regex_search(r.output, m, std::regex(R"(^(\d+))"))) {
    throw std::runtime_error("sbatch for node " + node + " refused: " + r.output);
  }
  on_node_[node] = m[1];
  made_.push_back(m[1]);
  outputs_.push_back(out);
}

void SlurmFleet::preempt(const std::string& node) {
  const std::string id = on_node_.at(node);
  std::string cmd =
      "sbatch --parsable -N1 -w " + shell_quoted(node) + " --exclusive --output=/dev/null";
  if (!options_.preempt_partition.empty()) cmd += " -p " + shell_quoted(options_.preempt_partition);
  // It runs `true` once Slurm has taken the node back and ends by itself: a scancel that meets
  // a job while it starts can make Slurm 22.05 keep the node's resources as in use.
  cmd += " --wrap true";
  const CommandResult r = run_command(cmd);
  std::smatch m;
  if (r.code != 0 || !std::regex_search(r.output, m, std::regex(R"(^(\d+))"))) {
    throw std::runtime_error("sbatch of the preempting job on " + node + " refused: " + r.output);
  }
  removed_.insert(id);
  on_node_.erase(node);
  leaving_[node] = Leaving{id, m[1], Clock::now() + std::chrono::seconds(120)};
}

void SlurmFleet::kill(const std::string& node) {
  const std::string id = on_node_.at(node);
  removed_.insert(id);
  run_command("scancel --signal=KILL --full " + id);
  on_node_.erase(node);
  leaving_[node] = Leaving{id, "", Clock::now() + std::chrono::seconds(60)};
}

void SlurmFleet::poll() {
  if (leaving_.empty()) return;
  const auto q = queue();
  if (!q) return;
  for (auto it = leaving_.begin(); it != leaving_.end();) {
    auto& [node, l] = *it;
    if (q->contains(l.id)) {
      if (Clock::now() < l.give_up) {
        ++it;
        continue;
      }
      if (!l.preemptor.empty()) {
        run_command("scancel " + l.preemptor);
        throw std::runtime_error("allocation " + l.id + " on " + node +
                                 " was not preempted within 120 s");
      }
      // Killed, yet Slurm has not ended it: it is cancelled as well, and waited for again.
      run_command("scancel " + l.id);
      l.give_up = Clock::now() + std::chrono::seconds(60);
      ++it;
      continue;
    }
    // The allocation is gone; the preempting job runs on the node and ends by itself.
    if (!l.preemptor.empty() && q->contains(l.preemptor)) {
      if (Clock::now() >= l.give_up) {
        run_command("scancel " + l.preemptor);
        throw std::runtime_error("the preempting job " + l.preemptor + " on " + node +
                                 " did not end within 120 s of the preemption");
      }
      ++it;
      continue;
    }
    it = leaving_.erase(it);
  }
}

void SlurmFleet::cancel(const std::string& node) {
  const std::string id = on_node_.at(node);
  removed_.insert(id);
  run_command("scancel " + id);
  on_node_.erase(node);
  wait_gone(id, std::chrono::seconds(60));
}

std::optional<int> SlurmFleet::ended(Clock::time_point until) {
  for (;;) {
    if (const auto q = queue()) {
      if (std::none_of(made_.begin(), made_.end(),
                       [&](const auto& id) { return q->contains(id); })) {
        break;
      }
    }
    if (Clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // squeue is polled
    poll();
  }
  on_node_.clear();
  int code = 0;
  for (const auto& id : made_) {
    if (removed_.contains(id)) continue;  // preempted, killed or cancelled on purpose
    const CommandResult r = run_command("scontrol -o show job " + id);
    std::smatch m;
    // A job Slurm has already forgotten cannot be told: its output is judged instead.
    if (std::regex_search(r.output, m, std::regex(R"(JobState=(\S+).*ExitCode=(\d+):(\d+))"))) {
      if (m[1] != "COMPLETED" || m[2] != "0") code = 1;
    }
  }
  return code;
}

void SlurmFleet::cancel_all() {
  const auto q = queue();
  for (const auto& id : made_) {
    if (!q || q->contains(id)) run_command("scancel " + id);
  }
  for (const auto& [node, l] : leaving_) {
    if (!l.preemptor.empty() && (!q || q->contains(l.preemptor))) {
      run_command("scancel " + l.preemptor);
    }
  }
  on_node_.clear();
  leaving_.clear();
}

std::string SlurmFleet::output() const {
  std::string all;
  for (const auto& p : outputs_) all += slurp(p);
  return all;
}

std::optional<std::set<std::string>> SlurmFleet::queue() {
  // `squeue -j ID` of a job already purged prints an error instead of nothing: the whole queue
  // is asked instead.
  const CommandResult r = run_command("squeue -h -o %i");
  if (r.code != 0) return std::nullopt;
  std::set<std::string> ids;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) ids.insert(line);
  return ids;
}

bool SlurmFleet::gone(const std::string& id) const {
  const auto q = queue();
  return q && !q->contains(id);
}

bool SlurmFleet::wait_gone(const std::string& id, std::chrono::seconds within) const {
  const auto until = Clock::now() + within;
  while (!gone(id)) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // squeue is polled
  }
  return true;
}

}  // namespace kf::chaos
