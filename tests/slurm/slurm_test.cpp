// SPDX-License-Identifier: Apache-2.0
// kf under a real Slurm (tests/slurm/slurm-cluster: slurmctld, and one slurmd on each of 3 test
// hosts made of network namespaces). Jobs are submitted with sbatch as a user would; each runs
// `srun kfrun --watch --slurm` (one agent per node) with elastic-worker processes (deterministic
// linear regression: they check that every sample of each epoch is used once and that no commit
// is lost, and print BROKEN otherwise). The config service runs on this machine, on the hosts'
// bridge. Skipped, saying why, where namespaces cannot be made or Slurm is not installed.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kf/runtime/config_client.hpp"
#include "support/config_server_process.hpp"
#include "support/finish_soon.hpp"
#include "support/process.hpp"

namespace kf::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kCluster = "kfslurm";

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Slurm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("kf-slurm-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string script = env_or_empty("KF_SLURM_CLUSTER");
    if (const auto c = run_shell(script + " check"); c.exit_code != 0) {
      skip_ = "no Slurm cluster can be made here: " + c.output;
      return;
    }
    const auto up = run_shell(script + " up " + kCluster + " 3 " + dir_.string());
    std::smatch m;
    if (up.exit_code != 0 || !std::regex_search(up.output, m, std::regex(R"(bridge (\S+))")) ||
        up.output.find("ready") == std::string::npos) {
      failed_ = "slurm-cluster up failed: " + up.output;
      return;
    }
    bridge_ = m[1];
    ::setenv("SLURM_CONF", (dir_ / "slurm.conf").c_str(), 1);
  }
  static void TearDownTestSuite() {
    if (!bridge_.empty()) {
      run_shell(env_or_empty("KF_SLURM_CLUSTER") + " down " + kCluster + " " + dir_.string());
    }
    if (!::testing::UnitTest::GetInstance()->Failed()) fs::remove_all(dir_);
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(failed_.empty()) << failed_;
    job_ = dir_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(job_);
    std::ofstream(job_ / "token") << "slurm-test-token\n";
    fs::permissions(job_ / "token", fs::perms::owner_read | fs::perms::owner_write);
    server_ =
        std::make_unique<ServerProcess>(job_, std::vector<std::string>{"--listen", bridge_ + ":0"});
    ASSERT_FALSE(server_->url().empty()) << "the config service did not start";
  }
  void TearDown() override {
    // Whatever is left of this test's jobs, so that the next test finds every node idle.
    run_shell("scancel --user=$(id -un) 2>&1");
    eventually([] { return run_shell("squeue -h 2>&1").output.empty(); }, 60s);
  }

  ConfigClient client() const { return ConfigClient(server_->url(), "slurm-test-token"); }

  // The command a Slurm job runs: one agent per node, one worker each.
  std::string agents(const std::string& epochs, const std::string& kfrun_options = "") const {
    return "srun --ntasks-per-node=1 " + env_or_empty("KFRUN") + " --watch --slurm -np 1 " +
           kfrun_options + " --config-server " + server_->url() + " --job-token-file " +
           (job_ / "token").string() + " -- " + env_or_empty("KF_ELASTIC_WORKER") +
           " --progress-file " + (job_ / "progress").string() +
           " --samples 20000 --dim 32 --batch 64 --epochs " + epochs;
  }

  // Preempts the spot allocation on `node` (h1, h2, ...): a job of the `prio` partition that
  // needs the whole node. It runs `true` once Slurm has taken the node back and ends by itself:
  // a scancel that met it while it started made Slurm keep the node's resources as in use (the
  // next allocation stayed PENDING (Resources) with the node "planned").
  std::string preempt(const std::string& node) {
    return sbatch("-p prio -N1 -w " + node + " --exclusive --output=/dev/null", "true");
  }

  // Waits for job `id` to end. Slurm 22.05 sometimes keeps a node it has just taken back from a
  // preempted job as in use for about three minutes (the node idle and "planned", the job that
  // needs it PENDING (Resources)); seen when the preemption came within a second of the job's
  // start. Then, once, `scontrol reconfigure` rebuilds the controller's view of the nodes. Says
  // on stdout when it did.
  bool wait_gone_unstuck(const std::string& id, std::chrono::seconds within) {
    if (wait_gone(id, 20s)) return true;
    const std::string before = slurm_state();
    if (before.find(" planned ") == std::string::npos) return wait_gone(id, within);
    std::cout << "[ slurm ] job " << id << " pending on a planned node; reconfiguring:\n"
              << before << std::flush;
    run_shell("scontrol reconfigure 2>&1");
    return wait_gone(id, within);
  }

  // sbatch OPTIONS --wrap COMMAND; returns the job id ("" and a failure when refused).
  std::string sbatch(const std::string& options, const std::string& command) {
    const auto r = run_shell("sbatch --parsable " + options + " --wrap '" + command + "'");
    std::smatch m;
    const std::string out = r.output;
    if (r.exit_code != 0 || !std::regex_search(out, m, std::regex(R"((\d+))"))) {
      ADD_FAILURE() << "sbatch refused: " << r.output;
      return "";
    }
    return m[1];
  }

  // Whether job `id` is no longer pending, running or completing. (`squeue -j ID` of a job
  // already purged prints an error instead of nothing: the whole queue is asked instead.)
  static bool gone(const std::string& id) {
    const auto r = run_shell("squeue -h -o %i");
    if (r.exit_code != 0) return false;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (line == id) return false;
    }
    return true;
  }
  static bool wait_gone(const std::string& id, std::chrono::seconds within) {
    return eventually([&] { return gone(id); }, within);
  }

  // What Slurm says of its jobs and nodes, and the end of the newest allocation's output, for
  // the message of a failed wait.
  std::string slurm_state(const std::string& output_file = "") const {
    std::string s =
        run_shell("squeue -o '%i %P %T %R %N' 2>&1; sinfo -N -o '%N %T %E' 2>&1").output;
    if (!output_file.empty())
      s += "--- " + output_file + "\n" + run_shell("tail -n 30 " + output_file + " 2>&1").output;
    try {
      s += "--- cluster\n" + client().get_cluster().to_json().dump() + "\n";
    } catch (const std::exception& e) {
      s += std::string("--- cluster: ") + e.what() + "\n";
    }
    return s;
  }

  long progress() const {
    std::ifstream in(job_ / "progress");
    long s = -1;
    in >> s;
    return in ? s : -1;
  }
  int size() const {
    try {
      return client().get_cluster().size();
    } catch (const std::exception&) {
      return -1;
    }
  }

  // The "final" lines of the workers in `outputs`: `workers` of them, every one at that size,
  // with one parameter hash, and no BROKEN.
  static void expect_clean_finish(const std::string& outputs, int workers) {
    EXPECT_EQ(outputs.find("BROKEN"), std::string::npos) << outputs;
    std::set<std::string> hashes;
    int finals = 0;
    const std::regex final_line(R"(final step=\d+ workers=(\d+) hash=([0-9a-f]+))");
    for (auto it = std::sregex_iterator(outputs.begin(), outputs.end(), final_line);
         it != std::sregex_iterator(); ++it) {
      ++finals;
      EXPECT_EQ(std::stoi((*it)[1]), workers) << it->str();
      hashes.insert((*it)[2]);
    }
    EXPECT_EQ(finals, workers) << outputs;
    EXPECT_EQ(hashes.size(), 1u) << "the workers differ:\n" << outputs;
  }

  // Ends the job at the end of the epoch its workers are in (settings "epochs", by
  // compare-and-swap).
  void finish_soon() {
    auto c = client();
    kf::test::finish_soon(c);
  }

  // Whether the job has switched to `workers` workers (rank 0's `resized` record), not only
  // listed them.
  bool running(int workers) const {
    const std::string to = "-> " + std::to_string(workers) + " workers, ";
    return has_event([&](const ConfigEvent& e) {
      return e.type == "resized" && e.detail.find(to) != std::string::npos;
    });
  }

  // Whether the survivors went through a recovery (rank 0's `resized` record of it). The
  // killed worker's agent, killed with it, may post nothing.
  bool recovered() const {
    return has_event([](const ConfigEvent& e) {
      return e.type == "resized" && e.detail.find(" workers, recovery)") != std::string::npos;
    });
  }

  bool has_event(const std::function<bool(const ConfigEvent&)>& pred) const {
    for (const auto& e : client().get_events()) {
      if (pred(e)) return true;
    }
    return false;
  }

  static inline fs::path dir_;
  static inline std::string bridge_;
  static inline std::string skip_;
  static inline std::string failed_;
  fs::path job_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(Slurm, AJobOnThreeNodesTrainsToTheEndWithIdenticalParameters) {
  const std::string id =
      sbatch("-N3 --exclusive --output=" + (job_ / "job.out").string(), agents("2"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_gone(id, 180s)) << slurp(job_ / "job.out");
  const std::string out = slurp(job_ / "job.out");
  expect_clean_finish(out, 3);
  // Each node's agent joined the job with its own address on the test hosts.
  const auto hosts =
      std::regex(R"(kfrun: (wrote the initial cluster: v\d+,|joined the job:) 1 workers on )");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(out.begin(), out.end(), hosts), std::sregex_iterator()), 3)
      << out;
}

