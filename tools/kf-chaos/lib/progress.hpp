// SPDX-License-Identifier: Apache-2.0
// A job's progress over wall-clock time, from the metrics lines its rank 0 appends
// (KF_METRICS_JSONL: {"step": S, "time": "RFC 3339", "metrics": {"kf_global_batch_size": B, ...}}),
// for kf-replay. Work is counted as the job commits it: a rollback after a failure takes the
// lost steps off again. It is counted in samples where every line states the global batch
// (kf_global_batch_size: a job whose settings carry batch_size), else in steps. Thread-safety: pure
// functions and value types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

namespace kf::chaos {

struct ProgressPoint {
  std::int64_t time_ms = 0;  ///< Unix time of the line, milliseconds
  std::int64_t step = 0;
  int workers = 0;
  double work = 0;  ///< committed work since the first line, as of this one (Progress::unit)
};

struct Progress {
  std::vector<ProgressPoint> points;  ///< in file order
  bool in_samples = false;            ///< work in samples (else in steps)
  const char* unit() const noexcept { return in_samples ? "samples" : "steps"; }
};

/// The points of `jsonl`, with work summed: each line adds (its step − the last line's step),
/// times its batch size when counting samples (negative after a rollback). Lines that are not
/// such records (a torn last line, another program's) are skipped.
Progress read_progress(std::string_view jsonl);

/// Work committed between Unix times t0 and t1 (ms): the last point at or before t1 less the
/// last at or before t0 (0 before the first point).
double work_between(const Progress& p, std::int64_t t0_ms, std::int64_t t1_ms);

/// The work the job would have committed between Unix times t0 and t1 (ms) at the sizes it
/// actually ran with, at `rate` (work per second for each size): each stretch between two lines
/// counts at the size of the later line (the one that ended it); a stretch at a size `rate` lacks
/// counts nothing. Set beside work_between, it leaves out how long changes took to take effect
/// and keeps what the job lost while it ran (pauses, rollbacks).
double work_at_sizes(const Progress& p, const std::map<int, double>& rate, std::int64_t t0_ms,
                     std::int64_t t1_ms);

/// How long after Unix time `from_ms` the job first ran with `workers` (the time of the first
/// line in [from_ms, until_ms] with that size, less `from_ms`), or nullopt when no line says so.
std::optional<std::int64_t> in_effect_after(const Progress& p, std::int64_t from_ms,
                                            std::int64_t until_ms, int workers);

/// Steps taken back by rollbacks (a line whose step is below the line before it) at Unix times
/// in (t0, t1] (ms): the work a failure lost, in steps.
std::int64_t steps_rolled_back(const Progress& p, std::int64_t t0_ms, std::int64_t t1_ms);

/// Parses "YYYY-MM-DDTHH:MM:SS.mmmZ" (what the metrics writer writes) into Unix milliseconds;
/// -1 for anything else.
std::int64_t parse_utc_ms(std::string_view text);

}  // namespace kf::chaos
