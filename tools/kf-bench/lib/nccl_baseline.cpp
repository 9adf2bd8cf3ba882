// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/nccl_baseline.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "config.hpp"
#include "device/device_api.hpp"
#include "kf-bench/lib/parse.hpp"
#include "kf-bench/lib/stats.hpp"
#include "kf/common/error.hpp"
#include "kf/peer.hpp"

#if KF_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace kf::tools::bench {

#if KF_HAVE_NCCL

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;

void nccl_check(const char* what, ncclResult_t r) {
  if (r != ncclSuccess) {
    throw Error(make_error_code(errc::device_error),
                std::string(what) + ": " + ncclGetErrorString(r));
  }
}

class Baseline {
 public:
  Baseline(Peer& peer, detail::DeviceApi& dev) : peer_(peer), dev_(dev) {
    stream_ = dev_.create_stream();
  }
  ~Baseline() {
    if (comm_) (void)ncclCommDestroy(comm_);
    dev_.destroy_stream(stream_);
  }
  Baseline(const Baseline&) = delete;
  Baseline& operator=(const Baseline&) = delete;

  // Raw NCCL's communicator: the unique id through a kf broadcast, then a blocking init.
  double init_raw() {
    const auto t0 = Clock::now();
    ncclUniqueId id{};
    if (peer_.rank() == 0) nccl_check("ncclGetUniqueId", ncclGetUniqueId(&id));
    peer_.broadcast("nccl-baseline/id", Buffer{&id, sizeof id, DType::u8, Device::cpu}).wait();
    nccl_check("ncclCommInitRank", ncclCommInitRank(&comm_, peer_.size(), id, peer_.rank()));
    return Ms(Clock::now() - t0).count();
  }

  // One block of `n` iterations; per-iteration local times in `times` (appended).
  void block(bool kf, std::size_t count, void* buf, int n, std::vector<double>& times) {
    for (int i = 0; i < n; ++i) {
      peer_.barrier("nccl-baseline/b#" + std::to_string(seq_++)).wait();
      const std::string name = "nccl-baseline/ar";
      const auto t0 = Clock::now();
      if (kf) {
        CollOptions o;
        o.stream = stream_;
        const Buffer b{buf, count, DType::f32, Device::cuda};
        peer_.allreduce(name, b, b, o).wait();
      } else {
        nccl_check("ncclAllReduce", ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm_,
                                                  static_cast<cudaStream_t>(stream_)));
        dev_.synchronize(stream_);
      }
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }

  // Checked once per round: the buffer filled with rank + 1, one allreduce, every element the
  // sum over the workers.
  void fill(void* buf, std::size_t count) {
    std::vector<float> h(count, static_cast<float>(peer_.rank() + 1));
    dev_.copy(buf, h.data(), count * sizeof(float), stream_);
    dev_.synchronize(stream_);
  }
  bool summed(const void* buf, std::size_t count) {
    std::vector<float> h(count);
    dev_.copy(h.data(), buf, count * sizeof(float), stream_);
    dev_.synchronize(stream_);
    const float want = static_cast<float>(peer_.size() * (peer_.size() + 1) / 2);
    for (float x : h) {
      if (x != want) return false;
    }
    return true;
  }

  // The maxima across workers of each iteration's time.
  std::vector<double> across(std::vector<double> t) {
    CollOptions mx;
    mx.op = ReduceOp::max;
    peer_
        .allreduce("nccl-baseline/max#" + std::to_string(seq_++), buffer(t.data(), t.size()),
                   buffer(t.data(), t.size()), mx)
        .wait();
    return t;
  }
  double max_across(double v) { return across({v}).front(); }

 private:
  Peer& peer_;
  detail::DeviceApi& dev_;
  void* stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::uint64_t seq_ = 0;
};

