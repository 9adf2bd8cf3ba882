// SPDX-License-Identifier: Apache-2.0
// elastic-bench: times membership changes of a real elastic job (kf-config-server + kfrun --watch
// + elastic-worker on 127.0.0.1), RUNS times each, and prints p50/p95/max per phase:
//   revoke  kf-member revoke -> the survivors' first step at the new size; and the survivors'
//           own pause (step boundary -> state in place)
//   kill    kill -9 of a worker -> the survivors' detection (their collective failed) -> the
//           first step at the new size
//   add     kf-member add -> joiner in join() (process start) -> joined the agreement (connect)
//           -> state synced (sync); survivors' pause; with --extra-floats of state (default 10 M)
//   spare   kill -9 of a worker of a job that keeps a hot spare (`spares: 1`, with --extra-floats
//           of state): kill -9 -> the first step back at the old size, the survivors' pause,
//           and how many of the moved-in spares held the commit the survivors restored (no sync)
//   steady  the time of a step without any change (the watch of the service runs beside the
//           steps), over 1000 steps after the first 500, with --extra-floats of state;
//           steady-spare the same with a hot spare that rank 0 feeds (not in the default set)
//   straggler  a worker of np + 1 made 3x slower halfway, under the stragglers policy with a hot
//           spare: the job's steps/s before, its lowest after, and the time until it is back to
//           0.9 of the rate before (not in the default set)
//   async   np workers in pair-avg, one of them (the last rank) 3x slower, no balanced batches:
//           a fast worker's (rank 0's) steps/s with boundaries on change and at every step,
//           each against its rate with no slow worker (not in the default set)
// Usage: build/tests/multiproc/elastic-bench [--runs N] [--extra-floats N] [--np N] [--etcd]
//        [--changes revoke,kill,add,spare,steady,steady-spare,straggler,async];
// the executables are taken from the build tree it is in (or KFRUN, KF_ELASTIC_WORKER,
// KF_MEMBER, CONFIG_SERVER_EXE). --etcd keeps the jobs' documents in a one-member etcd on
// 127.0.0.1 (etcd:// URLs) instead of a kf-config-server per job.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <signal.h>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "support/elastic_job.hpp"
#include "support/etcd_process.hpp"
#include "support/series.hpp"