// Three one-node allocations in the preemptible partition form one job; a job of the `prio`
// partition takes the third node. Slurm sends the spot job there USR1 (--signal=USR1@5 with
// preempt_send_user_signal), and SIGTERM only after its grace: the agent's workers must leave
// with notice, the agent exit 0 before that, and the job go on with the two others.
TEST_F(Slurm, APreemptedHostsWorkersLeaveWithinTheGraceAndTheJobGoesOn) {
  std::vector<std::string> ids;
  for (int i = 1; i <= 3; ++i) {
    const auto out = (job_ / ("job-h" + std::to_string(i) + ".out")).string();
    ids.push_back(
        sbatch("-N1 -w h" + std::to_string(i) + " --exclusive --signal=USR1@5 --output=" + out,
               agents("1000")));
    ASSERT_FALSE(ids.back().empty());
  }
  ASSERT_TRUE(eventually([&] { return size() == 3; }, 60s)) << slurp(job_ / "job-h3.out");
  const long before = progress();
  ASSERT_TRUE(eventually([&] { return progress() > before + 50; }, 60s));
  const auto before_preemption = client().get_cluster();
  const std::string h3_address = bridge_.substr(0, bridge_.rfind('.')) + ".3";
  const auto preempted_at = std::chrono::steady_clock::now();
  const std::string prio = preempt("h3");
  ASSERT_FALSE(prio.empty());
  // Slurm's SIGTERM comes GraceTime (10 s) or later after the preemption.
  ASSERT_TRUE(wait_gone(ids[2], 60s));
  const std::string h3 = slurp(job_ / "job-h3.out");
  EXPECT_LT(std::chrono::steady_clock::now() - preempted_at, 10s) << h3;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      h3, m, std::regex(R"(kfrun: left on the notice: no worker of this host runs, (\d+) ms)")))
      << h3;
  std::cout << "[ notice -> the host's workers gone: " << m[1] << " ms ]" << std::endl;
  EXPECT_NE(h3.find("kfrun: notice from SIGUSR1"), std::string::npos) << h3;
  ASSERT_TRUE(eventually([&] { return size() == 2; }, 30s));
  for (const auto& w : before_preemption.workers) {
    if (w.endpoint.host == h3_address) {
      const std::string name = w.endpoint.str();
      EXPECT_TRUE(has_event([&](const ConfigEvent& e) {
        return e.type == "exited" && e.worker == name && e.detail == "exit 0";
      })) << name
          << "\n"
          << h3;
      EXPECT_FALSE(has_event([&](const ConfigEvent& e) {
        return e.type == "failed" && e.worker == name;
      })) << name
          << " failed instead of leaving\n"
          << h3;
    }
  }
  // The two others train on, and finish the job together.
  const long after = progress();
  ASSERT_TRUE(eventually([&] { return progress() > after + 50; }, 60s));
  finish_soon();
  ASSERT_TRUE(wait_gone(ids[0], 120s));
  ASSERT_TRUE(wait_gone(ids[1], 120s));
  expect_clean_finish(slurp(job_ / "job-h1.out") + slurp(job_ / "job-h2.out"), 2);
}

