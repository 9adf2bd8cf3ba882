// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/replay.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "kf-chaos/lib/job.hpp"
#include "kf-chaos/lib/progress.hpp"
#include "kf-chaos/lib/trace.hpp"
#include "kf-chaos/lib/verdict.hpp"
#include "kf-member/lib/commands.hpp"

namespace kf::chaos {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::int64_t unix_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string format_rate(double per_s) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(0);
  s << per_s;
  return s.str();
}

class Replayer {
 public:
  Replayer(const ReplayOptions& o, fs::path dir, std::ostream& out)
      : o_(o),
        dir_(std::move(dir)),
        out_(out),
        gen_(o.seed),
        job_(
            JobSpec{o.kfrun, o.config_server, 1, o.max_workers, o.command, metrics_env(), o.listen},
            dir_) {
    if (o.slurm) {
      // One worker per allocation; the node's agent joins the job and drains on the notice.
      std::string agent = shell_quoted(o.kfrun) + " --watch --slurm -np 1 --config-server " +
                          shell_quoted(job_.url()) + " --job-token-file " +
                          shell_quoted(job_.token_file().string()) + " --";
      for (const auto& a : o.command) agent += " " + shell_quoted(a);
      slurm_.emplace(*o.slurm, agent, metrics_env(), dir_);
    }
  }

  int run(const std::vector<TraceEvent>& trace) {
    const auto steps = size_steps(trace, o_.max_workers, o_.speed);
    job_.start_server();
    start_ = Clock::now();
    if (slurm_) {
      slurm_->allocate(*slurm_->free_node());
      std::string nodes;
      for (const auto& n : o_.slurm->nodes) nodes += (nodes.empty() ? "" : ",") + n;
      say("job started: 1 worker on Slurm (nodes " + nodes + "), config service " + job_.url() +
          ", seed " + std::to_string(o_.seed));
    } else {
      job_.start_agent();
      say("job started: 1 worker, config service " + job_.url() + ", seed " +
          std::to_string(o_.seed));
    }
    if (!wait_for_size(1)) throw std::runtime_error("the job made no progress in 60 s");

    // Calibration: the steady-state throughput at each size the replay will use.
    std::set<int> sizes;
    for (const auto& s : steps) sizes.insert(s.workers);
    std::map<int, double> rate;
    for (const int n : sizes) {
      resize_to(n);
      if (!wait_for_size(n)) {
        throw std::runtime_error("the job did not reach " + std::to_string(n) + " workers");
      }
      std::this_thread::sleep_for(o_.settle);  // the steps right after a change are not steady
      const auto t0 = unix_ms();
      std::this_thread::sleep_for(o_.calibrate);  // the measurement window itself
      const auto t1 = unix_ms();
      rate[n] = work_between(progress(), t0, t1) * 1000.0 / static_cast<double>(t1 - t0);
      say("calibrated " + std::to_string(n) + (n == 1 ? " worker: " : " workers: ") +
          format_rate(rate[n]) + " " + progress().unit() + "/s");
    }

    // The replay.
    resize_to(steps.front().workers);
    if (!wait_for_size(steps.front().workers)) {
      throw std::runtime_error("the job did not reach the trace's first size");
    }
    const auto t0 = Clock::now();
    const auto t0_ms = unix_ms();
    struct Change {
      std::int64_t at_ms;  // Unix time it was made
      int workers;
    };
    std::vector<Change> changes;
    say("replay: " + std::to_string(steps.front().nodes) +
        " nodes up: " + std::to_string(steps.front().workers) + " workers");
    for (std::size_t i = 1; i < steps.size(); ++i) {
      if (auto code = ended(t0 + milliseconds(steps[i].at_ms))) {
        ended_early_ = code;
        say("the job ended during the replay: exit code " + std::to_string(*code));
        break;
      }
      changes.push_back({unix_ms(), steps[i].workers});
      say("trace " + std::to_string(steps[i].nodes) + " nodes up: " + change_to(steps[i].workers));
    }
    const auto end = t0 + milliseconds(steps.back().at_ms) + o_.tail;
    if (!ended_early_) ended_early_ = ended(end);
    const auto t1_ms = unix_ms();
    const double elapsed_ms = static_cast<double>(t1_ms - t0_ms);

    double expected = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const double from = static_cast<double>(steps[i].at_ms);
      const double to = i + 1 < steps.size() ? static_cast<double>(steps[i + 1].at_ms) : elapsed_ms;
      expected += rate[steps[i].workers] * std::max(0.0, std::min(to, elapsed_ms) - from) / 1000.0;
    }
    const Progress done = progress();
    const double actual = work_between(done, t0_ms, t1_ms);