namespace {

using kf::test::ElasticJob;
using kf::test::Series;

// With --etcd: the etcd URL; each job gets a prefix of its own there.
std::string g_etcd;
std::string service_for(const std::string& name) {
  static int n = 0;
  return g_etcd.empty() ? "" : g_etcd + "/bench/" + name + "-" + std::to_string(n++);
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The "change {...}" records the workers printed, with the worker's endpoint.
struct Change {
  std::string worker;
  nlohmann::json rec;
};

std::vector<Change> changes(const ElasticJob& job) {
  std::vector<Change> v;
  std::istringstream in(job.out());
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("] change ");
    if (line.empty() || line[0] != '[' || at == std::string::npos) continue;
    try {
      v.push_back({line.substr(1, at - 1), nlohmann::json::parse(line.substr(at + 9))});
    } catch (const std::exception&) {
    }
  }
  return v;
}

// Waits until `count` workers printed a change record that `is` accepts. The workers' own output,
// not the service's events (ElasticJob::wait_size): polling the service would load it during the
// change being timed.
bool wait_records(const ElasticJob& job, int count,
                  const std::function<bool(const nlohmann::json&)>& is) {
  return kf::test::eventually(
      [&] {
        int n = 0;
        for (const auto& ch : changes(job)) n += is(ch.rec) ? 1 : 0;
        return n >= count;
      },
      std::chrono::seconds(60));
}

double ms_between(std::int64_t a, std::int64_t b) { return static_cast<double>(b - a) / 1000.0; }

const std::string kArgs = "--samples 20000 --dim 32 --batch 64 --epochs 1000";

bool run_revoke(int np, std::map<std::string, Series>& out) {
  ElasticJob job("bench-revoke", service_for("bench-revoke"));
  job.start(np, kArgs);
  if (!job.wait_progress(100)) return false;
  const auto c = job.client().get_cluster();
  const std::string leaver = c.workers.back().endpoint.str();
  const std::int64_t t0 = now_us();
  if (job.member("revoke " + leaver + " --notice 10").exit_code != 0) return false;
  if (!wait_records(job, np - 1, [&](const nlohmann::json& r) {
        return r["kind"] == "resize" && r["to_size"] == np - 1;
      })) {
    return false;
  }
  job.finish_soon();
  if (job.wait() != 0) return false;
  for (const auto& ch : changes(job)) {
    if (ch.worker == leaver || ch.rec["kind"] != "resize" || ch.rec["to_size"] != np - 1) continue;
    out["revoke: kf-member -> first step at new size"].add(ms_between(t0, ch.rec["resumed_us"]));
    out["revoke: survivors' pause (boundary -> resumed)"].add(
        ms_between(ch.rec["boundary_us"], ch.rec["synced_us"]));
    break;
  }
  return true;
}

bool run_kill(int np, std::map<std::string, Series>& out) {
  ElasticJob job("bench-kill", service_for("bench-kill"));
  job.start(np, kArgs);
  if (!job.wait_progress(100)) return false;
  const auto c = job.client().get_cluster();
  const std::string victim = c.workers.back().endpoint.str();
  const pid_t pid = job.worker_pid(victim);
  if (pid <= 0) return false;
  const std::int64_t t0 = now_us();
  ::kill(pid, SIGKILL);
  if (!wait_records(job, np - 1, [](const nlohmann::json& r) { return r["kind"] == "recovery"; })) {
    return false;
  }
  job.finish_soon();
  job.wait();
  std::int64_t detected = 0, resumed = 0;
  double written = 0, formed = 0;  // the slowest survivor's, per phase
  for (const auto& ch : changes(job)) {
    if (ch.rec["kind"] != "recovery") continue;
    const std::int64_t d = ch.rec["detected_us"], a = ch.rec["agreed_us"], r = ch.rec["resumed_us"];
    if (detected == 0 || d < detected) detected = d;
    resumed = std::max(resumed, r);
    written = std::max(written, ms_between(d, a));
    formed = std::max(formed, ms_between(a, r));
  }
  if (detected == 0) return false;
  out["kill: kill -9 -> detected"].add(ms_between(t0, detected));
  out["kill: detected -> first step at new size"].add(ms_between(detected, resumed));
  // The config service's share: a survivor restores its last commit and writes the document
  // by compare-and-swap.
  out["kill: detected -> document written (slowest)"].add(written);
  out["kill: written -> first step (slowest)"].add(formed);
  out["kill: kill -9 -> first step at new size"].add(ms_between(t0, resumed));
  return true;
}

bool run_add(int np, std::size_t extra, std::map<std::string, Series>& out) {
  ElasticJob job("bench-add", service_for("bench-add"));
  job.start(np, kArgs + " --extra-floats " + std::to_string(extra));
  if (!job.wait_progress(20)) return false;
  const std::int64_t t0 = now_us();
  if (job.member("add").exit_code != 0) return false;
  if (!wait_records(job, np + 1, [&](const nlohmann::json& r) { return r["to_size"] == np + 1; })) {
    return false;
  }
  job.finish_soon();
  if (job.wait() != 0) return false;
  const auto after = job.client().get_cluster();
  for (const auto& ch : changes(job)) {
    const auto& r = ch.rec;
    if (r["kind"] == "join" && r["to_size"] == np + 1) {
      out["add: kf-member -> joiner process in join()"].add(ms_between(t0, r["detected_us"]));
      out["add: connect (invited, agreement done)"].add(
          ms_between(r["detected_us"], r["connected_us"]));
      out["add: state sync (" + std::to_string(extra) + " floats)"].add(
          ms_between(r["connected_us"], r["synced_us"]));
    }
    if (r["kind"] == "resize" && r["to_size"] == np + 1 && r["from_size"] == np) {
      if (out["add: survivors' pause (switch -> synced)"].ms.size() <
          out["add: connect (invited, agreement done)"].ms.size()) {
        out["add: survivors' pause (switch -> synced)"].add(
            ms_between(r["switch_us"], r["synced_us"]));
        out["add: kf-member -> first step at new size"].add(ms_between(t0, r["resumed_us"]));
      }
    }
  }
  return true;
}

bool run_spare(int np, std::size_t extra, std::map<std::string, Series>& out) {
  ElasticJob job("bench-spare", service_for("bench-spare"));
  const auto file = job.dir() / "job.yaml";
  std::ofstream(file) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\nspares: 1\n";
  job.set_agent_options("--job " + file.string());
  job.start(np, kArgs + " --extra-floats " + std::to_string(extra));
  if (!job.wait_progress(100)) return false;
  // The spare runs and holds a commit.
  if (!kf::test::eventually([&] { return job.err_lines_with("a hot spare holding commit") > 0; },
                            std::chrono::seconds(60))) {
    return false;
  }
  if (!job.wait_progress(job.progress() + 50)) return false;
  const std::string victim = job.client().get_cluster().workers.back().endpoint.str();
  const pid_t pid = job.worker_pid(victim);
  if (pid <= 0) return false;
  const std::int64_t t0 = now_us();
  ::kill(pid, SIGKILL);
  // np - 1 survivors' recoveries and the spare's join, all back at np workers.
  if (!wait_records(job, np, [&](const nlohmann::json& r) {
        return (r["kind"] == "recovery" || r["kind"] == "join") && r["to_size"] == np &&
               r["to_version"] > 2;
      })) {
    return false;
  }
  job.finish_soon();
  job.wait();
  std::int64_t resumed = 0;
  double pause = 0;
  for (const auto& ch : changes(job)) {
    const auto& r = ch.rec;
    if (r["kind"] == "recovery" && r["to_size"] == np) {
      resumed = std::max<std::int64_t>(resumed, r["resumed_us"]);
      pause = std::max(pause, ms_between(r["boundary_us"], r["synced_us"]));
    }
    if (getenv("KF_BENCH_SHOW") != nullptr && (r["kind"] == "join" || r["kind"] == "recovery")) {
      std::cerr << ch.worker << " " << r.dump() << "\n";
    }
    if (r["kind"] == "join" && r["to_version"] > 2 && r["to_size"] == np) {
      out["spare: moved in holding the restored commit (1 = yes)"].add(r["sync_bytes"] == 0 ? 1.0
                                                                                            : 0.0);
    }
  }
  if (resumed == 0) return false;
  out["spare: kill -9 -> first step back at " + std::to_string(np) + " workers"].add(
      ms_between(t0, resumed));
  out["spare: survivors' pause (slowest)"].add(pause);
  return true;
}

bool run_steady(int np, std::size_t extra, bool spare, std::map<std::string, Series>& out) {
  ElasticJob job("bench-steady", service_for("bench-steady"));
  if (spare) {
    const auto file = job.dir() / "job.yaml";
    std::ofstream(file) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\nspares: 1\n";
    job.set_agent_options("--job " + file.string());
  }
  job.start(np, kArgs + " --extra-floats " + std::to_string(extra));
  // Past the start, whose events (each worker's "joined", the agent's notes) the service is still
  // storing during the first steps, then over 1000 steps.
  if (!job.wait_progress(500)) return false;
  const long p0 = job.progress();
  const std::int64_t t0 = now_us();
  if (!job.wait_progress(p0 + 1000)) return false;
  const std::int64_t t1 = now_us();
  const long p1 = job.progress();
  out[std::string("steady: step time (no change") + (spare ? ", a hot spare fed" : "") + ", " +
      std::to_string(extra) + " extra floats)"]
      .add(ms_between(t0, t1) / static_cast<double>(p1 - p0));
  job.finish_soon();
  return job.wait() == 0;
}

// A job of np workers and a hot spare under the stragglers policy; the worker started as rank
// np - 1 turns 3x slower at step kSlowFrom. Rank 0's committed steps, polled every 50 ms, give
// the job's rate over 2 s windows: the undisturbed rate before, and how long after the slowdown
// the rate is back to 0.9 of it (the policy balances, then revokes the straggler and the spare
// takes its place).
bool run_straggler(int np, std::map<std::string, Series>& out) {
  constexpr long kSlowFrom = 2000;
  ElasticJob job("bench-straggler", service_for("bench-straggler"));
  const auto file = job.dir() / "job.yaml";
  std::ofstream(file) << "job: {}\nbatch_size: 64\nworkers: {max: 8}\nspares: 1\n"
                      << "policies:\n  - name: stragglers\n"
                      << "    params: {revoke_after: 10, revoke_below: 0.5, cooldown: 1000}\n";
  job.set_agent_options("--job " + file.string());
  job.start(np, kArgs + " --sample-us 200 --slow-rank " + std::to_string(np - 1) + " --slow-from " +
                    std::to_string(kSlowFrom) + " --job " + file.string());
  if (!job.wait_progress(500)) return false;
  std::vector<std::pair<std::int64_t, long>> seen;  // (us, committed steps)
  const auto rate_over = [&](std::size_t last, std::int64_t window_us) {
    std::size_t first = last;
    while (first > 0 && seen[last].first - seen[first].first < window_us) --first;
    const double us = static_cast<double>(seen[last].first - seen[first].first);
    return us > 0 ? static_cast<double>(seen[last].second - seen[first].second) * 1e6 / us : 0.0;
  };
  double undisturbed = 0;
  std::int64_t slowed_at = 0, back_at = 0;
  double slowest = 0;
  const std::int64_t give_up = now_us() + 120'000'000;
  while (back_at == 0 && now_us() < give_up) {
    seen.emplace_back(now_us(), job.progress());
    const std::size_t i = seen.size() - 1;
    if (slowed_at == 0) {
      if (seen[i].second >= kSlowFrom) {
        slowed_at = seen[i].first;
        std::size_t before = i;
        while (before > 0 && seen[before].second >= kSlowFrom - 100) --before;
        undisturbed = rate_over(before, 4'000'000);
      }
    } else if (seen[i].first - slowed_at >= 2'000'000) {
      const double rate = rate_over(i, 2'000'000);
      if (slowest == 0 || rate < slowest) slowest = rate;
      if (rate >= 0.9 * undisturbed) back_at = seen[i].first;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const bool revoked = job.has_event([](const kf::ConfigEvent& e) { return e.type == "revoked"; });
  job.finish_soon();
  const bool clean = job.wait() == 0;
  if (undisturbed <= 0 || back_at == 0) return false;
  out["straggler: undisturbed steps/s"].add(undisturbed);
  out["straggler: lowest steps/s after the slowdown (2 s windows)"].add(slowest);
  out["straggler: slowdown -> rate back to 0.9"].add(ms_between(slowed_at, back_at));
  out["straggler: the straggler was revoked (1 = yes)"].add(revoked ? 1.0 : 0.0);
  return clean;
}

// Rank 0's steps/s in a pair-avg job of np workers (each step waits 200 us per sample of its 16,
// the last rank's 600 us when `slow`), over 3 s once it is past step 300.
double async_rate(int np, const std::string& mode, const std::string& boundaries, bool slow) {
  ElasticJob job("bench-async", service_for("bench-async"));
  job.start(np, kArgs + " --mode " + mode + " --boundaries " + boundaries + " --sample-us 200" +
                    (slow ? " --slow-rank " + std::to_string(np - 1) : std::string()));
  if (!job.wait_progress(300)) return 0;
  const long p0 = job.progress();
  const std::int64_t t0 = now_us();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const long p1 = job.progress();
  const std::int64_t t1 = now_us();
  job.finish_soon();
  if (job.wait() != 0) return 0;
  return static_cast<double>(p1 - p0) * 1e6 / static_cast<double>(t1 - t0);
}

// Rank 0's step rate (a fast worker's) in each asynchronous mode, with and without a 3x slower
// last rank, with a boundary at every step and on change.
bool run_async(int np, std::map<std::string, Series>& out) {
  for (const char* mode : {"pair-avg", "async-ps"}) {
    const std::string m = mode;
    const double free_on_change = async_rate(np, m, "on-change", false);
    const double slow_on_change = async_rate(np, m, "on-change", true);
    const double free_every = async_rate(np, m, "every-step", false);
    const double slow_every = async_rate(np, m, "every-step", true);
    if (free_on_change <= 0 || slow_on_change <= 0 || free_every <= 0 || slow_every <= 0) {
      return false;
    }
    out[m + ": on change, no straggler: rank 0 steps/s"].add(free_on_change);
    out[m + ": on change, a 3x straggler: rank 0 steps/s"].add(slow_on_change);
    out[m + ": on change, straggler/none (ratio, steps/s)"].add(slow_on_change / free_on_change);
    out[m + ": every step, no straggler: rank 0 steps/s"].add(free_every);
    out[m + ": every step, a 3x straggler: rank 0 steps/s"].add(slow_every);
    out[m + ": every step, straggler/none (ratio, steps/s)"].add(slow_every / free_every);
  }
  return true;
}

// The dashboard's cost to the job: rank 0's step rate with no page open and with one open in
// headless Chromium (which long-polls the service and reads the summary, events and agents every
// 2 s), alternating 5 s windows in one job. Needs chromium and python3.
bool run_dashboard(int np, std::map<std::string, Series>& out) {
  if (kf::test::run_shell("command -v chromium && command -v python3").exit_code != 0) {
    std::cerr << "elastic-bench: --changes dashboard needs chromium and python3\n";
    return false;
  }
  ElasticJob job("bench-dashboard");
  job.start(np, kArgs + " --sample-us 200");
  if (!job.wait_progress(300)) return false;
  const std::string probe =
      (std::filesystem::path(__FILE__).parent_path().parent_path() / "support/page_probe.py")
          .string();
  const auto rate = [&](bool page) {
    kf::test::Child browser;
    if (page) {
      browser = kf::test::spawn({"/usr/bin/env", "python3", probe, job.url() + "/", "--until",
                                 "false", "--timeout-s", "7"},
                                {});
      // Let the page load and start its updates before the window opens.
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    const long p0 = job.progress();
    const std::int64_t t0 = now_us();
    std::this_thread::sleep_for(std::chrono::seconds(5));
    const long p1 = job.progress();
    const std::int64_t t1 = now_us();
    if (page)
      kf::test::wait_exit(browser, std::chrono::steady_clock::now() + std::chrono::seconds(30));
    return static_cast<double>(p1 - p0) * 1e6 / static_cast<double>(t1 - t0);
  };
  for (int round = 0; round < 2; ++round) {
    const double without = rate(false);
    const double with = rate(true);
    out["dashboard: no page: rank 0 steps/s"].add(without);
    out["dashboard: page open: rank 0 steps/s"].add(with);
    out["dashboard: open/none (ratio, steps/s)"].add(with / without);
  }
  job.finish_soon();
  return job.wait() == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"times membership changes of an elastic job", "elastic-bench"};
  int runs = 20, np = 2;
  std::size_t extra = 10'000'000;
  app.add_option("--runs", runs)->check(CLI::Range(1, 1000));
  app.add_option("--np", np, "workers before each change")->check(CLI::Range(2, 8));
  app.add_option("--extra-floats", extra, "float32 state a joiner receives");
  bool etcd = false;
  app.add_flag("--etcd", etcd, "keep the jobs' documents in etcd instead of kf-config-server");
  std::vector<std::string> which{"revoke", "kill", "add", "spare", "steady"};
  app.add_option("--changes", which, "which to time (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"revoke", "kill", "add", "spare", "steady", "steady-spare",
                             "straggler", "async", "dashboard"}));
  CLI11_PARSE(app, argc, argv);
  std::unique_ptr<kf::test::EtcdProcess> etcd_process;
  if (etcd) {
    etcd_process = std::make_unique<kf::test::EtcdProcess>();
    if (!etcd_process->error().empty()) {
      std::cerr << "elastic-bench: " << etcd_process->error() << "\n";
      return 2;
    }
    g_etcd = etcd_process->url();
  }
  // Without the test environment, find the executables in the build tree this program is in.
  kf::test::use_build_tree_executables();
  std::map<std::string, Series> out;
  int failed = 0;
  for (int i = 0; i < runs; ++i) {
    const auto wanted = [&](const char* c) {
      return std::find(which.begin(), which.end(), c) != which.end();
    };
    if (wanted("revoke")) failed += !run_revoke(np + 1, out);
    if (wanted("kill")) failed += !run_kill(np + 1, out);
    if (wanted("add")) failed += !run_add(np, extra, out);
    if (wanted("spare")) failed += !run_spare(np + 1, extra, out);
    if (wanted("steady")) failed += !run_steady(np, extra, false, out);
    if (wanted("steady-spare")) failed += !run_steady(np, extra, true, out);
    if (wanted("straggler")) failed += !run_straggler(np + 1, out);
    if (wanted("async")) failed += !run_async(np, out);
    if (wanted("dashboard")) failed += !run_dashboard(np, out);
    std::cerr << "run " << i + 1 << "/" << runs << " done\n";
  }
  std::cout << "elastic-bench: " << runs << " runs, np " << np
            << " (+1 before revoke/kill/spare/straggler), " << (etcd ? "etcd" : "kf-config-server")
            << ", " << failed << " failed runs\n";
  for (const auto& [name, s] : out) {
    // Times in ms, unless the name gives another unit.
    const bool other_unit =
        name.find("steps/s") != std::string::npos || name.find("(1 = yes)") != std::string::npos;
    std::printf("%-48s %s%s\n", name.c_str(), s.str().c_str(), other_unit ? "" : " ms");
  }
  return failed == 0 ? 0 : 1;
}