// A second allocation's agents join the running job (growth without a restart), and the death
// of its node's kf processes (agent and worker killed with SIGKILL at once, as when the machine
// dies) is recovered from: the other allocation's workers go on and finish with one model.
TEST_F(Slurm, ASecondAllocationGrowsTheJobAndItsNodesDeathIsRecoveredFrom) {
  const std::string first =
      sbatch("-N2 -w h1,h2 --exclusive --output=" + (job_ / "first.out").string(), agents("1000"));
  ASSERT_FALSE(first.empty());
  ASSERT_TRUE(eventually([&] { return size() == 2; }, 60s)) << slurp(job_ / "first.out");
  const long before = progress();
  ASSERT_TRUE(eventually([&] { return progress() > before + 50; }, 60s));
  const std::string second =
      sbatch("-N1 -w h3 --exclusive --output=" + (job_ / "second.out").string(), agents("1000"));
  ASSERT_FALSE(second.empty());
  // Running at 3, not only listed: a joiner lost before it joined is dropped without a recovery.
  ASSERT_TRUE(eventually([&] { return running(3); }, 60s)) << slurp(job_ / "second.out");
  const long grown = progress();
  ASSERT_TRUE(eventually([&] { return progress() > grown + 50; }, 60s));
  const std::string h3_address = bridge_.substr(0, bridge_.rfind('.')) + ".3";
  std::string victim;
  for (const auto& w : client().get_cluster().workers) {
    if (w.endpoint.host == h3_address) victim = w.endpoint.str();
  }
  ASSERT_FALSE(victim.empty());
  // The worker's pid from its agent's `started` event, and the agent's: its parent.
  pid_t worker = -1;
  for (const auto& e : client().get_events()) {
    if (e.type == "started" && e.worker == victim) worker = std::stoi(e.detail.substr(4));
  }
  ASSERT_GT(worker, 0);
  std::ifstream stat("/proc/" + std::to_string(worker) + "/stat");
  std::string line;
  std::getline(stat, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  char state = 0;
  pid_t agent = -1;
  fields >> state >> agent;
  ASSERT_GT(agent, 1) << line;
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return size() == 2; }, 60s)) << slurp(job_ / "first.out");
  const long shrunk = progress();
  ASSERT_TRUE(eventually([&] { return progress() > shrunk + 50; }, 60s));
  finish_soon();
  ASSERT_TRUE(wait_gone(first, 120s));
  const std::string out = slurp(job_ / "first.out");
  expect_clean_finish(out, 2);
  EXPECT_TRUE(eventually([&] { return recovered(); }, 30s)) << "the survivors recorded no recovery";
}

