// SPDX-License-Identifier: Apache-2.0
// kfrun end to end: the kfrun executable (path in $KFRUN) and run_static() start real worker
// processes (/bin/sh scripts) and the tests check exit codes, tagged output, the workers'
// environment, teardown and signal forwarding. Workers coordinate through FIFOs, never sleeps.
#include "kfrun/lib/launcher.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kf/cluster/cluster.hpp"
#include "kfrun/lib/binding.hpp"
#include "support/process.hpp"

namespace kf::tools {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Well under the 30 s that a worker left running would take.
constexpr auto kPrompt = 10s;

struct Captured {
  int exit_code = -1;
  std::string out;
  std::string err;
  Clock::duration elapsed{};
};

std::string kfrun_path() {
  const char* path = std::getenv("KFRUN");
  return path != nullptr ? path : "";
}

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
  std::fclose(f);
  return text;
}

int exit_code_of_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs the kfrun executable with `args`, stdout and stderr captured in temporary files.
Captured run_kfrun(const std::vector<std::string>& args) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  std::vector<std::string> argv{kfrun_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(::fileno(out), STDOUT_FILENO);
    ::dup2(::fileno(err), STDERR_FILENO);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(126);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Captured result;
  result.elapsed = Clock::now() - start;
  result.exit_code = exit_code_of_status(status);
  result.out = read_all(out);
  result.err = read_all(err);
  return result;
}

// Runs run_static() in this process, its output captured in temporary files.
Captured run_in_process(LaunchOptions options) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  options.out_fd = ::fileno(out);
  options.err_fd = ::fileno(err);
  const auto start = Clock::now();
  Captured result;
  result.exit_code = run_static(options);
  result.elapsed = Clock::now() - start;
  result.out = read_all(out);
  result.err = read_all(err);
  return result;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A FIFO in a fresh temporary directory, removed with it.
class Fifo {
 public:
  Fifo() {
    std::string dir = (std::filesystem::temp_directory_path() / "kfrun_test.XXXXXX").string();
    EXPECT_NE(::mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    path_ = (dir_ / "fifo").string();
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0);
  }
  ~Fifo() { std::filesystem::remove_all(dir_); }
  const std::string& path() const { return path_; }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

class Kfrun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kfrun_path().empty()) GTEST_SKIP() << "KFRUN (path of the kfrun executable) is not set";
  }
};

