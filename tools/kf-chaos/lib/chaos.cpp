// SPDX-License-Identifier: Apache-2.0
#include "kf-chaos/lib/chaos.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
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

#include "kf-chaos/lib/verdict.hpp"
#include "kf-member/lib/commands.hpp"
#include "kf/common/env.hpp"
#include "kf/runtime/config_client.hpp"
#include "kfrun/lib/ports.hpp"
#include "kfrun/lib/private_dir.hpp"
#include "kfrun/lib/worker_env.hpp"

extern char** environ;

namespace kf::chaos {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::array<std::pair<Kind, std::string_view>, 6> kKindNames{{
    {Kind::add, "add"},
    {Kind::revoke, "revoke"},
    {Kind::kill, "kill"},
    {Kind::stop, "stop"},
    {Kind::server_restart, "server-restart"},
    {Kind::agent_restart, "agent-restart"},
}};

// Starts argv with stdin on /dev/null and stdout, stderr appended to `out`, `err`.
pid_t spawn(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err) {
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
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, c_argv[0], &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
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

// Whether `pid` runs (not gone, not a zombie).
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

// The job: its directory, config service and agent.
class Job {
 public:
  Job(const Options& o, fs::path dir) : o_(o), dir_(std::move(dir)) {
    token_file_ = dir_ / "job.token";
    tools::write_token_file(token_file_, tools::random_hex(tools::kTokenBytes));
    token_ = read_token_file(token_file_.string());
    port_ = tools::pick_free_ports("127.0.0.1", tools::PortRange{}, 1).front();
    url_ = "http://127.0.0.1:" + std::to_string(port_);
  }
  ~Job() {
    stop(agent_, SIGKILL);
    for (const auto& [w, pid] : pids_) {
      if (running(pid)) ::kill(pid, SIGKILL);
    }
    stop(server_, SIGKILL);
  }

  const std::string& url() const { return url_; }
  ConfigClient client() const { return ConfigClient(url_, token_); }

  // Starts the config service and waits until it answers.
  void start_server() {
    server_ =
        spawn({o_.config_server, "--token-file", token_file_.string(), "--state",
               (dir_ / "state.json").string(), "--listen", "127.0.0.1:" + std::to_string(port_)},
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
          throw std::runtime_error("the config service exited with " + std::to_string(*code) +
                                   ": " + last_lines(slurp(dir_ / "server.err"), 5));
        }
        if (Clock::now() >= until) {
          throw std::runtime_error("the config service does not answer at " + url_ + ": " +
                                   e.what());
        }
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  void kill_server() { stop(server_, SIGKILL); }
  void stop_server() { stop(server_, SIGTERM); }

  void start_agent() {
    std::vector<std::string> argv{o_.kfrun,
                                  "--watch",
                                  "--config-server",
                                  url_,
                                  "--job-token-file",
                                  token_file_.string(),
                                  "--slots",
                                  std::to_string(o_.max_workers),
                                  "-np",
                                  std::to_string(o_.np),
                                  "--"};
    argv.insert(argv.end(), o_.command.begin(), o_.command.end());
    agent_ = spawn(argv, dir_ / "agent.out", dir_ / "agent.err");
  }
  void kill_agent() { stop(agent_, SIGKILL); }
  // kfrun's exit code once it exited by `until`.
  std::optional<int> agent_exit(Clock::time_point until) {
    if (agent_ <= 0) return agent_code_;
    auto code = wait_exit(agent_, until);
    if (code) {
      agent_ = 0;
      agent_code_ = code;
    }
    return code;
  }

  // The pids of the members of `c` that run now (from the agents' started and adopted events).
  std::map<std::string, pid_t> live_members(const Cluster& c) {
    refresh_pids();
    std::map<std::string, pid_t> live;
    for (const auto& w : c.workers) {
      const auto it = pids_.find(w.endpoint.str());
      if (it != pids_.end() && running(it->second)) live.emplace(it->first, it->second);
    }
    return live;
  }
  // Learns the pids of the workers started since the last call.
  void refresh_pids() {
    const std::regex pid_re(R"(pid (\d+))");
    for (const auto& e : client().get_events(last_seq_)) {
      last_seq_ = std::max(last_seq_, e.seq);
      std::smatch m;
      if ((e.type == "started" || e.type == "adopted") && std::regex_search(e.detail, m, pid_re)) {
        pids_[e.worker] = std::stoi(m[1]);
      }
    }
  }
  // Every worker ever started, with kill -9 (the agent is gone by then).
  void kill_workers() {
    try {
      refresh_pids();
    } catch (const std::exception&) {
      // The service is down: the pids known so far are all there is.
    }
    for (const auto& [w, pid] : pids_) {
      if (running(pid)) ::kill(pid, SIGKILL);
    }
  }

  std::string agent_output() const { return slurp(dir_ / "agent.out"); }
  std::string agent_errors() const { return slurp(dir_ / "agent.err"); }

 private:
  static void stop(pid_t& pid, int sig) {
    if (pid <= 0) return;
    ::kill(pid, sig);
    if (!wait_exit(pid, Clock::now() + std::chrono::seconds(10))) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = 0;
  }

  const Options& o_;
  fs::path dir_;
  fs::path token_file_;
  std::string token_;
  std::uint16_t port_ = 0;
  std::string url_;
  pid_t server_ = 0;
  pid_t agent_ = 0;
  std::optional<int> agent_code_;
  std::uint64_t last_seq_ = 0;
  std::map<std::string, pid_t> pids_;  // every worker ever started, by endpoint
};

std::int64_t draw(std::mt19937_64& gen, const MsRange& r) {
  return std::uniform_int_distribution<std::int64_t>(r.lo, r.hi)(gen);
}

// Writes settings[KEY] = VALUE (JSON when it parses as JSON, else a string) by compare-and-swap.
void write_setting(ConfigClient& c, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const std::string key = assignment.substr(0, eq);
  auto value = nlohmann::json::parse(assignment.substr(eq + 1), nullptr, false);
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
      throw std::invalid_argument("--kinds: unknown event '" + std::string(item) +
                                  "' (add, revoke, kill, stop, server-restart, agent-restart)");
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
  std::optional<tools::PrivateDir> own_dir;
  fs::path dir;
  if (o.dir) {
    dir = *o.dir;
    fs::create_directories(dir);
  } else {
    own_dir.emplace();
    dir = own_dir->path();
  }
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
    Job job(o, dir);
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
      std::vector<Kind> can;
      for (const Kind k : o.kinds) {
        const bool shrinks = k == Kind::revoke || k == Kind::kill || k == Kind::stop;
        if (k == Kind::add && c.size() >= o.max_workers) continue;
        if (shrinks && static_cast<int>(live.size()) <= o.min_workers) continue;
        can.push_back(k);
      }
      if (can.empty()) {
        out << stamp() << "no event fits (" << c.size() << " members, " << live.size()
            << " running)" << std::endl;
        continue;
      }
      const Kind k = can[std::uniform_int_distribution<std::size_t>(0, can.size() - 1)(gen)];
      ++counts[k];
      auto victim = live.begin();
      std::advance(victim, static_cast<std::ptrdiff_t>(std::uniform_int_distribution<std::size_t>(
                               0, live.empty() ? 0 : live.size() - 1)(gen)));
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
  if (problems.empty()) {
    out << "kf-chaos: PASS: identical parameters, nothing committed lost, every sample used "
           "once per epoch (checked by the workers), no hang"
        << std::endl;
    return 0;
  }
  for (const auto& p : problems) out << "kf-chaos: FAIL: " << p << std::endl;
  if (own_dir) {
    // Kept for a look: the agent's and the service's output.
    const fs::path kept = fs::temp_directory_path() /
                          ("kf-chaos-" + std::to_string(o.seed) + "-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::rename(dir, kept, ec);
    if (!ec) out << "kf-chaos: the job's output is in " << kept.string() << std::endl;
  } else {
    out << "kf-chaos: the job's output is in " << dir.string() << std::endl;
  }
  return 1;
}

}  // namespace kf::chaos