// Plain scancel (and a time limit) sends SIGTERM to every process of the allocation's step: the
// agent takes it as a notice and the workers, which ignore it under --slurm, leave with notice.
// Shrinking an allocation with scontrol kills the released node's tasks with SIGKILL instead: a
// failure, which the job recovers from.
TEST_F(Slurm, ScancelIsANoticeAndAShrinkByScontrolIsRecoveredFrom) {
  const std::string pair =
      sbatch("-N2 -w h1,h2 --exclusive --output=" + (job_ / "pair.out").string(), agents("1000"));
  const std::string single =
      sbatch("-N1 -w h3 --exclusive --output=" + (job_ / "single.out").string(), agents("1000"));
  ASSERT_FALSE(pair.empty());
  ASSERT_FALSE(single.empty());
  ASSERT_TRUE(eventually([&] { return size() == 3; }, 60s)) << slurp(job_ / "single.out");
  const long before = progress();
  ASSERT_TRUE(eventually([&] { return progress() > before + 50; }, 60s));
  const std::string h3_address = bridge_.substr(0, bridge_.rfind('.')) + ".3";
  std::string leaver;
  for (const auto& w : client().get_cluster().workers) {
    if (w.endpoint.host == h3_address) leaver = w.endpoint.str();
  }
  ASSERT_FALSE(leaver.empty());
  ASSERT_EQ(run_shell("scancel " + single).exit_code, 0);
  ASSERT_TRUE(wait_gone(single, 60s));
  ASSERT_TRUE(eventually([&] { return size() == 2; }, 30s));
  const std::string single_out = slurp(job_ / "single.out");
  EXPECT_NE(single_out.find("kfrun: notice from SIGTERM"), std::string::npos) << single_out;
  EXPECT_TRUE(has_event([&](const ConfigEvent& e) {
    return e.type == "exited" && e.worker == leaver && e.detail == "exit 0";
  })) << single_out;
  EXPECT_FALSE(has_event([](const ConfigEvent& e) { return e.type == "failed"; }))
      << "a worker failed instead of leaving\n"
      << single_out;
  const long left = progress();
  ASSERT_TRUE(eventually([&] { return progress() > left + 50; }, 60s));
  ASSERT_EQ(run_shell("scontrol update JobId=" + pair + " NumNodes=1").exit_code, 0);
  ASSERT_TRUE(eventually([&] { return size() == 1; }, 60s)) << slurp(job_ / "pair.out");
  EXPECT_TRUE(eventually([&] { return recovered(); }, 30s)) << "the survivors recorded no recovery";
  const long shrunk = progress();
  ASSERT_TRUE(eventually([&] { return progress() > shrunk + 50; }, 60s));
  finish_soon();
  ASSERT_TRUE(wait_gone(pair, 120s));
  expect_clean_finish(slurp(job_ / "pair.out"), 1);
}

