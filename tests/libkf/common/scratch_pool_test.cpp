// SPDX-License-Identifier: Apache-2.0
// ScratchPool: blocks given back are handed out again, the smallest that fits first, and a full
// pool makes room for the newest block by letting its oldest go.
#include "common/scratch_pool.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace kf::detail {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

TEST(ScratchPool, HandsOutTheSmallestKeptBlockThatFits) {
  ScratchPool pool;
  ScratchPool::Block big = pool.acquire(4 * kMiB);
  ScratchPool::Block mid = pool.acquire(1 * kMiB);
  const std::byte* mid_at = mid.data.get();
  pool.release(std::move(big));
  pool.release(std::move(mid));
  EXPECT_EQ(pool.blocks(), 2u);
  EXPECT_EQ(pool.bytes_held(), 5 * kMiB);
  ScratchPool::Block got = pool.acquire(512 * kKiB);
  EXPECT_EQ(got.data.get(), mid_at);
  EXPECT_EQ(got.bytes, 1 * kMiB);
  EXPECT_EQ(pool.blocks(), 1u);
  EXPECT_EQ(pool.bytes_held(), 4 * kMiB);
}

// A job that moves to larger messages: the pool is full of blocks too small for them. The
// larger block given back must be kept (the oldest small one goes), or every call would get
// fresh memory.
TEST(ScratchPool, AFullPoolKeepsTheNewestBlockAndLetsTheOldestGo) {
  ScratchPool pool;
  std::vector<ScratchPool::Block> small;
  for (std::size_t i = 0; i < ScratchPool::kMaxBlocks; ++i) small.push_back(pool.acquire(kKiB));
  for (auto& b : small) pool.release(std::move(b));
  ASSERT_EQ(pool.blocks(), ScratchPool::kMaxBlocks);
  ScratchPool::Block large = pool.acquire(2 * kMiB);  // none fits: a new block
  EXPECT_EQ(pool.blocks(), ScratchPool::kMaxBlocks);
  const std::byte* large_at = large.data.get();
  pool.release(std::move(large));
  EXPECT_EQ(pool.blocks(), ScratchPool::kMaxBlocks);
  EXPECT_EQ(pool.bytes_held(), (ScratchPool::kMaxBlocks - 1) * kKiB + 2 * kMiB);
  ScratchPool::Block again = pool.acquire(2 * kMiB);
  EXPECT_EQ(again.data.get(), large_at);
  EXPECT_EQ(pool.blocks(), ScratchPool::kMaxBlocks - 1);
}

TEST(ScratchPool, KeepsAtMostItsBytesTheNewestFirst) {
  ScratchPool pool(3 * kMiB);
  ScratchPool::Block a = pool.acquire(kMiB);
  ScratchPool::Block b = pool.acquire(kMiB);
  ScratchPool::Block c = pool.acquire(2 * kMiB);
  ScratchPool::Block huge = pool.acquire(4 * kMiB);
  const std::byte* b_at = b.data.get();
  pool.release(std::move(a));
  pool.release(std::move(b));
  pool.release(std::move(c));  // 4 MiB in all: `a`, the oldest, goes
  EXPECT_EQ(pool.blocks(), 2u);
  EXPECT_EQ(pool.bytes_held(), 3 * kMiB);
  pool.release(std::move(huge));  // more than the pool may hold at all: not kept, nothing goes
  EXPECT_EQ(pool.blocks(), 2u);
  EXPECT_EQ(pool.bytes_held(), 3 * kMiB);
  EXPECT_EQ(pool.acquire(kMiB).data.get(), b_at);
}

TEST(ScratchPool, AnEmptyBlockIsNotKept) {
  ScratchPool pool;
  pool.release(ScratchPool::Block{});
  EXPECT_EQ(pool.blocks(), 0u);
  EXPECT_EQ(pool.bytes_held(), 0u);
}

}  // namespace
}  // namespace kf::detail
