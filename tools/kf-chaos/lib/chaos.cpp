// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/chaos.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "kf-chaos/lib/job.hpp"
#include "kf-chaos/lib/verdict.hpp"
#include "kf-member/lib/commands.hpp"
#include "kf/runtime/config_client.hpp"

namespace kf::chaos {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr std::array<std::pair<Kind, std::string_view>, 8> kKindNames{{
    {Kind::add, "add"},
    {Kind::revoke, "revoke"},
    {Kind::kill, "kill"},
    {Kind::double_kill, "double-kill"},
    {Kind::stop, "stop"},
    {Kind::server_restart, "server-restart"},
    {Kind::agent_restart, "agent-restart"},
    {Kind::burst, "burst"},
}};

std::int64_t draw(std::mt19937_64& gen, const MsRange& r) {
  return std::uniform_int_distribution<std::int64_t>(r.lo, r.hi)(gen);
}

}  // namespace

std::string_view name_of(Kind k) noexcept {
  for (const auto& [kind, name] : kKindNames) {
    if (kind == k) return name;
  }
  return "?";
}

std::vector<Kind> parse_kinds(std::string_view text) {
  std::vector<Kind> kinds;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    const auto it = std::find_if(kKindNames.begin(), kKindNames.end(),
                                 [&](const auto& kn) { return kn.second == item; });
    if (it == kKindNames.end()) {
      throw std::invalid_argument(
          "--kinds: unknown event '" + std::string(item) +
          "' (add, revoke, kill, double-kill, stop, server-restart, agent-restart, burst)");
    }
    if (std::find(kinds.begin(), kinds.end(), it->first) == kinds.end()) {
      kinds.push_back(it->first);
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  if (kinds.empty()) throw std::invalid_argument("--kinds: no event named");
  return kinds;
}

MsRange MsRange::parse(std::string_view text, std::string_view what) {
  const auto number = [&](std::string_view s) {
    std::int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v > 3'600'000) {
      throw std::invalid_argument(std::string(what) + ": '" + std::string(text) +
                                  "' is not a number of milliseconds (0-3600000) or a range A-B");
    }
    return v;
  };
  const auto dash = text.find('-');
  MsRange r;
  r.lo = number(text.substr(0, dash));
  r.hi = dash == std::string_view::npos ? r.lo : number(text.substr(dash + 1));
  if (r.hi < r.lo) {
    throw std::invalid_argument(std::string(what) + ": '" + std::string(text) +
                                "' ends before it starts");
  }
  return r;
}

void check(const Options& o) {
  if (o.command.empty())
    throw std::invalid_argument("no program given: kf-chaos [options] -- PROG");
  if (o.min_workers < 1) throw std::invalid_argument("--min-workers must be at least 1");
  if (o.max_workers < o.min_workers) {
    throw std::invalid_argument("--max-workers must be at least --min-workers");
  }
  if (o.np < o.min_workers || o.np > o.max_workers) {
    throw std::invalid_argument("-np must lie within --min-workers and --max-workers");
  }
  if (o.events < 0) throw std::invalid_argument("--events must not be negative");
  if (o.notice_s < 0) throw std::invalid_argument("--notice-s must not be negative");
  if (o.finish_with &&
      (o.finish_with->find('=') == std::string::npos || o.finish_with->front() == '=')) {
    throw std::invalid_argument("--finish-with: '" + *o.finish_with + "' is not KEY=VALUE");
  }
}

