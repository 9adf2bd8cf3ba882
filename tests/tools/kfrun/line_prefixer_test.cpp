// SPDX-License-Identifier: Apache-2.0
#include "kfrun/lib/line_prefixer.hpp"

#include <string>

#include <gtest/gtest.h>

namespace kf::tools {
namespace {

struct Collected {
  std::string text;
  int count_lines = 0;
  LinePrefixer::Sink sink() {
    return [this](std::string_view line) {
      text.append(line);
      ++count_lines;
    };
  }
};

TEST(LinePrefixer, PrefixesEachWholeLine) {
  Collected out;
  LinePrefixer lines("[2] ", out.sink());
  lines.feed("a\nbb\n\nc\n");
  EXPECT_EQ(out.text, "[2] a\n[2] bb\n[2] \n[2] c\n");
  EXPECT_EQ(out.count_lines, 4);
}

TEST(LinePrefixer, JoinsLineSplitAcrossChunks) {
  Collected out;
  LinePrefixer lines("[0] ", out.sink());
  lines.feed("hel");
  EXPECT_EQ(out.text, "");
  lines.feed("lo wo");
  lines.feed("rld\nnext");
  EXPECT_EQ(out.text, "[0] hello world\n");
  lines.feed("\n");
  EXPECT_EQ(out.text, "[0] hello world\n[0] next\n");
}

TEST(LinePrefixer, FinishCompletesPartialLine) {
  Collected out;
  LinePrefixer lines("[1] ", out.sink());
  lines.feed("done\nno newline");
  lines.finish();
  EXPECT_EQ(out.text, "[1] done\n[1] no newline\n");
  lines.finish();
  EXPECT_EQ(out.count_lines, 2);
}

TEST(LinePrefixer, FinishWithoutPendingBytesWritesNothing) {
  Collected out;
  LinePrefixer lines("[1] ", out.sink());
  lines.feed("x\n");
  lines.finish();
  EXPECT_EQ(out.text, "[1] x\n");
}

TEST(LinePrefixer, SplitsOverlongLine) {
  Collected out;
  LinePrefixer lines("[0] ", out.sink());
  const std::string chunk(LinePrefixer::kMaxLineBytes / 2, 'x');
  lines.feed(chunk);
  EXPECT_EQ(out.count_lines, 0);
  lines.feed(chunk);
  EXPECT_EQ(out.count_lines, 1);
  lines.feed("tail\n");
  EXPECT_EQ(out.count_lines, 2);
  EXPECT_EQ(out.text, "[0] " + chunk + chunk + "\n[0] tail\n");
}

}  // namespace
}  // namespace kf::tools