bool run(Peer& peer, detail::DeviceApi& dev, const BaselineOptions& o, std::ostream& out) {
  const bool printer = peer.rank() == 0;
  const int p = peer.size();
  Baseline b(peer, dev);
  bool ok = true;
  std::size_t largest = 4;
  for (std::size_t s : o.sizes) largest = std::max(largest, s);
  void* buf = dev.alloc_device(largest);
  // Making the communicators: raw first, then kf's (its first device allreduce makes it).
  const double raw_init = b.max_across(b.init_raw());
  b.fill(buf, 1);
  std::vector<double> first;
  b.block(true, 1, buf, 1, first);
  const double kf_init = b.max_across(first.front() / 1000.0);
  if (printer) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "# kf-bench nccl-baseline: %d workers, f32 sum, %s, kf backend %s\n"
                  "# communicator: raw id broadcast + ncclCommInitRank %.1f ms; kf's first "
                  "allreduce (makes it) %.1f ms\n",
                  p, dev.name().c_str(), peer.device_backend().c_str(), raw_init, kf_init);
    out << line;
    out << "# per size: " << o.rounds << " rounds of " << o.iters
        << " raw then kf iterations; medians of the per-iteration maxima across workers\n";
    out << "#    bytes  raw_us  kf_us  kf/raw  raw_busbw  kf_busbw  spread  correct\n";
  }
  for (std::size_t bytes : o.sizes) {
    const std::size_t count = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<double> raw, kf, ratios;
    std::vector<double> scratch;
    b.block(false, count, buf, o.warmup, scratch);
    b.block(true, count, buf, o.warmup, scratch);
    bool right = true;
    for (int r = 0; r < o.rounds; ++r) {
      std::vector<double> tr, tk;
      b.fill(buf, count);
      b.block(false, count, buf, 1, scratch);
      right = b.summed(buf, count) && right;
      b.fill(buf, count);
      b.block(true, count, buf, 1, scratch);
      right = b.summed(buf, count) && right;
      b.block(false, count, buf, o.iters, tr);
      b.block(true, count, buf, o.iters, tk);
      tr = b.across(tr);
      tk = b.across(tk);
      ratios.push_back(quantile(tk, 0.5) / quantile(tr, 0.5));
      raw.insert(raw.end(), tr.begin(), tr.end());
      kf.insert(kf.end(), tk.begin(), tk.end());
    }
    std::int32_t all_right = right ? 1 : 0;
    CollOptions mn;
    mn.op = ReduceOp::min;
    peer.allreduce("nccl-baseline/ok", buffer(&all_right, 1), buffer(&all_right, 1), mn).wait();
    ok = ok && all_right == 1;
    if (printer) {
      const double rm = quantile(raw, 0.5), km = quantile(kf, 0.5);
      const double moved = static_cast<double>(count * sizeof(float));
      const double bus = bus_factor(CollOp::allreduce, p);
      double lo = ratios.front(), hi = ratios.front();
      for (double x : ratios) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      char line[256];
      std::snprintf(line, sizeof line, "%10zu %7.1f %6.1f %7.3f %10.2f %9.2f %3.3f-%.3f %s\n",
                    count * sizeof(float), rm, km, km / rm, moved / (rm * 1e-6) / 1e9 * bus,
                    moved / (km * 1e-6) / 1e9 * bus, lo, hi, all_right == 1 ? "yes" : "NO");
      out << line << std::flush;
    }
  }
  dev.free_device(buf);
  return ok;
}

// --shrink: the last worker leaves; the survivors' first allreduce on the new version (kf
// shrinks its communicator first) against their second.
bool shrink(Peer& peer, detail::DeviceApi& dev, std::ostream& out) {
  const int p = peer.size();
  Cluster next = peer.cluster();
  next.version += 1;
  next.workers.pop_back();
  peer.barrier("nccl-baseline/before-shrink").wait();
  if (peer.rank() == p - 1) return true;  // leaves: its peer (and communicator) go away
  peer.update(next);
  void* stream = dev.create_stream();
  void* buf = dev.alloc_device(1 << 20);
  std::vector<float> h(1 << 18, 1.0f);
  dev.copy(buf, h.data(), h.size() * sizeof(float), stream);
  dev.synchronize(stream);
  CollOptions o;
  o.stream = stream;
  const Buffer b{buf, h.size(), DType::f32, Device::cuda};
  auto t0 = Clock::now();
  peer.allreduce("nccl-baseline/after-shrink", b, b, o).wait();
  const double first = Ms(Clock::now() - t0).count();
  t0 = Clock::now();
  peer.allreduce("nccl-baseline/after-shrink", b, b, o).wait();
  const double second = Ms(Clock::now() - t0).count();
  dev.free_device(buf);
  dev.destroy_stream(stream);
  double t[2] = {first, second};
  CollOptions mx;
  mx.op = ReduceOp::max;
  peer.allreduce("nccl-baseline/shrink-times", buffer(t, 2), buffer(t, 2), mx).wait();
  if (peer.rank() == 0) {
    char line[200];
    std::snprintf(line, sizeof line,
                  "# shrink %d -> %d workers: first allreduce of 1 MiB after it %.2f ms, the next "
                  "%.2f ms\n",
                  p, p - 1, t[0], t[1]);
    out << line;
  }
  return true;
}

}  // namespace

int run_nccl_baseline(const BaselineOptions& o, std::ostream& out, std::ostream& err) noexcept {
  int rank = -1;
  try {
    std::string why;
    auto dev = detail::cuda_device_api(why);
    if (!dev) {
      err << "kf-bench nccl-baseline: " << why << std::endl;
      return 1;
    }
    const auto peer = Peer::from_environment();
    rank = peer->rank();
    bool ok = run(*peer, *dev, o, out);
    if (o.shrink && peer->size() >= 3) ok = shrink(*peer, *dev, out) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    err << "kf-bench nccl-baseline: rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
}

#else

int run_nccl_baseline(const BaselineOptions&, std::ostream&, std::ostream& err) noexcept {
  err << "kf-bench nccl-baseline: this build of kf has no NCCL (configure with -Dnccl=enabled "
         "where NCCL is installed)"
      << std::endl;
  return 1;
}

#endif

}  // namespace kf::tools::bench
