// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/method.hpp"

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
  for (std::size_t i = 0; i < count; ++i) {
    const double e = expected[i & 1U];
    if (!(std::fabs(static_cast<double>(data[i]) - e) <= 1e-6 * e)) return false;
  }
  return true;
}

}  // namespace kf::tools::bench