TEST_F(Kfrun, ReturnsZeroWhenAllWorkersSucceed) {
  const auto r = run_kfrun({"-np", "3", "--", "sh", "-c", "exit 0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST_F(Kfrun, AcceptsProgramWithoutDoubleDash) {
  const auto r = run_kfrun({"-np", "2", "sh", "-c", "echo \"$0 $1\"", "--host", "-np"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[1] --host -np\n")) << r.out;
}

TEST_F(Kfrun, ReturnsFailingWorkersCodeAndStopsTheOthersPromptly) {
  // The survivors run `sleep` as a child of sh: stopping must reach the whole process group.
  const auto r = run_kfrun(
      {"-np", "3", "--", "sh", "-c", "if [ \"$KF_RANK\" = 1 ]; then exit 3; fi; sleep 30; :"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_LT(r.elapsed, kPrompt);
  EXPECT_TRUE(contains(r.err, "kfrun: worker 1 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "exited with code 3; stopping the other workers")) << r.err;
}

TEST_F(Kfrun, ReportsWorkerKilledBySignalAs128PlusSignal) {
  const auto r = run_kfrun(
      {"-np", "2", "--", "sh", "-c", "if [ \"$KF_RANK\" = 0 ]; then kill -KILL $$; fi; sleep 30"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_LT(r.elapsed, kPrompt);
  EXPECT_TRUE(contains(r.err, "worker 0 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 9")) << r.err;
}

TEST_F(Kfrun, KillsWorkersThatIgnoreSigtermAfterTheGracePeriod) {
  // Rank 1 ignores SIGTERM and then opens the FIFO; rank 0 fails once rank 1 has got there.
  Fifo fifo;
  LaunchOptions options;
  options.np = 2;
  options.grace = 200ms;
  options.command = {"sh", "-c",
                     "if [ \"$KF_RANK\" = 0 ]; then read x < " + fifo.path() +
                         "; exit 4; fi; trap '' TERM; echo go > " + fifo.path() + "; sleep 30"};
  const auto r = run_in_process(options);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_GE(r.elapsed, options.grace);
  EXPECT_LT(r.elapsed, kPrompt);
  EXPECT_TRUE(contains(r.err, "200 ms after SIGTERM; sending SIGKILL")) << r.err;
}

TEST_F(Kfrun, PrefixesEachLineWithRankOnItsOwnStream) {
  const auto r = run_kfrun({"-np", "2", "--", "sh", "-c",
                            "echo out-$KF_RANK; echo err-$KF_RANK >&2; echo two; printf end"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto out_lines = lines_of(r.out);
  const auto err_lines = lines_of(r.err);
  std::multiset<std::string> out(out_lines.begin(), out_lines.end());
  std::multiset<std::string> err(err_lines.begin(), err_lines.end());
  EXPECT_EQ(out, (std::multiset<std::string>{"[0] out-0", "[0] two", "[0] end", "[1] out-1",
                                             "[1] two", "[1] end"}))
      << r.out;
  EXPECT_EQ(err, (std::multiset<std::string>{"[0] err-0", "[1] err-1"})) << r.err;
  // The lines of one worker keep their order.
  EXPECT_LT(r.out.find("[1] out-1"), r.out.find("[1] two"));
  EXPECT_LT(r.out.find("[1] two"), r.out.find("[1] end"));
}

TEST_F(Kfrun, GivesEachWorkerItsEndpointAndTheWholeCluster) {
  const auto r =
      run_kfrun({"-np", "3", "--port-range", "20000-40000", "--algorithm", "ring", "--timeout-ms",
                 "1500", "--", "sh", "-c",
                 "echo \"$KF_RANK|$KF_SIZE|$KF_SELF|$KF_ALGORITHM|$KF_TIMEOUT_MS|$KF_JOB_ID|"
                 "${KF_JOB_TOKEN-unset}|$KF_JOB_TOKEN_FILE|$(cat \"$KF_JOB_TOKEN_FILE\")|"
                 "$(stat -c %a \"$KF_JOB_TOKEN_FILE\")|$KF_CLUSTER\""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int, std::vector<std::string>> fields;  // by rank
  for (const auto& line : lines_of(r.out)) {
    std::vector<std::string> f;
    std::istringstream in(line.substr(line.find(' ') + 1));
    for (std::string field; std::getline(in, field, '|');) f.push_back(field);
    ASSERT_EQ(f.size(), 11u) << line;
    EXPECT_EQ(line.substr(0, line.find(' ')), "[" + f[0] + "]");
    fields[std::stoi(f[0])] = f;
  }
  ASSERT_EQ(fields.size(), 3u) << r.out;
  const Cluster cluster = Cluster::from_json(nlohmann::json::parse(fields[0][10]));
  EXPECT_EQ(cluster.version, 1u);
  ASSERT_EQ(cluster.size(), 3);
  EXPECT_EQ(cluster.settings, (nlohmann::json{{"algorithm", "ring"}}));
  std::set<std::uint16_t> ports;
  for (int rank = 0; rank < 3; ++rank) {
    const auto& f = fields[rank];
    EXPECT_EQ(f[1], "3");
    EXPECT_EQ(Endpoint::parse(f[2]), cluster.workers[rank].endpoint);
    EXPECT_EQ(cluster.workers[rank].endpoint.host, "127.0.0.1");
    EXPECT_EQ(cluster.workers[rank].slot, rank);
    EXPECT_EQ(f[3], "ring");
    EXPECT_EQ(f[4], "1500");
    EXPECT_EQ(f[5], fields[0][5]);
    EXPECT_FALSE(f[5].empty());
    // The token goes by file only: a fresh random one, in a file only this user can read.
    EXPECT_EQ(f[6], "unset");
    EXPECT_EQ(f[7], fields[0][7]);
    EXPECT_EQ(f[8], fields[0][8]);
    EXPECT_EQ(f[8].size(), 64u);
    EXPECT_EQ(f[9], "600");
    EXPECT_EQ(f[10], fields[0][10]);
    ports.insert(cluster.workers[rank].endpoint.port);
  }
  EXPECT_FALSE(std::filesystem::exists(fields[0][7])) << "the token file outlived the job";
  EXPECT_EQ(ports.size(), 3u);
  EXPECT_GE(*ports.begin(), 20000);
  EXPECT_LE(*ports.rbegin(), 40000);
}

TEST_F(Kfrun, TakesItsDefaultsAndTheSettingsFromAJobFile) {
  Fifo dir;  // only for its temporary directory
  const auto job = std::filesystem::path(dir.path()).parent_path() / "job.yaml";
  std::ofstream(job) << "job: {name: t}\nworkers: {min: 1, max: 4, initial: 3}\n"
                        "algorithm: tree\nbatch_size: 128\nlearning_rate: 0.5\n"
                        "timeouts: {collective_ms: 2500}\nports: 30000-31000\n"
                        "metrics: {port: 9300}\n";
  // --timeout-ms on the command line wins over the file.
  const auto r = run_kfrun({"--job", job.string(), "--timeout-ms", "999", "--", "sh", "-c",
                            "echo \"$KF_ALGORITHM|$KF_TIMEOUT_MS|$KF_METRICS_PORT|$KF_JOB_FILE|"
                            "$KF_SELF|$KF_CLUSTER\""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 3u) << "workers.initial is the default -np:\n" << r.out;
  std::set<std::string> metrics_ports;
  for (const auto& line : lines) {
    std::vector<std::string> f;
    std::istringstream in(line.substr(line.find(' ') + 1));
    for (std::string field; std::getline(in, field, '|');) f.push_back(field);
    ASSERT_EQ(f.size(), 6u) << line;
    EXPECT_EQ(f[0], "tree");
    EXPECT_EQ(f[1], "999");
    metrics_ports.insert(f[2]);
    EXPECT_EQ(f[3], std::filesystem::absolute(job).string());
    const auto port = Endpoint::parse(f[4]).port;
    EXPECT_GE(port, 30000);
    EXPECT_LE(port, 31000);
    const Cluster cluster = Cluster::from_json(nlohmann::json::parse(f[5]));
    EXPECT_EQ(cluster.settings.at("batch_size"), 128);
    EXPECT_EQ(cluster.settings.at("lr"), 0.5);
    EXPECT_EQ(cluster.settings.at("max_workers"), 4);
    EXPECT_EQ(cluster.settings.at("algorithm"), "tree");
  }
  EXPECT_EQ(metrics_ports, (std::set<std::string>{"9300", "9301", "9302"}));

  std::ofstream(job) << "job: {}\nbatch_size: many\n";
  const auto bad = run_kfrun({"--job", job.string(), "--", "true"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, job.string() + ":2: batch_size:")) << bad.err;
}

TEST_F(Kfrun, PassesJobIdAndTokenFileInsteadOfToken) {
  Fifo dir;  // only for its temporary directory
  const auto token_file = std::filesystem::path(dir.path()).parent_path() / "token";
  std::ofstream(token_file) << "s3cret\n";
  // Only this user may read a token file (kf warns otherwise).
  std::filesystem::permissions(
      token_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ::setenv("KF_JOB_TOKEN", "inherited", 1);
  const auto r =
      run_kfrun({"-np", "2", "--job-id", "my-job", "--job-token-file", token_file.string(), "--",
                 "sh", "-c", "echo \"$KF_JOB_ID|${KF_JOB_TOKEN-unset}|$KF_JOB_TOKEN_FILE\""});
  ::unsetenv("KF_JOB_TOKEN");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string expected = "my-job|unset|" + token_file.string();
  auto lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());  // the ranks' lines may come in either order
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] " + expected, "[1] " + expected})) << r.out;
}

// The CPUs of a "Cpus_allowed_list:\t0-1,4" line.
std::set<int> cpus_of(const std::string& line) {
  std::set<int> cpus;
  std::istringstream in(line.substr(line.find(':') + 1));
  for (std::string part; std::getline(in, part, ',');) {
    const auto dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int c = first; c <= last; ++c) cpus.insert(c);
  }
  return cpus;
}

// Each rank's CPUs, from its "[rank] Cpus_allowed_list: ..." line.
std::map<int, std::set<int>> cpus_by_rank(const std::string& out) {
  std::map<int, std::set<int>> by_rank;
  for (const auto& line : lines_of(out)) {
    if (!contains(line, "Cpus_allowed_list")) continue;
    by_rank[std::stoi(line.substr(1))] = cpus_of(line);
  }
  return by_rank;
}

// Holds this thread (which forks the workers in run_in_process) to `cpus` while it lives.
class HeldTo {
 public:
  explicit HeldTo(const std::vector<int>& cpus) {
    EXPECT_EQ(::sched_getaffinity(0, sizeof saved_, &saved_), 0);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    EXPECT_EQ(::sched_setaffinity(0, sizeof set, &set), 0);
  }
  ~HeldTo() { ::sched_setaffinity(0, sizeof saved_, &saved_); }

 private:
  cpu_set_t saved_;
};

TEST_F(Kfrun, HoldsEachWorkerToOneCoreOnlyWhenThereAreMoreWorkersThanCores) {
  const auto allowed = allowed_cpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs 2 CPUs to run on, has " << allowed.size();
  const int a = allowed[0];
  const int b = allowed[1];
  const HeldTo held({a, b});
  LaunchOptions options;
  options.command = {"sh", "-c", "grep Cpus_allowed_list /proc/self/status"};

  options.np = 3;  // 3 workers, 2 cores: slot s on core s mod 2
  auto r = run_in_process(options);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(cpus_by_rank(r.out), (std::map<int, std::set<int>>{{0, {a}}, {1, {b}}, {2, {a}}}))
      << r.out;

  options.bind = Bind::none;
  r = run_in_process(options);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(cpus_by_rank(r.out),
            (std::map<int, std::set<int>>{{0, {a, b}}, {1, {a, b}}, {2, {a, b}}}))
      << r.out;

  options.bind = Bind::automatic;
  options.np = 2;  // a core each: left free
  r = run_in_process(options);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(cpus_by_rank(r.out), (std::map<int, std::set<int>>{{0, {a, b}}, {1, {a, b}}})) << r.out;
}

TEST_F(Kfrun, RejectsAnUnknownBinding) {
  const auto r = run_kfrun({"--bind", "core", "-np", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--bind")) << r.err;
}

TEST_F(Kfrun, ReportsProgramThatCannotBeExecuted) {
  const auto r = run_kfrun({"-np", "2", "--", "kf-no-such-program", "arg"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_TRUE(contains(r.err, "cannot execute 'kf-no-such-program'")) << r.err;
}

// Starts kfrun with 2 workers that run `script` (which prints one line and then waits), waits
// until both printed theirs, sends kfrun `sig`, and returns how kfrun ended.
Captured signal_running_job(int sig, const std::string& script = "echo ready; sleep 30") {
  int out[2];
  EXPECT_EQ(::pipe(out), 0);
  std::FILE* err = std::tmpfile();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(::fileno(err), STDERR_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    const std::string kfrun = kfrun_path();
    ::execl(kfrun.c_str(), kfrun.c_str(), "-np", "2", "--", "sh", "-c", script.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(126);
  }
  ::close(out[1]);
  Captured result;
  char buffer[256];
  while (lines_of(result.out).size() < 2) {
    const auto n = ::read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;
    result.out.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_EQ(lines_of(result.out).size(), 2u) << result.out;
  const auto start = Clock::now();
  EXPECT_EQ(::kill(pid, sig), 0);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  result.elapsed = Clock::now() - start;
  ::close(out[0]);
  result.exit_code = exit_code_of_status(status);
  result.err = read_all(err);
  return result;
}

TEST_F(Kfrun, ForwardsSigintToTheWorkers) {
  const auto r = signal_running_job(SIGINT);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_LT(r.elapsed, kPrompt);
  EXPECT_TRUE(contains(r.err, "kfrun: received SIGINT; forwarding it to the workers")) << r.err;
  EXPECT_TRUE(contains(r.err, "was killed by signal 2")) << r.err;
}

TEST_F(Kfrun, StopsTheWorkersOnSigterm) {
  const auto r = signal_running_job(SIGTERM);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_LT(r.elapsed, kPrompt);
  EXPECT_TRUE(contains(r.err, "kfrun: received SIGTERM; stopping the workers")) << r.err;
}

// kfrun killed with kill -9 cannot stop its workers itself: the kernel does (a parent-death
// signal), so none is left training alone.
TEST_F(Kfrun, WorkersDieWithKfrunEvenByKillNine) {
  const auto r = signal_running_job(SIGKILL, "echo ready $$ $KF_JOB_TOKEN_FILE; exec sleep 30");
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  std::vector<pid_t> workers;
  for (const auto& line : lines_of(r.out)) {
    const auto at = line.find("ready ");
    ASSERT_NE(at, std::string::npos) << line;
    std::istringstream fields(line.substr(at + 6));
    pid_t pid = 0;
    std::string token_file;
    fields >> pid >> token_file;
    workers.push_back(pid);
    // kfrun had no chance to remove its private directory.
    std::filesystem::remove_all(std::filesystem::path(token_file).parent_path());
  }
  ASSERT_EQ(workers.size(), 2u) << r.out;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (const pid_t w : workers) {
    EXPECT_TRUE(test::wait_ended(w, deadline)) << "worker " << w << " outlived kfrun";
    if (!test::ended(w)) ::kill(w, SIGKILL);
  }
}

// A worker gets stdin, stdout and stderr, and nothing else of kfrun's (here: the files this
// test gave kfrun as its stdout and stderr, which kfrun itself inherits below them).
// Besides stdin, stdout and stderr, a worker inherits one descriptor: the socket kfrun bound to
// its port (KF_LISTEN_FD), so that the port is held from the moment the worker starts.
TEST_F(Kfrun, WorkersInheritOnlyStdinStdoutStderrAndTheirListeningSocket) {
  const auto r = run_kfrun(
      {"-np", "1", "--", "sh", "-c", "echo \"listen=$KF_LISTEN_FD\"; exec ls -l /proc/self/fd/"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto at = r.out.find("listen=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int listen_fd = std::atoi(r.out.c_str() + at + 7);
  ASSERT_GT(listen_fd, 2) << r.out;
  const auto listed = test::listed_fds(r.out);
  // And the directory ls is listing.
  EXPECT_EQ(listed.fds.size(), 5U) << r.out;
  EXPECT_EQ(listed.sockets, (std::set<int>{listen_fd})) << r.out;
}

// A worker that leaves a child running (here one that also holds its stdout) does not keep the
// job from ending, and the child does not outlive it: kfrun kills the worker's process group once
// the worker has exited.
TEST_F(Kfrun, AChildAWorkerLeftBehindDiesWithIt) {
  const auto start = Clock::now();
  const auto r = run_kfrun({"-np", "1", "--", "sh", "-c", "sleep 300 & echo child $!"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(60)) << "kfrun waited for the child";
  const auto at = r.out.find("child ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const pid_t child = std::stoi(r.out.substr(at + 6));
  EXPECT_TRUE(test::wait_ended(child, Clock::now() + std::chrono::seconds(10)))
      << "the worker's child outlived it";
  if (!test::ended(child)) ::kill(child, SIGKILL);
}

TEST_F(Kfrun, RejectsPortRangeWithoutEnoughFreePorts) {
  // Hold one port and offer only that one.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length), 0);
  const std::string range =
      std::to_string(ntohs(a.sin_port)) + "-" + std::to_string(ntohs(a.sin_port));
  const auto r = run_kfrun({"-np", "1", "--port-range", range, "--", "true"});
  ::close(fd);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "port range " + range)) << r.err;
}

class KfrunUsage : public Kfrun, public ::testing::WithParamInterface<std::vector<std::string>> {};

TEST_P(KfrunUsage, ExitsWithTwoAndAMessage) {
  const auto r = run_kfrun(GetParam());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err, "");
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    BadArguments, KfrunUsage,
    ::testing::Values(std::vector<std::string>{"-np", "0", "--", "true"},
                      std::vector<std::string>{"-np", "x", "--", "true"},
                      std::vector<std::string>{"--", "true"}, std::vector<std::string>{"-np", "2"},
                      std::vector<std::string>{"-np", "2", "--"},
                      std::vector<std::string>{"-np", "2", "--port-range", "5-1", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--port-range", "abc", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--timeout-ms", "0", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--metrics-port", "70000", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--job-token-file",
                                               "/nonexistent/kf-token", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--no-such-option", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--host", "", "--", "true"},
                      std::vector<std::string>{"-np", "2", "--host", "a b", "--", "true"}));

}  // namespace
}  // namespace kf::tools