    // The end: the guarantees after all that.
    std::vector<std::string> problems;
    if (!ended_early_ && o_.finish_with) {
      auto c = job_.client();
      write_setting(c, *o_.finish_with);
      say("finish: settings " + *o_.finish_with);
    }
    const auto code = ended_early_ ? ended_early_ : ended(Clock::now() + o_.finish_timeout);
    if (!code) {
      problems.push_back("the job hung: it had not finished " +
                         std::to_string(o_.finish_timeout.count()) + " s after the replay");
      if (slurm_) {
        slurm_->cancel_all();
      } else {
        job_.kill_agent();
        job_.kill_workers();
      }
    } else if (*code != 0) {
      problems.push_back(
          (slurm_ ? "an allocation did not complete with 0 (" : "kfrun exited with ") +
          std::to_string(*code) + (slurm_ ? "): " : ": ") +
          last_lines(slurm_ ? slurm_->output() : job_.agent_errors(), 5));
    }
    job_.stop_server();
    const Verdict v = judge(slurm_ ? slurm_->output() : job_.agent_output());
    problems.insert(problems.end(), v.problems.begin(), v.problems.end());

    std::ostringstream speed;
    speed << o_.speed;
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(3);
    s << "kf-replay: " << o_.trace.filename().string() << ": " << trace.size() << " rows, "
      << peak_nodes(trace) << " nodes at most, scaled to " << o_.max_workers << " workers; "
      << steps.size() - 1 << " changes (" << removals_ << " removals: " << kills_
      << (slurm_ ? " scancel --signal=KILL, " : " kill -9, ") << removals_ - kills_
      << (slurm_ ? " preempted" : " revoked") << ") in " << elapsed_ms / 1000.0 << " s at speed "
      << speed.str() << "\n";
    s.precision(2);
    s << "kf-replay: throughput retained " << (expected > 0 ? actual / expected : 0.0) << ": "
      << format_rate(actual) << " " << done.unit() << " committed of " << format_rate(expected)
      << " the sizes would have given at their measured rates\n";
    // How much of the shortfall is the time the changes took to take effect (the scheduler's
    // and the processes' start), and how much the job lost while it ran (pauses, rollbacks).
    const double at_sizes = work_at_sizes(done, rate, t0_ms, t1_ms);
    s << "kf-replay: at the sizes the job ran with, retained "
      << (at_sizes > 0 ? actual / at_sizes : 0.0) << ": " << format_rate(at_sizes) << " "
      << done.unit() << " at their measured rates\n";
    s << "kf-replay: changes in effect after (ms):";
    for (std::size_t i = 0; i < changes.size(); ++i) {
      const std::int64_t until = i + 1 < changes.size() ? changes[i + 1].at_ms : t1_ms;
      const auto after = in_effect_after(done, changes[i].at_ms, until, changes[i].workers);
      s << (i == 0 ? " " : ", ") << (after ? std::to_string(*after) : std::string("not in time"));
    }
    s << "\n";
    const std::int64_t lost = steps_rolled_back(done, t0_ms, t1_ms);
    s << "kf-replay: steps lost to rollbacks: " << lost;
    if (removals_ > 0) {
      s << " (" << static_cast<double>(lost) / removals_ << " per removal, over " << removals_
        << ")";
    }
    s << "\n";
    out_ << s.str();
    if (problems.empty()) {
      out_ << "kf-replay: guarantees held: identical parameters (" << v.finals
           << (v.finals == 1 ? " worker" : " workers") << " at step " << v.final_step
           << "), nothing committed lost, no hang" << std::endl;
      return 0;
    }
    for (const auto& p : problems) out_ << "kf-replay: FAIL: " << p << std::endl;
    return 1;
  }

 private:
  void say(const std::string& line) {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    std::ostringstream t;
    t.setf(std::ios::fixed);
    t.precision(3);
    t << "[";
    t.width(8);
    t << s << " s] " << line;
    out_ << t.str() << std::endl;
  }

  Progress progress() const { return read_progress(slurp(dir_ / "metrics.jsonl")); }

  std::vector<std::string> metrics_env() const {
    return {"KF_METRICS_JSONL=" + (dir_ / "metrics.jsonl").string(),
            "KF_METRICS_EVERY=" + std::to_string(o_.metrics_every)};
  }

  // The job's exit code once it has ended (its agent, or every allocation), waiting until
  // `until` at most.
  std::optional<int> ended(Clock::time_point until) {
    return slurm_ ? slurm_->ended(until) : job_.agent_exit(until);
  }

  // Waits (60 s at most) until the job's metrics lines say it runs with `n` workers.
  bool wait_for_size(int n) {
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < until) {
      const auto p = progress();
      if (!p.points.empty() && p.points.back().workers == n) return true;
      if (ended(Clock::now() + milliseconds(50))) return false;
    }
    return false;
  }

  // Adds or removes members at the end until there are `n` (calibration: revokes only; through
  // Slurm, allocations and plain scancel, which the agents take as a notice).
  void resize_to(int n) {
    if (slurm_) {
      while (static_cast<int>(slurm_->busy().size()) < n) {
        const auto node = slurm_->wait_free_node(Clock::now() + std::chrono::seconds(120));
        if (!node) throw std::runtime_error("no Slurm node became free within 120 s");
        slurm_->allocate(*node);
      }
      while (static_cast<int>(slurm_->busy().size()) > n) slurm_->cancel(slurm_->busy().back());
      return;
    }
    auto c = job_.client();
    std::ostringstream said;
    member::CommandContext ctx{c, said};
    member::resize(ctx, n, member::AddOptions{});
  }

  // Through Slurm: allocations for more workers; a removal is a preemption (a notice), or a
  // scancel --signal=KILL for the drawn share of kills.
  std::string change_through_slurm(int n) {
    auto busy = slurm_->busy();
    const int have = static_cast<int>(busy.size());
    std::string did = std::to_string(have) + " -> " + std::to_string(n) + " workers:";
    for (int i = have; i < n; ++i) {
      // A node whose allocation a removal just ended is free once Slurm has let it go.
      const auto node = slurm_->wait_free_node(Clock::now() + std::chrono::seconds(120));
      if (!node) throw std::runtime_error("no Slurm node became free within 120 s");
      slurm_->allocate(*node);
      did += " allocated " + *node + ";";
    }
    for (int i = n; i < have; ++i) {
      const auto at = static_cast<std::ptrdiff_t>(
          std::uniform_int_distribution<std::size_t>(0, busy.size() - 1)(gen_));
      const std::string node = busy[static_cast<std::size_t>(at)];
      busy.erase(busy.begin() + at);
      ++removals_;
      if (std::uniform_real_distribution<double>(0, 1)(gen_) < o_.kill_fraction) {
        slurm_->kill(node);
        ++kills_;
        did += " scancel --signal=KILL on " + node + ";";
      } else {
        slurm_->preempt(node);
        did += " preempted " + node + ";";
      }
    }
    if (did.back() == ';') did.pop_back();
    return did;
  }

  // Grows or shrinks the running job to `n` workers, as the trace says; returns what it did.
  std::string change_to(int n) {
    if (slurm_) return change_through_slurm(n);
    auto c = job_.client();
    Cluster cur = c.get_cluster();
    auto live = job_.live_members(cur);
    // A worker the last change added may not run yet (its agent starts it): the change lands
    // first, 10 s at most, so that this one starts from the size the trace gave.
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (live.size() < cur.workers.size() && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(20));  // the agent's next event
      cur = c.get_cluster();
      live = job_.live_members(cur);
    }
    const int have = static_cast<int>(live.size());
    std::ostringstream said;
    member::CommandContext ctx{c, said};
    if (n > have) {
      member::AddOptions add;
      add.count_workers = n - have;
      member::add(ctx, add);
      return std::to_string(have) + " -> " + std::to_string(n) + " workers: added " +
             std::to_string(n - have);
    }
    std::string did = std::to_string(have) + " -> " + std::to_string(n) + " workers:";
    for (int i = 0; i < have - n; ++i) {
      auto victim = live.begin();
      std::advance(victim, static_cast<std::ptrdiff_t>(std::uniform_int_distribution<std::size_t>(
                               0, live.size() - 1)(gen_)));
      ++removals_;
      if (std::uniform_real_distribution<double>(0, 1)(gen_) < o_.kill_fraction) {
        ::kill(victim->second, SIGKILL);
        ++kills_;
        did += " kill -9 " + victim->first + ";";
      } else {
        member::revoke(ctx, victim->first, o_.notice_s);
        did += " revoked " + victim->first + ";";
      }
      live.erase(victim);
    }
    if (!did.empty() && did.back() == ';') did.pop_back();
    return did;
  }

  const ReplayOptions& o_;
  fs::path dir_;
  std::ostream& out_;
  std::mt19937_64 gen_;
  Job job_;
  std::optional<SlurmFleet> slurm_;
  Clock::time_point start_;
  std::optional<int> ended_early_;
  int removals_ = 0;
  int kills_ = 0;
};

}  // namespace