// 20 preemptions and allocations in a row, drawn from a seed (KF_TEST_SEED, else 11): a `prio`
// job takes a node of a spot allocation (its workers leave on the user signal), or a new spot
// allocation joins on a free node; at least one allocation stays. Training goes on after each;
// no worker ever fails, and the last ones finish with one model, every sample once per epoch
// and no commit lost (the workers check both).
TEST_F(Slurm, TwentyRandomPreemptionsAndAllocationsKeepTheGuarantees) {
  const int seed = std::atoi(env_or_empty("KF_TEST_SEED").c_str());
  std::mt19937 gen(static_cast<unsigned>(seed > 0 ? seed : 11));
  std::map<int, std::string> spot;  // node -> its spot allocation
  int allocations = 0;
  const auto allocate = [&](int node) {
    const auto out = (job_ / ("alloc-" + std::to_string(++allocations) + ".out")).string();
    spot[node] =
        sbatch("-N1 -w h" + std::to_string(node) + " --exclusive --signal=USR1@5 --output=" + out,
               agents("1000"));
    return !spot[node].empty();
  };
  for (int node = 1; node <= 3; ++node) ASSERT_TRUE(allocate(node));
  ASSERT_TRUE(eventually([&] { return size() == 3; }, 60s));
  int preemptions = 0;
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<int> busy, free;
    for (int node = 1; node <= 3; ++node) (spot.contains(node) ? busy : free).push_back(node);
    const bool preempting = busy.size() > 1 && (free.empty() || gen() % 2 == 0);
    if (preempting) {
      const int node = busy[gen() % busy.size()];
      const std::string prio = preempt("h" + std::to_string(node));
      ASSERT_FALSE(prio.empty());
      ASSERT_TRUE(wait_gone(spot[node], 60s)) << "the spot allocation on h" << node;
      spot.erase(node);
      ++preemptions;
      // The prio job ends by itself.
      ASSERT_TRUE(eventually([&] { return size() == static_cast<int>(spot.size()); }, 60s))
          << slurm_state();
      // Its node free again before the next round may ask for it.
      ASSERT_TRUE(wait_gone_unstuck(prio, 60s)) << "the prio job on h" << node << slurm_state();
    } else {
      const int node = free[gen() % free.size()];
      ASSERT_TRUE(allocate(node));
      ASSERT_TRUE(eventually([&] { return size() == static_cast<int>(spot.size()); }, 60s))
          << slurm_state((job_ / ("alloc-" + std::to_string(allocations) + ".out")).string());
    }
    const long now = progress();
    ASSERT_TRUE(eventually([&] { return progress() > now + 20; }, 60s)) << "training stopped";
  }
  EXPECT_GT(preemptions, 3);
  finish_soon();
  for (const auto& [node, id] : spot) ASSERT_TRUE(wait_gone(id, 120s)) << "h" << node;
  std::string outputs;
  for (int i = 1; i <= allocations; ++i) {
    outputs += slurp(job_ / ("alloc-" + std::to_string(i) + ".out"));
  }
  expect_clean_finish(outputs, static_cast<int>(spot.size()));
  EXPECT_FALSE(has_event([](const ConfigEvent& e) { return e.type == "failed"; }))
      << "a worker failed instead of leaving";
  // For the record (not checked): the agents' time from the notice to their workers gone, and
  // the survivors' pause at the boundary where the leavers left.
  std::vector<double> gone_ms, pause_ms;
  const std::regex gone(R"(left on the notice: no worker of this host runs, (\d+) ms)");
  const std::regex shrink(R"(\((\d+) -> (\d+) workers, resize\):.*; pause ([0-9.]+) ms)");
  for (auto it = std::sregex_iterator(outputs.begin(), outputs.end(), gone);
       it != std::sregex_iterator(); ++it) {
    gone_ms.push_back(std::stod((*it)[1]));
  }
  for (auto it = std::sregex_iterator(outputs.begin(), outputs.end(), shrink);
       it != std::sregex_iterator(); ++it) {
    if (std::stoi((*it)[1]) > std::stoi((*it)[2])) pause_ms.push_back(std::stod((*it)[3]));
  }
  std::sort(gone_ms.begin(), gone_ms.end());
  std::sort(pause_ms.begin(), pause_ms.end());
  std::cout << "[ " << preemptions << " preemptions, " << allocations << " allocations; notice -> "
            << "workers gone (ms): median " << (gone_ms.empty() ? -1 : gone_ms[gone_ms.size() / 2])
            << ", max " << (gone_ms.empty() ? -1 : gone_ms.back())
            << "; survivors' pause at a leave (ms): median "
            << (pause_ms.empty() ? -1 : pause_ms[pause_ms.size() / 2]) << ", max "
            << (pause_ms.empty() ? -1 : pause_ms.back()) << " ]" << std::endl;
}

