// SPDX-License-Identifier: Apache-2.0
// The built-in monitors of a Session (docs/monitoring.md, "The monitors in a job"): step time and
// throughput, communication time and bandwidth, and the gradient noise scale (docs/monitoring.md
// gives the estimators). Each worker measures its step into a StepReport; the Session sends the
// report's words in the step's control collective, and every worker feeds the same allgathered
// words, in rank order, to its StepMonitor. So every worker computes bit-identical metrics, and
// policies decide the same on every worker.
//
// The metrics it publishes (names policies read through PolicyContext::metric):
//   step_time, step_time_ema (s); samples (job samples of the step); throughput (job samples/s,
//   ratio of sums over a window that restarts after a membership change);
//   throughput_per_worker (the same for one worker's samples: the mean worker);
//   comm_time (s per step in gradient allreduce), comm_bytes (bytes per worker per step),
//   algbw (comm_bytes / comm_time, bytes/s; absent when no time was measured);
//   gns.valid (0/1), gns.sqr, gns.tr_sigma, gns.b_simple (absent when the noise dominates: then
//   gns.noise_dominated is 1), gns.step_sqr, gns.step_tr_sigma (this step's raw estimates),
//   gns.skipped (1 when the step's gradient was not finite on some worker).
// Thread-safety: one owner (the training thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace kf {

namespace monitor {
class GnsEstimator;
class ThroughputWindow;
class StepTimeEma;
}  // namespace monitor

/// One worker's measurements of one step.
struct StepReport {
  double step_time = 0;      ///< s, from the end of the last boundary to this one
  double samples = 0;        ///< samples this worker trained on in the step
  double local_sqnorm = 0;   ///< Σ |g_j|² of this worker's micro-batch gradients (before reduce)
  double global_sqnorm = 0;  ///< |ḡ|² of the averaged gradient (the same on every worker)
  double local_batch = 0;    ///< b: samples per micro-batch gradient
  double micro_batches = 0;  ///< s: micro-batch gradients in local_sqnorm (0: none reported)
  double nonfinite = 0;      ///< 1 when this worker's gradient held a NaN or Inf
  double comm_time = 0;      ///< s spent in gradient allreduce
  double comm_bytes = 0;     ///< bytes allreduced
  double compute_time = 0;   ///< s this worker computed (Session::report_compute; 0: unknown)
};

struct StepMonitorOptions {
  /// M0 of the GNS operator: the global batch the base learning rate was tuned for. 0: the
  /// job's batch the first time gradients are reported.
  double base_batch = 0;
  /// θ0 of the GNS averages (θ = θ0^(M/M0)). The estimate is valid after about
  /// 1/(1 − θ0) base-batch steps and 20 effective ones, so 0.999 waits ~1000 steps;
  /// a short job or a test takes a smaller one (it must stay above 0.95 for 20 effective steps).
  double gns_theta = 0.999;
  /// Steps in the throughput window, and the steps discarded after a restart.
  std::size_t window_steps = 20;
  std::size_t warmup_steps = 2;
};

class StepMonitor {
 public:
  /// Words (doubles) of a report in the control record.
  static constexpr std::size_t kWords = 10;

  /// The samples and compute time of rank `rank`'s report in allgathered records (as update()
  /// takes them): what balanced batches weigh each worker by (Session::batch_part).
  static std::pair<double, double> samples_and_compute(std::span<const std::int64_t> all,
                                                       std::size_t stride, std::size_t offset,
                                                       int rank) noexcept;

  explicit StepMonitor(StepMonitorOptions options = {});
  ~StepMonitor();
  StepMonitor(const StepMonitor&) = delete;
  StepMonitor& operator=(const StepMonitor&) = delete;

  /// Writes `report` into kWords words (a double's bits each).
  static void pack(const StepReport& report, std::span<std::int64_t> words) noexcept;

  /// Takes the step: `all` holds `workers` records of `stride` words, this monitor's words at
  /// `offset` in each. Replaces the metrics it publishes in `metrics` (others are left alone).
  /// Returns a line to log once when the GNS estimate cannot be formed (one worker without
  /// accumulation), else nothing.
  std::optional<std::string> update(std::span<const std::int64_t> all, std::size_t stride,
                                    std::size_t offset, int workers,
                                    std::map<std::string, double>& metrics);

  /// After a membership change: the throughput window starts again (its steps measured another
  /// cluster); the GNS averages stay (they are in batch-invariant units).
  void membership_changed() noexcept;

 private:
  /// update()'s gradient noise scale part, once every worker reported its gradient norms:
  /// `sum` holds the record's words summed over the workers, `put` publishes a metric.
  template <typename Put>
  std::optional<std::string> update_gns(const double* sum, double global_sqnorm, int workers,
                                        Put& put);

  StepMonitorOptions options_;
  std::unique_ptr<monitor::GnsEstimator> gns_;
  std::unique_ptr<monitor::ThroughputWindow> window_;
  std::unique_ptr<monitor::StepTimeEma> ema_;
  bool said_single_ = false;
};

/// Σ x² of `values`: float partial sums over blocks of 1024 values added in double (relative
/// error about 1e-6). The order is fixed, so equal values give the same bits on every worker.
double squared_norm(std::span<const float> values) noexcept;
/// Multiplies each value by `factor` and returns Σ x² of the results, in one pass.
double scale_and_squared_norm(std::span<float> values, float factor) noexcept;
/// dst[i] = src[i] × factor (over the shorter length), returning Σ src[i]², in one pass: the
/// copies a gradient exchange makes anyway take the norms for free.
double copy_scaled(std::span<const float> src, std::span<float> dst, float factor) noexcept;

}  // namespace kf
