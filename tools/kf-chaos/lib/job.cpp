// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "kf/common/env.hpp"
#include "kf/common/json.hpp"
#include "kfrun/lib/ports.hpp"
#include "kfrun/lib/private_dir.hpp"
#include "kfrun/lib/worker_env.hpp"

extern char** environ;

namespace kf::chaos {

namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// Starts argv with stdin on /dev/null, stdout and stderr appended to `out` and `err`, and the
// environment of this process plus `extra`.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err,
            const std::vector<std::string>& extra = {}) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  std::vector<char*> c_argv;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_env;
  for (char** e = environ; *e != nullptr; ++e) c_env.push_back(*e);
  for (const auto& e : extra) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, c_argv[0], &actions, nullptr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// The exit code of child `pid` (128 + signal), or nullopt when it still runs at `until`.
std::optional<int> wait_exit(pid_t pid, Clock::time_point until) {
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -1;
    if (Clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(milliseconds(20));  // a child of ours: nothing else to wait on
  }
}

// Signals child `pid` and reaps it (SIGKILL after 10 s); sets it to 0.
void stop(pid_t& pid, int sig) {
  if (pid <= 0) return;
  ::kill(pid, sig);
  if (!wait_exit(pid, Clock::now() + std::chrono::seconds(10))) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  pid = 0;
}

}  // namespace

WorkDir::WorkDir(const std::optional<fs::path>& given) {
  if (given) {
    path_ = *given;
    fs::create_directories(path_);
    return;
  }
  std::string pattern = (fs::temp_directory_path() / "kf-job-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::system_error(errno, std::generic_category(),
                            "cannot make a temporary directory like " + pattern);
  }
  path_ = pattern;
  own_ = true;
}

