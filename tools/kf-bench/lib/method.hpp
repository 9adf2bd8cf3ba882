// SPDX-License-Identifier: Apache-2.0
// How kf-bench and its baselines time a collective (docs/performance.md, "Two ways to measure"):
//   - barrier: a barrier before each call, each call on a buffer last touched tens of MiB
//     earlier (cache-cold), one call per sample: the collective alone, from a common start;
//   - back-to-back: a barrier before each sample, then `calls` in-place allreduces of one warm
//     buffer with nothing between them, as a training loop issues them; a sample's time is the
//     loop's over `calls`. Each worker's buffer is refilled between samples, outside the clock.
// Every worker times every sample; a sample's time is the maximum over the workers.
// The back-to-back values: worker r's element i is 1 when i + r is odd, else 0, so after one sum
// every element holds S(i), the number of such workers, and after k in-place sums
// S(i) * np^(k-1): exact in f32 for a power-of-two np, rounded once per addition otherwise
// (checked to within that rounding). The sums pass f32's range after
// max_back_to_back_calls(np) calls, and a run asked for more refuses to start.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kf::tools::bench {

enum class Method { barrier, back_to_back };

/// "barrier" or "back-to-back" (the command lines' and the JSON rows' spelling).
std::string_view to_string(Method m) noexcept;
/// The method named `text`, or nullopt.
std::optional<Method> parse_method(std::string_view text) noexcept;

/// back-to-back's calls per sample when none are given.
inline constexpr int kDefaultCalls = 10;
inline constexpr int kMaxCalls = 1000;

/// The most back-to-back calls per sample whose sums over `workers` workers stay within f32's
/// range (128 for 2 workers, 64 for 4), at most kMaxCalls.
int max_back_to_back_calls(int workers) noexcept;
/// Empty when `calls` back-to-back calls suit `workers` workers, else why not (for the
/// command line's error).
std::string check_back_to_back_calls(int calls, int workers);

/// Writes worker `rank`'s back-to-back values over `count` floats.
void fill_back_to_back(float* data, std::size_t count, int rank) noexcept;
/// Whether `data` holds the result of `calls` in-place sums over `workers` workers of the
/// values fill_back_to_back() wrote.
bool matches_back_to_back(const float* data, std::size_t count, int workers, int calls) noexcept;

}  // namespace kf::tools::bench