int run(const Options& o, std::ostream& out) {
  check(o);
  WorkDir work(o.dir);
  const fs::path& dir = work.path();
  const auto start = Clock::now();
  const auto stamp = [&] {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::ostringstream t;
    t << "[" << std::fixed;
    t.precision(3);
    t.width(8);
    t << s << " s] ";
    return t.str();
  };
  std::map<Kind, int> counts;
  std::optional<int> ended_early;
  std::vector<std::string> problems;
  Verdict verdict;
  double finish_s = 0;
  {
    Job job(JobSpec{o.kfrun, o.config_server, o.np, o.max_workers, o.command, {}}, dir);
    job.start_server();
    job.start_agent();
    out << stamp() << "job started: " << o.np << " workers, config service " << job.url()
        << ", seed " << o.seed << std::endl;
    std::mt19937_64 gen(o.seed);
    for (int i = 0; i < o.events; ++i) {
      const auto until = Clock::now() + milliseconds(draw(gen, o.interval));
      if (auto code = job.agent_exit(until)) {
        ended_early = code;
        out << stamp() << "the job ended during the chaos: kfrun exited with " << *code
            << std::endl;
        break;
      }
      auto client = job.client();
      const Cluster c = client.get_cluster();
      const auto live = job.live_members(c);
      // Who may be a victim: every running member but --min-workers of those that hold the
      // job's state (they joined it). A worker still joining holds none: were the holders all
      // lost, the job's committed progress would be lost with them, which no runtime can help.
      std::vector<std::pair<std::string, pid_t>> candidates;
      {
        std::vector<std::string> holders;
        for (const auto& [w, pid] : live) {
          if (job.has_joined(w)) holders.push_back(w);
        }
        std::shuffle(holders.begin(), holders.end(), gen);
        holders.resize(std::min(holders.size(), static_cast<std::size_t>(o.min_workers)));
        for (const auto& m : live) {
          if (std::find(holders.begin(), holders.end(), m.first) == holders.end()) {
            candidates.push_back(m);
          }
        }
      }
      std::vector<Kind> can;
      for (const Kind k : o.kinds) {
        const bool shrinks = k == Kind::revoke || k == Kind::kill || k == Kind::stop;
        if (k == Kind::add && c.size() >= o.max_workers) continue;
        if (shrinks && (static_cast<int>(live.size()) <= o.min_workers || candidates.empty())) {
          continue;
        }
        const bool several = k == Kind::double_kill || k == Kind::burst;
        if (several &&
            (static_cast<int>(live.size()) <= o.min_workers + 1 || candidates.size() < 2)) {
          continue;
        }
        can.push_back(k);
      }
      if (can.empty()) {
        out << stamp() << "no event fits (" << c.size() << " members, " << live.size()
            << " running)" << std::endl;
        continue;
      }
      const Kind k = can[std::uniform_int_distribution<std::size_t>(0, can.size() - 1)(gen)];
      ++counts[k];
      std::shuffle(candidates.begin(), candidates.end(), gen);
      const auto victim = candidates.begin();  // valid for the kinds that need one
      std::ostringstream said;
      member::CommandContext ctx{client, said};
      std::string line;
      try {
        switch (k) {
          case Kind::add: {
            member::add(ctx, member::AddOptions{});
            line = "add: " + said.str();
            break;
          }
          case Kind::revoke:
            member::revoke(ctx, victim->first, o.notice_s);
            line = "revoke " + victim->first + " with " + std::to_string(o.notice_s) +
                   " s notice: " + said.str();
            break;
          case Kind::kill:
            ::kill(victim->second, SIGKILL);
            line = "kill -9 " + victim->first + " (pid " + std::to_string(victim->second) + ")";
            break;
          case Kind::double_kill: {
            const auto other = std::next(victim);  // another worker than the victim
            ::kill(victim->second, SIGKILL);
            ::kill(other->second, SIGKILL);
            line = "kill -9 " + victim->first + " and " + other->first + " (pids " +
                   std::to_string(victim->second) + ", " + std::to_string(other->second) + ")";
            break;
          }
          case Kind::burst: {
            // Two or three victims (never below --min-workers), each 0-50 ms after the last.
            std::vector<std::pair<std::string, pid_t>> victims = candidates;
            const int most = std::min({3, static_cast<int>(live.size()) - o.min_workers,
                                       static_cast<int>(candidates.size())});
            victims.resize(static_cast<std::size_t>(
                std::uniform_int_distribution<int>(2, std::max(2, most))(gen)));
            line = "kill -9 in a burst:";
            for (std::size_t j = 0; j < victims.size(); ++j) {
              const auto gap = j == 0 ? 0 : draw(gen, MsRange{0, 50});
              std::this_thread::sleep_for(milliseconds(gap));  // the stagger is the event
              ::kill(victims[j].second, SIGKILL);
              line += " " + victims[j].first + (j == 0 ? "" : " (+" + std::to_string(gap) + " ms)");
            }
            break;
          }
          case Kind::stop: {
            const auto ms = draw(gen, o.stop);
            ::kill(victim->second, SIGSTOP);
            std::this_thread::sleep_for(milliseconds(ms));  // the event is the pause itself
            ::kill(victim->second, SIGCONT);
            line = "SIGSTOP " + victim->first + " (pid " + std::to_string(victim->second) +
                   ") for " + std::to_string(ms) + " ms, then SIGCONT";
            break;
          }
          case Kind::server_restart: {
            job.kill_server();
            const auto down = Clock::now();
            job.start_server();
            line = "config service killed (kill -9) and started again: answering after " +
                   std::to_string(
                       std::chrono::duration_cast<milliseconds>(Clock::now() - down).count()) +
                   " ms";
            break;
          }
          case Kind::agent_restart:
            job.kill_agent();
            job.start_agent();
            line = "agent killed (kill -9) and started again";
            break;
        }
      } catch (const std::exception& e) {
        line = std::string(name_of(k)) + " failed: " + e.what();
      }
      while (!line.empty() && line.back() == '\n') line.pop_back();
      out << stamp() << line << std::endl;
    }
    const auto last_event = Clock::now();
    if (!ended_early && o.finish_with) {
      // An agent restarted just now may not read its workers' output yet, and the final
      // lines the finish makes them write would be lost: it first takes them over.
      if (!job.wait_agent_attached(Clock::now() + o.finish_timeout)) {
        out << stamp() << "the agent has not taken over every worker; finishing anyway"
            << std::endl;
      }
      auto client = job.client();
      write_setting(client, *o.finish_with);
      out << stamp() << "finish: settings " << *o.finish_with << std::endl;
    }
    auto code = ended_early ? ended_early : job.agent_exit(last_event + o.finish_timeout);
    finish_s = std::chrono::duration<double>(Clock::now() - last_event).count();
    if (!code) {
      problems.push_back("the job hung: it had not finished " +
                         std::to_string(o.finish_timeout.count()) + " s after the last event");
      job.kill_agent();
      job.kill_workers();
    } else {
      out << stamp() << "kfrun exited with " << *code << std::endl;
      if (*code != 0) {
        problems.push_back("kfrun exited with " + std::to_string(*code) + ": " +
                           last_lines(job.agent_errors(), 5));
      }
    }
    job.stop_server();
    verdict = judge(job.agent_output());
  }
  problems.insert(problems.end(), verdict.problems.begin(), verdict.problems.end());

  std::ostringstream kinds;
  int total = 0;
  for (const auto& [k, n] : counts) {
    kinds << (total == 0 ? "" : ", ") << name_of(k) << " " << n;
    total += n;
  }
  out << "kf-chaos: seed " << o.seed << ": " << total << " events" << (total ? " (" : "")
      << kinds.str() << (total ? ")" : "") << "; the job finished " << std::fixed;
  out.precision(1);
  out << finish_s << " s after the last event" << std::endl;
  if (verdict.finals > 0) {
    out << "kf-chaos: " << verdict.finals << (verdict.finals == 1 ? " worker" : " workers")
        << " finished at step " << verdict.final_step
        << (verdict.problems.empty() ? " with identical parameters (hash " + verdict.hash + ")"
                                     : "")
        << "; " << verdict.changes << " changes, committed steps up to " << verdict.last_commit
        << std::endl;
  }
  const auto pauses = [&](const char* what, const std::vector<double>& ms) {
    if (ms.empty()) return;
    out << "kf-chaos: survivors' pause " << what << ": " << ms.size() << " pauses, p50 "
        << percentile(ms, 50) << " ms, p95 " << percentile(ms, 95) << " ms, p99 "
        << percentile(ms, 99) << " ms, max " << percentile(ms, 100) << " ms" << std::endl;
  };
  out.precision(1);
  pauses("after a failure (detected -> first step)", verdict.recovery_pauses_ms);
  pauses("when failures overlapped (one recovery removed several)", verdict.overlapping_pauses_ms);
  if (problems.empty()) {
    out << "kf-chaos: PASS: identical parameters, nothing committed lost, every sample used "
           "once per epoch (checked by the workers), no hang"
        << std::endl;
    return 0;
  }
  for (const auto& p : problems) out << "kf-chaos: FAIL: " << p << std::endl;
  // Kept for a look: the agent's and the service's output.
  out << "kf-chaos: the job's output is in " << work.keep("kf-chaos", o.seed) << std::endl;
  return 1;
}

}  // namespace kf::chaos
