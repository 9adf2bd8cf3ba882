// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/launcher.hpp"

#include <poll.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "kf/common/env.hpp"
#include "kf/common/host.hpp"
#include "kfrun/lib/line_prefixer.hpp"
#include "kfrun/lib/output.hpp"
#include "kfrun/lib/private_dir.hpp"
#include "kfrun/lib/signal_pipe.hpp"
#include "kfrun/lib/worker_env.hpp"
#include "kfrun/lib/worker_process.hpp"

namespace kf::tools {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExecFailed = 127;  // what a shell returns for a command it cannot run

struct Worker {
  int rank;
  WorkerProcess process;
  LinePrefixer out_lines;
  LinePrefixer err_lines;
};

// Owns the running workers and runs the poll loop of run_static() steps 4-6.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& options, SignalPipe& signals)
      : options_(options),
        signals_(signals),
        out_(options.out_fd, options.err_fd),
        err_(options.err_fd, options.err_fd) {
    workers_.reserve(static_cast<std::size_t>(options.np));
  }

  // Throws: as WorkerProcess::spawn.
  void start(int rank, const Endpoint& self, std::vector<std::string> env) {
    // Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "[" + std::string&&.
    std::string prefix = "[";
    prefix.append(std::to_string(rank)).append("] ");
    // Worker i is in slot i.
    const auto cpu = cpu_for_slot(options_.bind, rank, options_.np, cpus_);
    UniqueFd listener;
    try {
      listener = worker_listener(self);
    } catch (const ExecError& e) {
      throw ExecError("cannot start rank " + std::to_string(rank) + " at " + self.str() + ": " +
                      e.what());
    }
    add_listen_fd(env, listener.get());
    workers_.push_back(Worker{rank,
                              WorkerProcess::spawn(options_.command, env, cpu,
                                                   /*die_with_parent=*/true, {}, listener.get()),
                              LinePrefixer(prefix, [this](auto line) { out_.write(line); }),
                              LinePrefixer(prefix, [this](auto line) { err_.write(line); })});
  }

  // Ends the job with exit code `code` (unless a worker failed first) and stops the workers.
  void end_job(int code) {
    if (!failure_) failure_ = code;
    stop();
  }

  void say(const std::string& message) noexcept { err_.write("kfrun: " + message + "\n"); }

  // Runs until every worker is reaped; returns kfrun's exit code.
  int wait() {
    while (any_running()) {
      poll_once();
      reap();
      enforce_grace();
    }
    for (auto& w : workers_) {
      drain(w.process.out(), w.out_lines, buffer_);
      drain(w.process.err(), w.err_lines, buffer_);
    }
    return failure_.value_or(0);
  }

 private:
  bool any_running() const noexcept {
    for (const auto& w : workers_) {
      if (w.process.running()) return true;
    }
    return false;
  }

  void signal_all(int sig) noexcept {
    for (auto& w : workers_) w.process.signal(sig);
  }

  void stop() {
    if (stopping_) return;
    stopping_ = true;
    kill_at_ = Clock::now() + options_.grace;
    signal_all(SIGTERM);
  }

