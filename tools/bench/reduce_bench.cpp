// SPDX-License-Identifier: Apache-2.0
// kf-bench-reduce: the throughput of the reduction kernels (kf::reduce_to) for every element
// type and operator, on a buffer that fits the caches (64 KiB) and one that does not (8 MiB).
// Bytes per second count one operand. Google Benchmark's options apply, e.g.
// --benchmark_filter=bf16 --benchmark_repetitions=3.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kf/common/dtype.hpp"

namespace {

// Finite values in [0.5, 2), so that neither products nor sums reach subnormals or infinities
// (which some CPUs handle far more slowly) however often the kernel runs over the same buffer.
std::vector<unsigned char> operand(kf::DType t, std::size_t n, int seed) {
  std::vector<unsigned char> v(n * kf::dtype_bytes(t));
  for (std::size_t i = 0; i < n; ++i) {
    const double x =
        0.5 + static_cast<double>((i * 7 + static_cast<std::size_t>(seed)) % 97) / 97.0;
    unsigned char* at = &v[i * kf::dtype_bytes(t)];
    switch (t) {
      case kf::DType::f32: {
        const float f = static_cast<float>(x);
        std::memcpy(at, &f, sizeof f);
        break;
      }
      case kf::DType::f64: std::memcpy(at, &x, sizeof x); break;
      case kf::DType::f16: {
        const std::uint16_t h = kf::float_to_f16(static_cast<float>(x));
        std::memcpy(at, &h, sizeof h);
        break;
      }
      case kf::DType::bf16: {
        const std::uint16_t h = kf::float_to_bf16(static_cast<float>(x));
        std::memcpy(at, &h, sizeof h);
        break;
      }
      case kf::DType::i32:
      case kf::DType::i64:
      case kf::DType::u8: at[0] = static_cast<unsigned char>(1 + i % 3); break;
    }
  }
  return v;
}

void reduce(benchmark::State& state, kf::DType t, kf::ReduceOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t n = bytes / kf::dtype_bytes(t);
  const auto a = operand(t, n, 1);
  const auto b = operand(t, n, 2);
  auto acc = a;
  for (auto _ : state) {
    // acc = a OP b, not acc OP= b: the values stay where operand() put them.
    kf::reduce_to(acc.data(), a.data(), b.data(), n, t, op);
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
}

int register_all() {
  for (kf::DType t : {kf::DType::f32, kf::DType::f64, kf::DType::f16, kf::DType::bf16,
                      kf::DType::i32, kf::DType::i64, kf::DType::u8}) {
    for (kf::ReduceOp op :
         {kf::ReduceOp::sum, kf::ReduceOp::prod, kf::ReduceOp::min, kf::ReduceOp::max}) {
      const std::string name =
          "reduce/" + std::string(kf::to_string(t)) + "/" + std::string(kf::to_string(op));
      benchmark::RegisterBenchmark(name.c_str(), reduce, t, op)->Arg(64 << 10)->Arg(8 << 20);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
