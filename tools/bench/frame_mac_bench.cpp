// SPDX-License-Identifier: Apache-2.0
// kf-bench-frame-mac: the speed of frame authentication (docs/protocol.md, "Frame MACs"), one
// frame's tag over N bytes, with the vector GHASH (kind best, where the processor has it) and
// with OpenSSL's AES-GCM. Frames of 4 B measure the fixed cost per frame; 1 MiB stays in the
// caches (a frame is tagged as it is written or read, in chunks that do); 64 MiB does not.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

#include "transport/frame_mac.hpp"

namespace {

void tag(benchmark::State& state, kf::transport::FrameMac::Kind kind) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<std::byte> frame(bytes, std::byte{0x5a});
  kf::transport::FrameMac mac(kf::Key{}, kind);
  if (kind == kf::transport::FrameMac::Kind::best && !mac.vector()) {
    state.SkipWithError("this processor lacks AVX-512 with VPCLMULQDQ: best is openssl");
    return;
  }
  for (auto _ : state) {
    mac.begin();
    mac.update(frame.data(), frame.size());
    benchmark::DoNotOptimize(mac.finish());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(bytes));
}

void vector_ghash(benchmark::State& s) { tag(s, kf::transport::FrameMac::Kind::best); }
void openssl_gcm(benchmark::State& s) { tag(s, kf::transport::FrameMac::Kind::openssl); }

BENCHMARK(vector_ghash)->Arg(4)->Arg(1 << 10)->Arg(1 << 20)->Arg(64 << 20);
BENCHMARK(openssl_gcm)->Arg(4)->Arg(1 << 10)->Arg(1 << 20)->Arg(64 << 20);

}  // namespace

BENCHMARK_MAIN();
