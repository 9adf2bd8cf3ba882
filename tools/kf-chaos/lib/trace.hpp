// SPDX-License-Identifier: Apache-2.0
// Availability traces for kf-replay: CSV rows "t_ms,add|remove,node", the shape public
// spot-instance traces come in (a node appears, a node is taken away), and the job sizes they
// give once scaled to this machine. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kf::chaos {

/// A trace that cannot be used: the message starts with "NAME:LINE: ".
class TraceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TraceEvent {
  std::int64_t t_ms = 0;
  bool add = true;
  std::string node;
};

/// Reads a trace. Blank lines and lines starting with '#' are skipped; a first row whose time
/// is not a number ("t_ms,action,node") is a header. Every row has three fields: a time in
/// milliseconds (0 or more, never before the row above), "add" or "remove", and a node name
/// (printable ASCII, no spaces). A node is added only while it is not up, and removed only
/// while it is. Throws: TraceError naming `name`, the line and what is wrong; also for a trace
/// without rows or one whose nodes are never up.
std::vector<TraceEvent> parse_trace(std::istream& in, const std::string& name);

/// The job size over time: from `at_ms` on (scaled by --speed, in the replay's milliseconds)
/// the job should have `workers`.
struct SizeStep {
  std::int64_t at_ms = 0;
  int workers = 1;
  int nodes = 0;  ///< nodes up in the trace then
};

/// The sizes a trace asks for: the nodes up at each time, scaled so that the most nodes ever up
/// become `max_workers` (round to nearest; no scaling when the trace never has more), at least
/// one worker (a job cannot have none), times counted from the first row and divided by
/// `speed`. Only changes of size make a step; the first step is at 0. Throws: std::invalid_argument
/// for max_workers < 1 or speed <= 0.
std::vector<SizeStep> size_steps(const std::vector<TraceEvent>& trace, int max_workers,
                                 double speed);

/// The most nodes up at once.
int peak_nodes(const std::vector<TraceEvent>& trace);

}  // namespace kf::chaos