// kf-replay through Slurm: the synthetic spot trace's additions become allocations, its removals
// preemptions by the `prio` partition (a third of them scancel --signal=KILL instead), and the
// job keeps its guarantees. The throughput retained is printed, a figure for the notes, not a
// pass mark: it moves with this machine's load. The workers' compute is mostly a wait
// (--sample-us), as on hosts with accelerators of their own, so that the rates grow with the
// workers although the test hosts share two cores.
TEST_F(Slurm, KfReplayTurnsATraceIntoRealPreemptionsAndAllocations) {
  const std::string cmd =
      env_or_empty("KF_REPLAY") + " --trace " + env_or_empty("KF_SPOT_TRACE") +
      " --speed 60 --max-workers 3 --kill-fraction 0.34 --seed 5 --settle-ms 500"
      " --calibrate-ms 1500 --tail-ms 1000 --metrics-every 2 --finish-with epochs=1"
      " --finish-timeout-s 120 --dir " +
      (job_ / "replay").string() + " --slurm-nodes h1,h2,h3 --preempt-partition prio --listen " +
      bridge_ + " --kfrun " + env_or_empty("KFRUN") + " --config-server-exe " +
      env_or_empty("CONFIG_SERVER_EXE") + " -- " + env_or_empty("KF_ELASTIC_WORKER") +
      " --samples 20000 --dim 32 --batch 64 --epochs 1000 --sample-us 200";
  const auto r = run_shell(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kf-replay: guarantees held"), std::string::npos) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(preempted h\d)"))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(allocated h\d)"))) << r.output;
  std::cout << r.output << std::flush;  // the changes and the figures, for the test log
}

