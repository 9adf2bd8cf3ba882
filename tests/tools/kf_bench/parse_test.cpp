// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/parse.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace kf::tools::bench {
namespace {

TEST(ParseBytes, ReadsDigitsWithBinarySuffixes) {
  EXPECT_EQ(parse_bytes("4"), 4u);
  EXPECT_EQ(parse_bytes("65537"), 65537u);
  EXPECT_EQ(parse_bytes("1K"), 1024u);
  EXPECT_EQ(parse_bytes("64k"), 64u * 1024);
  EXPECT_EQ(parse_bytes("16M"), 16u << 20);
  EXPECT_EQ(parse_bytes("2G"), std::size_t{2} << 30);
}

TEST(ParseBytes, RejectsMalformedZeroAndHugeSizes) {
  for (const char* bad : {"", "K", "12Q", "1.5M", "-4", "+4", " 4", "4 ", "4KB", "0", "0K",
                          "8589934593G", "99999999999999999999"}) {
    EXPECT_THROW(parse_bytes(bad), std::invalid_argument) << "'" << bad << "'";
  }
}

TEST(ParseBytes, MessageNamesTheText) {
  try {
    parse_bytes("12Q");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'12Q'"), std::string::npos) << e.what();
  }
}

TEST(FormatBytes, WritesTheShortestFormParseBytesReadsBack) {
  EXPECT_EQ(format_bytes(4), "4");
  EXPECT_EQ(format_bytes(1000), "1000");
  EXPECT_EQ(format_bytes(4096), "4K");
  EXPECT_EQ(format_bytes(1536 * 1024), "1536K");
  EXPECT_EQ(format_bytes(64u << 20), "64M");
  EXPECT_EQ(format_bytes(std::size_t{2048} << 30), "2048G");
  EXPECT_EQ(format_bytes(0), "0");
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{3072}, std::size_t{1} << 40}) {
    EXPECT_EQ(parse_bytes(format_bytes(bytes)), bytes);
  }
}

TEST(ElementCount, RoundsDownButKeepsOneElement) {
  EXPECT_EQ(element_count(65537, DType::f32), 16384u);
  EXPECT_EQ(element_count(4, DType::f64), 1u);
  EXPECT_EQ(element_count(1, DType::f16), 1u);
  EXPECT_EQ(element_count(7, DType::u8), 7u);
}

TEST(ParseAlgorithms, AllListsEveryAlgorithmWithAutoLast) {
  const std::vector<Algorithm> want{Algorithm::star,       Algorithm::ring, Algorithm::tree,
                                    Algorithm::clique,     Algorithm::rhd,  Algorithm::hierarchical,
                                    Algorithm::auto_select};
  EXPECT_EQ(parse_algorithms("all"), want);
  EXPECT_EQ(parse_algorithms("ring"), std::vector<Algorithm>{Algorithm::ring});
  EXPECT_EQ(parse_algorithms("auto"), std::vector<Algorithm>{Algorithm::auto_select});
  EXPECT_THROW(parse_algorithms("default"), std::invalid_argument);
  EXPECT_THROW(parse_algorithms("Ring"), std::invalid_argument);
}

}  // namespace
}  // namespace kf::tools::bench