void check(const ReplayOptions& o) {
  if (o.command.empty()) {
    throw std::invalid_argument("no program given: kf-replay --trace FILE [options] -- PROG");
  }
  if (o.trace.empty()) throw std::invalid_argument("--trace is required");
  if (!(o.speed > 0)) throw std::invalid_argument("--speed must be more than 0");
  if (o.max_workers < 1) throw std::invalid_argument("--max-workers must be at least 1");
  if (o.notice_s < 0) throw std::invalid_argument("--notice-s must not be negative");
  if (!(o.kill_fraction >= 0 && o.kill_fraction <= 1)) {
    throw std::invalid_argument("--kill-fraction must lie in [0, 1]");
  }
  if (o.metrics_every < 1) throw std::invalid_argument("--metrics-every must be at least 1");
  if (o.calibrate.count() < 100) {
    throw std::invalid_argument("--calibrate-ms must be at least 100");
  }
  if (o.slurm) {
    if (o.slurm->nodes.empty()) throw std::invalid_argument("--slurm-nodes names no node");
    if (static_cast<int>(o.slurm->nodes.size()) < o.max_workers) {
      throw std::invalid_argument("--max-workers " + std::to_string(o.max_workers) +
                                  " needs as many Slurm nodes; --slurm-nodes names " +
                                  std::to_string(o.slurm->nodes.size()));
    }
    if (o.slurm->signal_s < 1) throw std::invalid_argument("--slurm-signal-s must be at least 1");
  }
  if (o.finish_with &&
      (o.finish_with->find('=') == std::string::npos || o.finish_with->front() == '=')) {
    throw std::invalid_argument("--finish-with: '" + *o.finish_with + "' is not KEY=VALUE");
  }
}

int replay(const ReplayOptions& o, std::ostream& out) {
  check(o);
  std::ifstream in(o.trace);
  if (!in) throw TraceError(o.trace.string() + ": cannot be read");
  const auto trace = parse_trace(in, o.trace.string());
  WorkDir work(o.dir);
  const int code = Replayer(o, work.path(), out).run(trace);
  if (code != 0) {
    out << "kf-replay: the job's output is in " << work.keep("kf-replay", o.seed) << std::endl;
  }
  return code;
}

}  // namespace kf::chaos