// The whole job preempted at once: two allocations, one of them requeueable (partition
// `requeue`, PreemptMode=REQUEUE, started with --requeue). The notices reach every worker, so the
// job is suspended: rank 0 writes the last commit to the checkpoint (KF_CHECKPOINT, on storage
// every node reads) and every worker leaves at that step; the requeueable allocation's agent asks
// Slurm to requeue it. When it runs again (Slurm holds a requeued job for about two minutes; the
// test lets it start a second later, as `scontrol update JobId=ID StartTime=now+1` lets a user),
// its agent resumes the job, whose workers load the checkpoint and go on from that step to a
// clean finish.
TEST_F(Slurm, AWholeJobPreemptedIsSuspendedAndItsRequeuedAllocationResumesIt) {
  const auto kept_out = (job_ / "kept.out").string();
  const auto rq_out = (job_ / "requeued.out").string();
  const std::string checkpoint = "--export=ALL,KF_CHECKPOINT=" + (job_ / "checkpoint").string() +
                                 ",KF_CHECKPOINT_EVERY=1000000000 ";
  const std::string kept = sbatch(
      checkpoint + "-N1 -w h2 --exclusive --signal=USR1@5 --output=" + kept_out, agents("1000"));
  const std::string rq = sbatch(checkpoint +
                                    "-p requeue --requeue -N1 -w h1 --exclusive --signal=USR1@5 "
                                    "--open-mode=append --output=" +
                                    rq_out,
                                agents("1000", "--requeue"));
  ASSERT_FALSE(kept.empty());
  ASSERT_FALSE(rq.empty());
  ASSERT_TRUE(eventually([&] { return size() == 2 && running(2); }, 60s)) << slurm_state(rq_out);
  ASSERT_TRUE(eventually([&] { return progress() > 20; }, 60s)) << slurm_state(rq_out);
  std::vector<std::string> prio;
  for (const char* node : {"h1", "h2"}) {
    prio.push_back(preempt(node));
    ASSERT_FALSE(prio.back().empty());
  }
  ASSERT_TRUE(eventually(
      [&] {
        return slurp(job_ / "requeued.out").find("kfrun: requeued allocation " + rq) !=
               std::string::npos;
      },
      60s))
      << slurm_state(rq_out);
  ASSERT_TRUE(wait_gone(kept, 60s)) << slurm_state(kept_out);
  EXPECT_EQ(client().get_cluster().settings.value("suspended", false), true);
  EXPECT_TRUE(has_event([](const ConfigEvent& e) {
    return e.type == "suspended" && e.detail.find("checkpoint ") != std::string::npos &&
           e.detail.find(" written") != std::string::npos;
  })) << "rank 0 wrote the checkpoint";
  const std::string before = slurp(job_ / "kept.out") + slurp(job_ / "requeued.out");
  const std::regex left_line(R"(left step (\d+))");
  std::set<long> left;
  for (auto it = std::sregex_iterator(before.begin(), before.end(), left_line);
       it != std::sregex_iterator(); ++it) {
    left.insert(std::stol((*it)[1]));
  }
  ASSERT_FALSE(left.empty()) << before;
  for (const auto& id : prio) ASSERT_TRUE(wait_gone(id, 60s));
  // Requeued, not gone: pending until Slurm lets it start.
  ASSERT_TRUE(eventually(
      [&] { return run_shell("squeue -h -j " + rq + " -o %T").output.find("PENDING") == 0; }, 60s))
      << slurm_state(rq_out);
  // Not StartTime=now: slurmd refuses a job's credential made in the same second as its
  // revocation at the requeue ("Killing non-startable batch JobId=..: Job credential revoked" in
  // slurmctld.log, and the allocation is gone), which a release within that second met under
  // load. The revocation is done by now (the prio job on its node has come and gone since), so a
  // start one second on is always in a later second than it.
  ASSERT_EQ(run_shell("scontrol update JobId=" + rq + " StartTime=now+1").exit_code, 0);
  ASSERT_TRUE(eventually(
      [&] { return has_event([](const ConfigEvent& e) { return e.type == "resumed"; }); }, 60s))
      << slurm_state(rq_out);
  const long at = *left.rbegin();
  ASSERT_TRUE(eventually([&] { return progress() > at + 20; }, 60s)) << slurm_state(rq_out);
  finish_soon();
  ASSERT_TRUE(wait_gone(rq, 120s)) << slurm_state(rq_out);
  const std::string requeued = slurp(job_ / "requeued.out");
  const auto resumed_at = requeued.find("kfrun: resumed the suspended job");
  ASSERT_NE(resumed_at, std::string::npos) << requeued;
  const std::string resumed = requeued.substr(resumed_at);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(resumed, m, std::regex(R"(joined v\d+ rank 0 size 1 step (\d+))")))
      << requeued;
  EXPECT_EQ(std::stol(m[1]), at) << "the resumed job goes on from the suspension's step";
  expect_clean_finish(resumed, 1);
}

