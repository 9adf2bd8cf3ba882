// SPDX-License-Identifier: Apache-2.0
#include "kf/runtime/step_monitor.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <string_view>
#include <vector>

#include "kf/monitor/gns.hpp"
#include "kf/monitor/throughput.hpp"

namespace kf {

namespace {

enum Word : std::size_t {
  kStepTime = 0,
  kSamples,
  kLocalSqnorm,
  kGlobalSqnorm,
  kLocalBatch,
  kMicroBatches,
  kNonfinite,
  kCommTime,
  kCommBytes,
  kComputeTime,
};
static_assert(kComputeTime + 1 == StepMonitor::kWords);

// The metrics the monitor owns.
enum Owned : std::size_t {
  kOutStepTime,
  kOutStepTimeEma,
  kOutSamples,
  kOutThroughput,
  kOutThroughputPerWorker,
  kOutCommTime,
  kOutCommBytes,
  kOutAlgbw,
  kOutGnsValid,
  kOutGnsSqr,
  kOutGnsTrSigma,
  kOutGnsBSimple,
  kOutGnsNoiseDominated,
  kOutGnsStepSqr,
  kOutGnsStepTrSigma,
  kOutGnsSkipped,
};
constexpr std::array<std::string_view, 16> kOwned = {
    "step_time",
    "step_time_ema",
    "samples",
    "throughput",
    "throughput_per_worker",
    "comm_time",
    "comm_bytes",
    "algbw",
    "gns.valid",
    "gns.sqr",
    "gns.tr_sigma",
    "gns.b_simple",
    "gns.noise_dominated",
    "gns.step_sqr",
    "gns.step_tr_sigma",
    "gns.skipped",
};
static_assert(kOwned.size() == kOutGnsSkipped + 1);

// The same as strings, made once (map look-ups without allocating).
const std::array<std::string, kOwned.size()>& owned_names() {
  static const auto names = [] {
    std::array<std::string, kOwned.size()> a;
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::string(kOwned[i]);
    return a;
  }();
  return names;
}

}  // namespace

namespace {

// Blocks of 1024 values are summed in 16 float lanes (independent, so the compiler vectorizes
// them) and each block's lanes are added into a double: a pass as fast as memory allows, with a
// relative error of about 1e-6, in a fixed order (equal inputs give equal bits). With Write,
// `dst` receives src × factor; the sum is of the squares of src, or of what was written when
// OfOutput.
template <bool Write, bool OfOutput>
double norm_pass(const float* src, float* dst, std::size_t n, float factor) noexcept {
  constexpr std::size_t kLanes = 16, kBlock = 1024;
  const std::size_t whole = n - n % kLanes;
  double total = 0;
  std::size_t i = 0;
  while (i < whole) {
    float acc[kLanes] = {};
    const std::size_t end = std::min(whole, i + kBlock);
    for (; i < end; i += kLanes) {
      for (std::size_t k = 0; k < kLanes; ++k) {
        const float x = src[i + k];
        const float y = x * factor;
        acc[k] += OfOutput ? y * y : x * x;
        if constexpr (Write) dst[i + k] = y;
      }
    }
    double block = 0;
    for (float a : acc) block += a;
    total += block;
  }
  for (; i < n; ++i) {
    const float y = src[i] * factor;
    total += OfOutput ? static_cast<double>(y) * y : static_cast<double>(src[i]) * src[i];
    if constexpr (Write) dst[i] = y;
  }
  return total;
}

}  // namespace

double squared_norm(std::span<const float> values) noexcept {
  return norm_pass<false, false>(values.data(), nullptr, values.size(), 1.0f);
}

double scale_and_squared_norm(std::span<float> values, float factor) noexcept {
  return norm_pass<true, true>(values.data(), values.data(), values.size(), factor);
}

double copy_scaled(std::span<const float> src, std::span<float> dst, float factor) noexcept {
  return norm_pass<true, false>(src.data(), dst.data(), std::min(src.size(), dst.size()), factor);
}

StepMonitor::StepMonitor(StepMonitorOptions options)
    : options_(options),
      window_(std::make_unique<monitor::ThroughputWindow>(
          monitor::ThroughputWindowOptions{options.window_steps, options.warmup_steps})),
      ema_(std::make_unique<monitor::StepTimeEma>()) {}

StepMonitor::~StepMonitor() = default;

void StepMonitor::pack(const StepReport& r, std::span<std::int64_t> words) noexcept {
  const double v[kWords] = {r.step_time,   r.samples,       r.local_sqnorm, r.global_sqnorm,
                            r.local_batch, r.micro_batches, r.nonfinite,    r.comm_time,
                            r.comm_bytes,  r.compute_time};
  for (std::size_t i = 0; i < kWords && i < words.size(); ++i) {
    words[i] = std::bit_cast<std::int64_t>(v[i]);
  }
}

void StepMonitor::membership_changed() noexcept { window_->restart(); }

std::pair<double, double> StepMonitor::samples_and_compute(std::span<const std::int64_t> all,
                                                           std::size_t stride, std::size_t offset,
                                                           int rank) noexcept {
  const std::size_t at = static_cast<std::size_t>(rank) * stride + offset;
  return {std::bit_cast<double>(all[at + kSamples]), std::bit_cast<double>(all[at + kComputeTime])};
}

std::optional<std::string> StepMonitor::update(std::span<const std::int64_t> all,
                                               std::size_t stride, std::size_t offset, int workers,
                                               std::map<std::string, double>& metrics) {
  const auto p = static_cast<std::size_t>(workers);
  const auto word = [&](std::size_t rank, Word w) {
    return std::bit_cast<double>(all[rank * stride + offset + w]);
  };
  // Sums in rank order: the same bits on every worker.
  double sum[kWords] = {};
  bool every_gradient = p > 0;
  for (std::size_t r = 0; r < p; ++r) {
    for (std::size_t w = 0; w < kWords; ++w) sum[w] += word(r, static_cast<Word>(w));
    every_gradient = every_gradient && word(r, kMicroBatches) > 0;
  }
  const double n = static_cast<double>(p);
  // This step's values, published into `metrics` at the end: the keys are assigned in place
  // (no allocation once they exist) and those without a value this step are removed.
  std::array<std::optional<double>, kOwned.size()> out;
  const auto put = [&](Owned key, double value) { out[key] = value; };
  struct Publish {
    decltype(out)& values;
    std::map<std::string, double>& metrics;
    ~Publish() {
      for (std::size_t k = 0; k < values.size(); ++k) {
        const std::string& name = owned_names()[k];
        if (!values[k]) {
          metrics.erase(name);
        } else if (auto it = metrics.find(name); it != metrics.end()) {
          it->second = *values[k];
        } else {
          metrics.emplace(name, *values[k]);
        }
      }
    }
  } publish{out, metrics};

  // Step time and throughput. The job's step takes as long as its slowest worker; the
  // mean over workers is within the boundary's wait of it and is what every worker can agree on.
  const double step_time = sum[kStepTime] / n;
  const double samples = sum[kSamples];
  put(kOutStepTime, step_time);
  put(kOutSamples, samples);
  ema_->record(monitor::Seconds(step_time));
  if (const double e = ema_->step_time().count(); std::isfinite(e)) put(kOutStepTimeEma, e);
  if (samples > 0) {
    window_->record(monitor::StepSample{samples, samples / n, monitor::Seconds(step_time)});
    if (window_->steps() > 0) {
      put(kOutThroughput, window_->job_samples_per_second());
      put(kOutThroughputPerWorker, window_->worker_samples_per_second());
    }
  }

  // Communication.
  const double comm_time = sum[kCommTime] / n;
  const double comm_bytes = sum[kCommBytes] / n;
  put(kOutCommTime, comm_time);
  put(kOutCommBytes, comm_bytes);
  if (comm_time > 0 && comm_bytes > 0) put(kOutAlgbw, comm_bytes / comm_time);

  // Gradient noise scale: only when every worker reported its gradient norms.
  if (!every_gradient) return std::nullopt;
  // The reduced gradient's norm is identical on every worker after the reduce: rank 0's.
  return update_gns(sum, word(0, kGlobalSqnorm), workers, put);
}

template <typename Put>
std::optional<std::string> StepMonitor::update_gns(const double* sum, double global_sqnorm,
                                                   int workers, Put& put) {
  const double n = static_cast<double>(workers);
  const double micro = sum[kMicroBatches];  // n = K·s micro-batch gradients
  const double local_batch = sum[kLocalBatch] / n;
  const bool finite =
      sum[kNonfinite] == 0 && std::isfinite(sum[kLocalSqnorm]) && std::isfinite(sum[kGlobalSqnorm]);
  put(kOutGnsSkipped, finite ? 0.0 : 1.0);
  std::optional<std::string> said;
  if (micro < 2) {
    if (!said_single_) {
      said_single_ = true;
      said =
          "one worker without gradient accumulation gives no gradient noise scale estimate "
          "(it needs two micro-batch gradients per step)";
    }
    put(kOutGnsValid, 0);
    return said;
  }
  if (!gns_) {
    monitor::GnsOptions o;
    o.base_batch = options_.base_batch > 0 ? options_.base_batch : micro * local_batch;
    o.theta_base = options_.gns_theta;
    gns_ = std::make_unique<monitor::GnsEstimator>(o);
  }
  const double local = sum[kLocalSqnorm];
  const double global = global_sqnorm;
  monitor::GnsStep in;
  in.local_sqnorm_sum = std::span<const double>(&local, 1);
  in.global_sqnorm = std::span<const double>(&global, 1);
  in.workers = workers;
  in.accumulation_steps = static_cast<std::int64_t>(std::llround(micro / n));
  if (in.accumulation_steps < 1) in.accumulation_steps = 1;
  in.local_batch = local_batch;
  in.finite = finite;
  // Unequal accumulation counts are folded into K·s = micro: the estimator needs only n.
  if (static_cast<double>(in.workers * in.accumulation_steps) != micro) {
    in.workers = static_cast<std::int64_t>(micro);
    in.accumulation_steps = 1;
  }
  const monitor::GnsStepResult step = gns_->update(in);
  if (step.status == monitor::GnsStepStatus::accepted) {
    put(kOutGnsStepSqr, step.point.sqr);
    put(kOutGnsStepTrSigma, step.point.tr_sigma);
  }
  const monitor::GnsEstimate e = gns_->estimate();
  put(kOutGnsValid, e.valid ? 1.0 : 0.0);
  if (std::isfinite(e.read.sqr)) put(kOutGnsSqr, e.read.sqr);
  if (std::isfinite(e.read.tr_sigma)) put(kOutGnsTrSigma, e.read.tr_sigma);
  if (std::isinf(e.b_simple)) {
    put(kOutGnsNoiseDominated, 1);
  } else if (std::isfinite(e.b_simple)) {
    put(kOutGnsNoiseDominated, 0);
    put(kOutGnsBSimple, e.b_simple);
  }
  return said;
}

}  // namespace kf
