// SPDX-License-Identifier: Apache-2.0
// A job's progress over wall-clock time, from the metrics lines its rank 0 appends
// (KF_METRICS_JSONL: {"step": S, "time": "RFC 3339", "metrics": {"kf_batch_size": B, ...}}),
// for kf-replay. Work is counted as the job commits it: a rollback after a failure takes the
// lost steps off again. It is counted in samples where every line states the global batch
// (kf_batch_size: a job whose settings carry batch_size), else in steps. Thread-safety: pure
// functions and value types.
#pragma once

#include <cstdint>
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

/// Steps taken back by rollbacks (a line whose step is below the line before it) at Unix times
/// in (t0, t1] (ms): the work a failure lost, in steps.
std::int64_t steps_rolled_back(const Progress& p, std::int64_t t0_ms, std::int64_t t1_ms);

/// Parses "YYYY-MM-DDTHH:MM:SS.mmmZ" (what the metrics writer writes) into Unix milliseconds;
/// -1 for anything else.
std::int64_t parse_utc_ms(std::string_view text);

}  // namespace kf::chaos
