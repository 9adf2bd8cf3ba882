// SPDX-License-Identifier: Apache-2.0
// A hot spare's snapshot pieces: sizes within the invitation limit, reassembly in order, and
// what a spare does with pieces that do not fit together. No sockets.
#include "session/spares.hpp"

#include <gtest/gtest.h>

#include <string>

namespace kf::detail {
namespace {

std::string bytes_of(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 3);
  return s;
}

TEST(SparePieces, ASnapshotGoesInPiecesWithinTheInvitationLimitAndComesBackWhole) {
  const std::string snapshot = bytes_of((std::size_t{5} << 19) + 11);  // 2.5 MiB and a bit
  const auto pieces = spare_pieces(3, 42, snapshot);
  ASSERT_EQ(pieces.size(), 3u);
  for (const auto& p : pieces) {
    EXPECT_LE(p.size(), std::size_t{1} << 20);
    EXPECT_TRUE(is_spare_piece(p));
  }
  SnapshotAssembler a;
  const Endpoint from{"127.0.0.1", 4000};
  EXPECT_FALSE(a.add(from, pieces[0]));
  EXPECT_FALSE(a.add(from, pieces[1]));
  EXPECT_TRUE(a.add(from, pieces[2]));
  EXPECT_EQ(a.commit(), 42);
  EXPECT_EQ(a.take(), snapshot);
  // An empty snapshot is one piece.
  const auto empty = spare_pieces(1, 0, "");
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_TRUE(a.add(from, empty[0]));
  EXPECT_EQ(a.take(), "");
}

TEST(SparePieces, PiecesThatDoNotFollowOnAreDroppedAndANewPushStartsOver) {
  const std::string first = bytes_of(std::size_t{3} << 20), second = bytes_of(100);
  const auto old_push = spare_pieces(1, 10, first);
  const auto new_push = spare_pieces(2, 11, second);
  const Endpoint from{"127.0.0.1", 4000}, other{"127.0.0.1", 4001};
  SnapshotAssembler a;
  // The middle of a push whose start this spare missed.
  EXPECT_FALSE(a.add(from, old_push[1]));
  EXPECT_FALSE(a.add(from, old_push[2]));
  // A push begun, then a newer one (its sender moved on): the newer one wins.
  EXPECT_FALSE(a.add(from, old_push[0]));
  EXPECT_TRUE(a.add(from, new_push[0]));
  EXPECT_EQ(a.commit(), 11);
  EXPECT_EQ(a.take(), second);
  // Another sender's piece in the middle of a push breaks it off.
  EXPECT_FALSE(a.add(from, old_push[0]));
  EXPECT_FALSE(a.add(other, old_push[1]));
  EXPECT_FALSE(a.add(from, old_push[1]));
}

TEST(SparePieces, MalformedPiecesAreRefusedSayingWhy) {
  EXPECT_FALSE(is_spare_piece("{\"cluster\": {}}"));
  SnapshotAssembler a;
  const Endpoint from{"127.0.0.1", 4000};
  EXPECT_THROW(a.add(from, "KFSPARE1short"), std::invalid_argument);
  std::string p = spare_pieces(1, 5, bytes_of(10))[0];
  p[8 + 16] = 20;  // offset 20 of a 10-byte snapshot
  try {
    a.add(from, p);
    FAIL() << "a piece outside its snapshot must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("outside its 10-byte snapshot"), std::string::npos)
        << e.what();
  }
  std::string negative = spare_pieces(1, -1, "x")[0];
  EXPECT_THROW(a.add(from, negative), std::invalid_argument);
}

}  // namespace
}  // namespace kf::detail