  // Waits for output, a signal or the end of the grace period, and handles what came.
  void poll_once() {
    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    std::vector<std::pair<UniqueFd*, LinePrefixer*>> streams;
    for (auto& w : workers_) {
      for (auto [fd, lines] :
           {std::pair{&w.process.out(), &w.out_lines}, std::pair{&w.process.err(), &w.err_lines}}) {
        if (!fd->is_open()) continue;
        fds.push_back({fd->get(), POLLIN, 0});
        streams.emplace_back(fd, lines);
      }
    }
    int timeout_ms = -1;
    if (stopping_ && !killed_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(kill_at_ - Clock::now());
      timeout_ms = static_cast<int>(std::max<std::chrono::milliseconds::rep>(left.count(), 0));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) return;
      throw std::system_error(errno, std::generic_category(), "kfrun: poll");
    }
    if (fds[0].revents != 0) on_signals();
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_chunk(*streams[i - 1].first, *streams[i - 1].second, buffer_);
    }
  }

  // SIGINT is forwarded as is: the workers decide (a training job may save and exit 0).
  // SIGTERM stops the job within the grace period, so that whoever sends it (a scheduler) can
  // count on a bounded shutdown, and kfrun then exits as if killed by it.
  void on_signals() {
    for (int sig : signals_.drain()) {
      if (sig == SIGINT) {
        say("received SIGINT; forwarding it to the workers");
        signal_all(SIGINT);
      } else if (sig == SIGTERM) {
        say("received SIGTERM; stopping the workers");
        end_job(128 + SIGTERM);
      }  // SIGCHLD: reap() follows
    }
  }

  void reap() {
    for (auto& w : workers_) {
      const auto status = w.process.try_reap();
      if (!status || exit_code_of(*status) == 0 || stopping_) continue;
      failure_ = exit_code_of(*status);
      say("worker " + std::to_string(w.rank) + " (pid " + std::to_string(w.process.pid()) + ") " +
          describe_exit(*status) + (any_running() ? "; stopping the other workers" : ""));
      stop();
    }
  }

  void enforce_grace() {
    if (!stopping_ || killed_ || Clock::now() < kill_at_ || !any_running()) return;
    killed_ = true;
    say("workers still running " + std::to_string(options_.grace.count()) +
        " ms after SIGTERM; sending SIGKILL");
    signal_all(SIGKILL);
  }

  const LaunchOptions& options_;
  SignalPipe& signals_;
  FdWriter out_;
  FdWriter err_;
  const std::vector<int> cpus_ = allowed_cpus();  // kfrun's own, for holding workers to one
  std::vector<Worker> workers_;
  std::optional<int> failure_;  // exit code of the first failure
  bool stopping_ = false;       // SIGTERM sent; SIGKILL follows at kill_at_
  bool killed_ = false;         // SIGKILL sent
  Clock::time_point kill_at_;
  std::array<char, 64 * 1024> buffer_;
};

void check(const LaunchOptions& options) {
  if (options.np < 1) {
    throw std::invalid_argument("-np must be at least 1 (got " + std::to_string(options.np) + ")");
  }
  if (options.command.empty() || options.command.front().empty()) {
    throw std::invalid_argument("no program given: kfrun -np N [options] -- PROG ARGS...");
  }
  if (const std::string why = host_problem(options.host); !why.empty()) {
    throw std::invalid_argument("--host '" + options.host + "' is " + why);
  }
  if (options.timeout && options.timeout->count() <= 0) {
    throw std::invalid_argument("--timeout-ms must be positive");
  }
  if (options.job_id && options.job_id->empty()) {
    throw std::invalid_argument("--job-id must not be empty");
  }
  if (options.algorithm && options.algorithm->empty()) {
    throw std::invalid_argument("--algorithm must not be empty");
  }
}

JobSpec make_job(const LaunchOptions& options) {
  JobSpec job;
  if (options.job_token_file) {
    try {
      read_token_file(*options.job_token_file);
    } catch (const std::runtime_error& e) {
      throw std::invalid_argument(std::string("--job-token-file: ") + e.what());
    }
    // Absolute, so that a worker that changes directory still finds it.
    job.job_token_file = std::filesystem::absolute(*options.job_token_file).string();
  }
  job.job_id = options.job_id.value_or("kf-" + random_hex(8));
  job.algorithm = options.algorithm;
  job.timeout = options.timeout;
  job.metrics_port = options.metrics_port;
  job.job_file = options.job_file;
  const auto ports = pick_free_ports(options.host, options.ports, options.np);
  job.cluster = static_cluster(options.host, ports, options.algorithm);
  job.cluster.settings.update(options.settings);
  return job;
}

}  // namespace

int run_static(const LaunchOptions& options) {
  check(options);
  JobSpec job = make_job(options);
  // Without a token file, a random token in a 0600 file of a private directory that lives as
  // long as the job: a token in the environment could be read by anyone who can read the
  // workers' /proc/PID/environ, and is inherited by every program they start.
  // The same directory holds the cluster document when it is too large for the environment.
  std::optional<PrivateDir> job_dir;
  if (!job.job_token_file) {
    job_dir.emplace();
    const auto file = job_dir->path() / "job.token";
    write_token_file(file, random_hex(kTokenBytes));
    job.job_token_file = file.string();
  }
  if (!fits_environment(job.cluster)) {
    if (!job_dir) job_dir.emplace();
    job.cluster_file = write_cluster_file(job.cluster, job_dir->path());
  }
  const auto base = current_environment();
  SignalPipe signals;
  Supervisor supervisor(options, signals);
  for (int rank = 0; rank < options.np; ++rank) {
    try {
      supervisor.start(rank, job.cluster.workers[static_cast<std::size_t>(rank)].endpoint,
                       worker_environment(job, rank, base));
    } catch (const ExecError& e) {
      supervisor.say(e.what());
      supervisor.end_job(kExecFailed);
      break;
    }
  }
  return supervisor.wait();
}

}  // namespace kf::tools