// Autoscale on Slurm: three allocations offer their nodes' slots; with autoscale's target at 3,
// a preempted node's worker is placed again on a free slot of the others, by the job itself.
TEST_F(Slurm, AutoscaleKeepsItsTargetOnTheSlotsTheAllocationsOffer) {
  std::vector<std::string> ids;
  std::string outputs;
  for (int i = 1; i <= 3; ++i) {
    const auto out = (job_ / ("h" + std::to_string(i) + ".out")).string();
    ids.push_back(
        sbatch("-N1 -w h" + std::to_string(i) + " --exclusive --signal=USR1@5 --output=" + out,
               agents("1000")));
    ASSERT_FALSE(ids.back().empty());
  }
  ASSERT_TRUE(eventually([&] { return size() == 3; }, 60s)) << slurm_state();
  auto writer = client();
  write_setting(writer, "autoscale", {{"target", 3}, {"cooldown_s", 1}});
  const std::string h3 = bridge_.substr(0, bridge_.rfind('.')) + ".3";
  const std::string prio = preempt("h3");
  ASSERT_FALSE(prio.empty());
  ASSERT_TRUE(wait_gone(ids[2], 60s)) << slurm_state();
  const auto placed_again = [&] {
    const Cluster c = client().get_cluster();
    return c.size() == 3 &&
           std::none_of(c.workers.begin(), c.workers.end(),
                        [&](const WorkerSpec& w) { return w.endpoint.host == h3; }) &&
           has_event([](const ConfigEvent& e) { return e.type == "placed"; });
  };
  ASSERT_TRUE(eventually(placed_again, 60s)) << slurm_state();
  ASSERT_TRUE(eventually([&] { return running(3); }, 60s)) << slurm_state();
  const long before = progress();
  ASSERT_TRUE(eventually([&] { return progress() > before + 20; }, 60s)) << "training stopped";
  ASSERT_TRUE(wait_gone(prio, 60s));
  finish_soon();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(wait_gone(ids[static_cast<std::size_t>(i)], 120s));
  for (int i = 1; i <= 3; ++i) outputs += slurp(job_ / ("h" + std::to_string(i) + ".out"));
  expect_clean_finish(outputs, 3);
}

}  // namespace
}  // namespace kf::test
