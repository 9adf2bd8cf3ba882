// SPDX-License-Identifier: Apache-2.0
// device-worker: every operation x dtype on device buffers, verified, in a worker started by
// kfrun (a static job). The backend is KF_DEVICE_BACKEND's (auto: NCCL where the build has it).
// Each worker checks every result against the exact expected values (small integers, exact in
// every dtype), and at the end all workers check that they hold bitwise identical results (a
// consensus over a hash of them). Prints "rank R of P: device ok backend=B ops=N" and exits 0,
// or names each wrong result on stderr and exits 1.
//   device-worker [--standin]   --standin: host memory stands in for the device (no GPU needed)
// Several workers on one GPU: each sets NCCL_HOSTID from its own address unless it is set, so
// that NCCL takes them for separate hosts (its socket transport on loopback).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "device/device_api.hpp"
#include "kf/common/dtype.hpp"
#include "kf/common/env.hpp"
#include "kf/peer.hpp"

namespace {

using kf::DType;

// Host values in double, to and from each dtype's bytes.
std::vector<std::byte> encode(const std::vector<double>& v, DType t) {
  std::vector<std::byte> out(v.size() * kf::dtype_bytes(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    void* at = out.data() + i * kf::dtype_bytes(t);
    switch (t) {
      case DType::f32: *static_cast<float*>(at) = static_cast<float>(v[i]); break;
      case DType::f64: *static_cast<double*>(at) = v[i]; break;
      case DType::f16:
        *static_cast<std::uint16_t*>(at) = kf::float_to_f16(static_cast<float>(v[i]));
        break;
      case DType::bf16:
        *static_cast<std::uint16_t*>(at) = kf::float_to_bf16(static_cast<float>(v[i]));
        break;
      case DType::i32: *static_cast<std::int32_t*>(at) = static_cast<std::int32_t>(v[i]); break;
      case DType::i64: *static_cast<std::int64_t*>(at) = static_cast<std::int64_t>(v[i]); break;
      case DType::u8: *static_cast<std::uint8_t*>(at) = static_cast<std::uint8_t>(v[i]); break;
    }
  }
  return out;
}

double decode(const std::byte* p, std::size_t i, DType t) {
  const void* at = p + i * kf::dtype_bytes(t);
  switch (t) {
    case DType::f32: return *static_cast<const float*>(at);
    case DType::f64: return *static_cast<const double*>(at);
    case DType::f16: return kf::f16_to_float(*static_cast<const std::uint16_t*>(at));
    case DType::bf16: return kf::bf16_to_float(*static_cast<const std::uint16_t*>(at));
    case DType::i32: return *static_cast<const std::int32_t*>(at);
    case DType::i64: return static_cast<double>(*static_cast<const std::int64_t*>(at));
    case DType::u8: return *static_cast<const std::uint8_t*>(at);
  }
  return 0;
}

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

class Worker {
 public:
  Worker(kf::Peer& peer, kf::detail::DeviceApi& api)
      : peer_(peer), api_(api), p_(peer.size()), r_(peer.rank()), stream_(api.create_stream()) {}
  ~Worker() { api_.destroy_stream(stream_); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int run() {
    for (DType t :
         {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{4099}, std::size_t{(1u << 20) + 3}}) {
        one_size(t, n);
      }
    }
    // Every worker holds the same results, bit for bit.
    bool same = false;
    peer_.consensus("hash", kf::Buffer{&hash_, sizeof hash_, DType::u8, kf::Device::cpu}, &same)
        .wait();
    check(same, "results differ between workers (hash consensus)");
    std::cout << "rank " << r_ << " of " << p_ << ": device " << (bad_ == 0 ? "ok" : "FAILED")
              << " backend=" << peer_.device_backend() << " ops=" << ops_ << std::endl;
    return bad_ == 0 ? 0 : 1;
  }

 private:
  struct Dev {
    kf::detail::DeviceApi* api;
    void* p;
    std::size_t n;
    DType t;
    Dev(kf::detail::DeviceApi& a, std::size_t count, DType type)
        : api(&a), p(a.alloc_device(count * kf::dtype_bytes(type) + 1)), n(count), t(type) {}
    ~Dev() { api->free_device(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    kf::Buffer buf() const { return kf::Buffer{p, n, t, kf::Device::cuda}; }
  };

  void put(Dev& d, const std::vector<double>& v) {
    const auto bytes = encode(v, d.t);
    api_.copy(d.p, bytes.data(), bytes.size(), stream_);
    api_.synchronize(stream_);
  }
  // A device buffer's bytes; those that every worker holds (`shared`) go into the hash.
  std::vector<std::byte> get(const Dev& d, bool shared) {
    std::vector<std::byte> out(d.n * kf::dtype_bytes(d.t));
    api_.copy(out.data(), d.p, out.size(), stream_);
    api_.synchronize(stream_);
    if (shared) hash_ = fnv1a(out.data(), out.size(), hash_);
    return out;
  }
  void check(bool ok, const std::string& what) {
    if (!ok) {
      std::cerr << "rank " << r_ << ": wrong result: " << what << "\n";
      ++bad_;
    }
  }
  // Compares a device buffer with want(i) for every element.
  template <typename F>
  void expect(const Dev& d, const std::string& what, F want, bool shared = true) {
    const auto got = get(d, shared);
    for (std::size_t i = 0; i < d.n; ++i) {
      const double w = want(i), g = decode(got.data(), i, d.t);
      if (g != w) {
        check(false, what + " at " + std::to_string(i) + ": " + std::to_string(g) +
                         " != " + std::to_string(w));
        return;
      }
    }
  }
  void run_op(const kf::Handle& h, const std::string& what) {
    ++ops_;
    const std::error_code ec = h.wait_status();
    check(!ec, what + ": " + h.message());
  }

  void one_size(DType t, std::size_t n) {
    const std::string id = std::string(kf::to_string(t)) + "/" + std::to_string(n);
    const bool floating = t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
    kf::CollOptions o;
    o.stream = stream_;
    auto v = [](int r, std::size_t i) { return static_cast<double>((r + 1) + i % 5); };
    std::vector<double> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = v(r_, i);

    // allreduce: sum (out of place), min, max and prod (in place), avg for floating types
    Dev in(api_, n, t), out(api_, n, t);
    put(in, mine);
    run_op(peer_.allreduce("sum/" + id, in.buf(), out.buf(), o), "allreduce sum " + id);
    expect(out, "allreduce sum " + id, [&](std::size_t i) {
      double s = 0;
      for (int q = 0; q < p_; ++q) s += v(q, i);
      return s;
    });
    for (kf::ReduceOp op :
         {kf::ReduceOp::min, kf::ReduceOp::max, kf::ReduceOp::prod, kf::ReduceOp::avg}) {
      if (op == kf::ReduceOp::avg && !floating) continue;
      auto pv = [&](int r, std::size_t i) {
        return op == kf::ReduceOp::prod ? static_cast<double>(1 + (i + r) % 2) : v(r, i);
      };
      std::vector<double> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = pv(r_, i);
      put(out, x);
      kf::CollOptions oo = o;
      oo.op = op;
      const std::string what = "allreduce op" + std::to_string(static_cast<int>(op)) + " " + id;
      run_op(peer_.allreduce(what, out.buf(), out.buf(), oo), what);
      expect(out, what, [&](std::size_t i) {
        double acc = op == kf::ReduceOp::prod ? 1 : op == kf::ReduceOp::min ? 1e300 : -1e300;
        if (op == kf::ReduceOp::avg) acc = 0;
        for (int q = 0; q < p_; ++q) {
          const double y = pv(q, i);
          if (op == kf::ReduceOp::prod) acc *= y;
          if (op == kf::ReduceOp::min) acc = std::min(acc, y);
          if (op == kf::ReduceOp::max) acc = std::max(acc, y);
          if (op == kf::ReduceOp::avg) acc += y;
        }
        return op == kf::ReduceOp::avg ? acc / p_ : acc;
      });
    }
    // broadcast from the last rank
    kf::CollOptions ob = o;
    ob.root = p_ - 1;
    put(out, r_ == p_ - 1 ? mine : std::vector<double>(n, 0));
    run_op(peer_.broadcast("bc/" + id, out.buf(), ob), "broadcast " + id);
    expect(out, "broadcast " + id, [&](std::size_t i) { return v(p_ - 1, i); });
    // allgather, gather to the last rank, reduce-scatter
    const std::size_t pn = n * static_cast<std::size_t>(p_);
    Dev all(api_, pn, t);
    run_op(peer_.allgather("ag/" + id, in.buf(), all.buf(), o), "allgather " + id);
    expect(all, "allgather " + id,
           [&](std::size_t k) { return v(static_cast<int>(k / n), k % n); });
    Dev at_root(api_, pn, t);
    run_op(peer_.gather("ga/" + id, in.buf(), at_root.buf(), ob), "gather " + id);
    if (r_ == p_ - 1) {
      expect(
          at_root, "gather " + id, [&](std::size_t k) { return v(static_cast<int>(k / n), k % n); },
          /*shared=*/false);
    }
    std::vector<double> block(pn);
    for (std::size_t k = 0; k < pn; ++k) block[k] = v(r_, k);
    put(all, block);
    run_op(peer_.reduce_scatter("rs/" + id, all.buf(), out.buf(), o), "reduce_scatter " + id);
    expect(
        out, "reduce_scatter " + id,
        [&](std::size_t i) {
          double s = 0;
          for (int q = 0; q < p_; ++q) s += v(q, static_cast<std::size_t>(r_) * n + i);
          return s;
        },
        /*shared=*/false);  // each worker's own block
    // consensus over device bytes
    bool agreed = false;
    run_op(peer_.consensus("cs/" + id, in.buf(), &agreed, o), "consensus " + id);
    check(agreed == (p_ == 1), "consensus " + id + " over different bytes");
  }

  kf::Peer& peer_;
  kf::detail::DeviceApi& api_;
  int p_, r_;
  void* stream_;
  std::uint64_t hash_ = 1469598103934665603ull;
  int bad_ = 0;
  int ops_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const bool standin = argc > 1 && std::string(argv[1]) == "--standin";
  if (argc > 2 || (argc == 2 && !standin)) {
    std::cerr << "usage: device-worker [--standin]\n";
    return 2;
  }
  try {
    std::shared_ptr<kf::detail::DeviceApi> api;
    std::string why;
    if (standin) {
      api = kf::detail::standin_device_api();
      kf::detail::set_device_api_for_tests(api);
    } else {
      api = kf::detail::cuda_device_api(why);
      if (!api) {
        std::cerr << "device-worker: " << why << "\n";
        return 1;
      }
      if (auto self = kf::env::get(kf::env::kSelf))
        setenv("NCCL_HOSTID", ("kf-" + *self).c_str(), 0);
    }
    auto peer = kf::Peer::from_environment();
    Worker w(*peer, *api);
    return w.run();
  } catch (const std::exception& e) {
    std::cerr << "device-worker: " << e.what() << "\n";
    return 1;
  }
}
