// SPDX-License-Identifier: Apache-2.0
// kf-chaos: runs an elastic job on this host (a kf-config-server and one `kfrun --watch` agent,
// both its own children) and, with a seed, throws random membership churn at it while it trains:
// workers added, revoked with a notice, killed with kill -9, stopped with SIGSTOP for a while;
// the config service and the agent killed and started again. Then it lets the job finish and
// checks the elastic guarantees from what the workers printed (verdict.hpp). One line per event,
// then a summary. Thread-safety: run() is called by one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace kf::chaos {

/// The kinds of event, as named on the command line.
/// double_kill: `kill -9` of two workers at once (overlapping failures). burst: `kill -9` of two
/// or three workers one after the other within 100 ms, as spot machines are reclaimed in waves
/// (a loss that meets a recovery under way); not among the default kinds.
enum class Kind { add, revoke, kill, double_kill, stop, server_restart, agent_restart, burst };
std::string_view name_of(Kind k) noexcept;
/// Parses a comma-separated list of kinds ("add,kill"). Throws: std::invalid_argument naming an
/// unknown one.
std::vector<Kind> parse_kinds(std::string_view text);

/// "A-B" (milliseconds, A <= B) or "A". Throws: std::invalid_argument.
struct MsRange {
  std::int64_t lo = 0, hi = 0;
  static MsRange parse(std::string_view text, std::string_view what);
};

struct Options {
  std::uint64_t seed = 0;
  int np = 2;           ///< initial workers
  int min_workers = 1;  ///< events never leave fewer live workers
  int max_workers = 4;  ///< nor more members
  int events = 10;
  MsRange interval{500, 2000};  ///< between events
  MsRange stop{200, 2000};      ///< how long a SIGSTOP lasts
  int notice_s = 2;             ///< revoke notice
  std::vector<Kind> kinds{Kind::add,  Kind::revoke,         Kind::kill,         Kind::double_kill,
                          Kind::stop, Kind::server_restart, Kind::agent_restart};
  /// After the last event: a setting written into the cluster document ("epochs=1") so that
  /// the program ends soon; none: the program ends by itself.
  std::optional<std::string> finish_with;
  std::chrono::seconds finish_timeout{120};  ///< after the last event; longer is a hang
  std::optional<std::filesystem::path> dir;  ///< work directory; default: a fresh private one
  std::string kfrun = "kfrun";
  std::string config_server = "kf-config-server";
  std::vector<std::string> command;  ///< the worker program and its arguments
};

/// Checks `o` (bounds, np within them, a command). Throws: std::invalid_argument saying what.
void check(const Options& o);

/// Runs the job and the events, writes the lines to `out`; returns 0 when every guarantee held,
/// 1 when one broke or the job hung or failed. Throws: std::runtime_error when the job cannot
/// be started (an executable missing, the config service not answering).
int run(const Options& o, std::ostream& out);

}  // namespace kf::chaos