WorkDir::~WorkDir() {
  if (!own_) return;
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

std::string WorkDir::keep(const std::string& tool, std::uint64_t seed) {
  if (!own_) return path_.string();
  const fs::path kept = fs::temp_directory_path() /
                        (tool + "-" + std::to_string(seed) + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::rename(path_, kept, ec);
  if (ec) return path_.string();
  path_ = kept;
  own_ = false;
  return kept.string();
}

std::string default_tool(const std::string& name) {
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const auto& candidate :
         {self.parent_path() / name, self.parent_path().parent_path() / name / name}) {
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return name;
}

bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (pid <= 0 || !std::getline(stat, text)) return false;
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z' &&
         text[close + 2] != 'X';
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string last_lines(const std::string& text, int count) {
  std::size_t at = text.size();
  for (int i = 0; i <= count && at > 0; ++i) {
    at = text.rfind('\n', at - 1);
    if (at == std::string::npos) return text;
  }
  return text.substr(at + 1);
}

Job::Job(JobSpec spec, fs::path dir) : spec_(std::move(spec)), dir_(std::move(dir)) {
  token_file_ = dir_ / "job.token";
  tools::write_token_file(token_file_, tools::random_hex(tools::kTokenBytes));
  token_ = read_token_file(token_file_.string());
  port_ = tools::pick_free_ports(spec_.host, tools::PortRange{}, 1).front();
  url_ = "http://" + spec_.host + ":" + std::to_string(port_);
}

Job::~Job() {
  stop(agent_, SIGKILL);
  for (const auto& [w, pid] : pids_) {
    if (running(pid)) ::kill(pid, SIGKILL);
  }
  stop(server_, SIGKILL);
}

ConfigClient Job::client() const { return ConfigClient(url_, token_); }

void Job::start_server() {
  server_ =
      spawn({spec_.config_server, "--token-file", token_file_.string(), "--state",
             (dir_ / "state.json").string(), "--listen", spec_.host + ":" + std::to_string(port_)},
            dir_ / "server.out", dir_ / "server.err");
  const auto until = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    try {
      ConfigClient c(url_, token_, ConfigClientOptions{milliseconds(1000)});
      c.get_cluster();
      return;
    } catch (const std::exception& e) {
      if (auto code = wait_exit(server_, Clock::now())) {
        server_ = 0;
        throw std::runtime_error("the config service exited with " + std::to_string(*code) + ": " +
                                 last_lines(slurp(dir_ / "server.err"), 5));
      }
      if (Clock::now() >= until) {
        throw std::runtime_error("the config service does not answer at " + url_ + ": " + e.what());
      }
    }
    std::this_thread::sleep_for(milliseconds(20));  // until it listens: nothing to wait on
  }
}

void Job::kill_server() { stop(server_, SIGKILL); }
void Job::stop_server() { stop(server_, SIGTERM); }

void Job::start_agent() {
  try {
    refresh_pids();
  } catch (const std::exception&) {
    // The service is down: what came before the agent is what was seen so far.
  }
  agent_seq_ = last_seq_;
  attached_.clear();
  std::vector<std::string> argv{spec_.kfrun,
                                "--watch",
                                "--config-server",
                                url_,
                                "--job-token-file",
                                token_file_.string(),
                                "--slots",
                                std::to_string(spec_.slots),
                                "-np",
                                std::to_string(spec_.np),
                                "--"};
  argv.insert(argv.end(), spec_.command.begin(), spec_.command.end());
  agent_ = spawn(argv, dir_ / "agent.out", dir_ / "agent.err", spec_.env);
}

void Job::kill_agent() { stop(agent_, SIGKILL); }

std::optional<int> Job::agent_exit(Clock::time_point until) {
  if (agent_ <= 0) return agent_code_;
  auto code = wait_exit(agent_, until);
  if (code) {
    agent_ = 0;
    agent_code_ = code;
  }
  return code;
}

void Job::refresh_pids() {
  const std::regex pid_re(R"(pid (\d{1,9})\b)");  // a pid fits an int
  for (const auto& e : client().get_events(last_seq_)) {
    last_seq_ = std::max(last_seq_, e.seq);
    std::smatch m;
    if (e.type == "joined") joined_.insert(e.worker);
    if ((e.type == "started" || e.type == "adopted") && std::regex_search(e.detail, m, pid_re)) {
      pids_[e.worker] = std::stoi(m[1]);
      if (e.seq > agent_seq_) attached_.insert(e.worker);
    }
  }
}

std::map<std::string, pid_t> Job::live_members(const Cluster& c) {
  refresh_pids();
  std::map<std::string, pid_t> live;
  for (const auto& w : c.workers) {
    const auto it = pids_.find(w.endpoint.str());
    if (it != pids_.end() && running(it->second)) live.emplace(it->first, it->second);
  }
  return live;
}

bool Job::wait_agent_attached(Clock::time_point until) {
  for (;;) {
    try {
      const auto live = live_members(client().get_cluster());
      if (std::all_of(live.begin(), live.end(),
                      [&](const auto& m) { return attached_.count(m.first) > 0; })) {
        return true;
      }
    } catch (const std::exception&) {
      // The service is restarting: ask again.
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the agent's next event
  }
}

void Job::kill_workers() {
  try {
    refresh_pids();
  } catch (const std::exception&) {
    // The service is down: the pids known so far are all there is.
  }
  std::vector<pid_t> killed;
  for (const auto& [w, pid] : pids_) {
    if (running(pid) && ::kill(pid, SIGKILL) == 0) killed.push_back(pid);
  }
  // The signal takes effect after kill() returns: wait (5 s at most) until each has exited, so
  // that whoever looks next finds none of them running. They are kfrun's children, not ours:
  // their pidfds say when.
  const auto until = Clock::now() + std::chrono::seconds(5);
  for (const pid_t pid : killed) {
    const long fd = ::syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) continue;  // gone already (ESRCH), or no pidfds here: nothing to wait on
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    pollfd p{static_cast<int>(fd), POLLIN, 0};
    if (left > 0) ::poll(&p, 1, static_cast<int>(left));
    ::close(static_cast<int>(fd));
  }
}

// Writes settings[KEY] = VALUE (JSON when it parses as JSON, else a string) by compare-and-swap.
void write_setting(ConfigClient& c, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string key = assignment.substr(0, eq);
  auto value = parse_json_or_discard(assignment.substr(eq + 1));
  if (value.is_discarded()) value = assignment.substr(eq + 1);
  for (int attempt = 0;; ++attempt) {
    Cluster cur = c.get_cluster();
    cur.settings[key] = value;
    try {
      c.put_cluster(cur);
      return;
    } catch (const ConflictError&) {
      if (attempt >= 50) throw;
    }
  }
}

std::string Job::agent_output() const { return slurp(dir_ / "agent.out"); }
std::string Job::agent_errors() const { return slurp(dir_ / "agent.err"); }

}  // namespace kf::chaos
