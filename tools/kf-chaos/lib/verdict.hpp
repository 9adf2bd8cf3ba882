// SPDX-License-Identifier: Apache-2.0
// What kf-chaos concludes from the lines the job's workers printed (kfrun's tagged stdout).
// The program under test reports in three kinds of lines, which the repository's elastic test
// worker prints (docs/chaos.md, "What the program must print"):
//   final step=<S> workers=<N> hash=<HEX>   once, by every worker that finished the job
//   change <JSON>                            at every membership change it went through, with
//                                            "to_version", "kind", "commit" (the job's
//                                            committed steps; "join" and "left" records are
//                                            skipped: they count the worker's own) and
//                                            "sync_bytes"
//   BROKEN <what>                            a guarantee the worker checks itself broke (every
//                                            sample of an epoch used once, its own step never
//                                            behind its last commit)
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kf::chaos {

struct Verdict {
  bool pass = false;
  std::vector<std::string> problems;  ///< one sentence each; empty when pass
  int finals = 0;                     ///< "final" lines
  int final_workers = 0;              ///< the N they state
  std::int64_t final_step = -1;
  std::string hash;
  int changes = 0;                ///< distinct cluster versions seen in "change" lines
  std::int64_t last_commit = -1;  ///< the commit of the newest of them
  /// Each survivor's pause in each recovery from a failure: from the moment it saw the failure
  /// to its first step in the new cluster ("detected_us" to "resumed_us" of its "recovery"
  /// records), in milliseconds, in the order printed. `overlapping_pauses` are those of
  /// recoveries that removed more than one worker at once (failures that overlapped).
  std::vector<double> recovery_pauses_ms;
  std::vector<double> overlapping_pauses_ms;
};

/// The p-th percentile (0-100) of `ms` by the nearest rank; 0 for none.
double percentile(std::vector<double> ms, double p);

/// Checks the workers' report lines in `output`: at least one "final" line; all of them with
/// the same step and hash, and as many as the workers they state; no "BROKEN" line; the commits
/// of the changes (at each version the newest any worker had), in the order of their versions,
/// never going back, a worker behind that commit receiving the state ("sync_bytes" above 0),
/// and none past the final step. Lines it does not know are
/// skipped; a report line it cannot read is a problem.
Verdict judge(std::string_view output);

}  // namespace kf::chaos
