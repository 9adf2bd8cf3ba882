// SPDX-License-Identifier: Apache-2.0
// The helpers for logging what came from outside: escaping and the rate limit.
#include "kf/common/log.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace kf {
namespace {

TEST(Printable, PrintableAsciiIsKeptAndEverythingElseEscaped) {
  EXPECT_EQ(printable("host-1:9000"), "host-1:9000");
  EXPECT_EQ(printable(std::string("a\nb\x1b[31m\0c", 10)), "a\\x0ab\\x1b[31m\\x00c");
  EXPECT_EQ(printable("back\\slash"), "back\\x5cslash") << "an escape must not be forgeable";
  EXPECT_EQ(printable("\xc3\xa9\x7f"), "\\xc3\\xa9\\x7f");
  EXPECT_EQ(printable(""), "");
}

TEST(Printable, LongInputIsCutAndItsLengthSaid) {
  const std::string long_text(1000, 'x');
  EXPECT_EQ(printable(long_text, 8), "xxxxxxxx... (1000 bytes)");
  EXPECT_EQ(printable(long_text, 1000), long_text);
  // The cut counts input bytes, so escaping cannot stretch a line without bound either.
  EXPECT_EQ(printable(std::string(100, '\n'), 2), "\\x0a\\x0a... (100 bytes)");
}

TEST(LogLimiter, AllowsABurstPerWindowAndCountsWhatItLeftOut) {
  constexpr auto kWindow = std::chrono::milliseconds(50);
  LogLimiter limit(2, kWindow);
  std::uint64_t left_out = 99;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(limit.allow(left_out));
  EXPECT_EQ(left_out, 0u);
  EXPECT_TRUE(limit.allow(left_out));
  int refused = 0;
  for (int i = 0; i < 3; ++i) refused += limit.allow(left_out) ? 0 : 1;
  if (std::chrono::steady_clock::now() - start >= kWindow) {
    GTEST_SKIP() << "this machine took longer than the window for five calls";
  }
  EXPECT_EQ(refused, 3);
  std::this_thread::sleep_for(kWindow);  // a new window: the time itself is what is tested
  EXPECT_TRUE(limit.allow(left_out));
  EXPECT_EQ(left_out, 3u) << "the first line of a new window says how many were left out";
  EXPECT_TRUE(limit.allow(left_out));
  EXPECT_EQ(left_out, 0u);
}

}  // namespace
}  // namespace kf
