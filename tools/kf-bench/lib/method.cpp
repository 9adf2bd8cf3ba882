// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/method.hpp"

#include <algorithm>
#include <cmath>

namespace kf::tools::bench {

std::string_view to_string(Method m) noexcept {
  return m == Method::back_to_back ? "back-to-back" : "barrier";
}

std::optional<Method> parse_method(std::string_view text) noexcept {
  if (text == "barrier") return Method::barrier;
  if (text == "back-to-back") return Method::back_to_back;
  return std::nullopt;
}

int max_back_to_back_calls(int workers) noexcept {
  if (workers < 2) return kMaxCalls;
  // The largest sum after k calls is ceil(np/2) * np^(k-1); FLT_MAX is just below 2^128.
  const double top = std::log2(static_cast<double>(workers - workers / 2));
  const double per_call = std::log2(static_cast<double>(workers));
  const auto k = static_cast<int>(std::floor((127.0 - top) / per_call)) + 1;
  return std::min(k, kMaxCalls);
}

std::string check_back_to_back_calls(int calls, int workers) {
  const int most = max_back_to_back_calls(workers);
  if (calls <= most) return {};
  return "--calls " + std::to_string(calls) + ": with " + std::to_string(workers) +
         " workers each in-place sum multiplies the values by " + std::to_string(workers) +
         ", and after " + std::to_string(most) +
         " calls they would pass the range of f32; use at most " + std::to_string(most);
}

void fill_back_to_back(float* data, std::size_t count, int rank) noexcept {
  const std::size_t odd = static_cast<std::size_t>(rank) & 1U;
  for (std::size_t i = 0; i < count; ++i) data[i] = ((i + odd) & 1U) != 0 ? 1.0F : 0.0F;
}

bool matches_back_to_back(const float* data, std::size_t count, int workers, int calls) noexcept {
  // S(i): the workers r with i + r odd. For even i those are the odd ranks, for odd i the even.
  const double odd_ranks = static_cast<double>(workers / 2);
  const double even_ranks = static_cast<double>(workers - workers / 2);
  const double growth = std::pow(static_cast<double>(workers), calls - 1);
  const double expected[2] = {odd_ranks * growth, even_ranks * growth};
  // Each call's sum adds workers - 1 values, each addition rounded to f32 (2^-24 of the sum at
  // most) unless the count is a power of two; the errors of the calls add up. A wrong sum is
  // off by at least 1/workers of the value, far beyond this.
  const double rounding = static_cast<double>(calls) * static_cast<double>(workers - 1) * 0x1p-24;
  const double tolerance = 1e-6 + rounding;
  for (std::size_t i = 0; i < count; ++i) {
    const double e = expected[i & 1U];
    if (!(std::fabs(static_cast<double>(data[i]) - e) <= tolerance * e)) return false;
  }
  return true;
}

}  // namespace kf::tools::bench
