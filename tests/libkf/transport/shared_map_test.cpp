// SPDX-License-Identifier: Apache-2.0
// kf::SharedMemory, the registry that finds the region a payload lies in, and a receiver's
// mappings of a sender's regions (taken here from this very process: the kernel's checks for
// pidfd_getfd are those of process_vm_readv, which a process passes for itself).
#include "kf/shared_memory.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/shared_regions.hpp"
#include "kf/common/error.hpp"
#include "transport/shared_map.hpp"

namespace kf {
namespace {

using detail::find_shared_region;
using transport::SharedMappings;

TEST(SharedMemory, IsZeroedPageAlignedAndMovable) {
  SharedMemory m(10000);
  ASSERT_NE(m.data(), nullptr);
  EXPECT_EQ(m.size(), 10000u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % static_cast<std::uintptr_t>(getpagesize()),
            0u);
  for (std::size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m.data()[i], std::byte{0}) << i;
  EXPECT_EQ(m.as<float>().size(), 2500u);
  std::byte* const p = m.data();
  SharedMemory moved(std::move(m));
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(m.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(m.size(), 0u);
  SharedMemory empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_FALSE(find_shared_region(nullptr, 0).has_value());
}

TEST(SharedMemory, TheRegistryFindsOnlyRangesInsideARegion) {
  SharedMemory a(3 * 4096), b(4096);
  const auto in = find_shared_region(a.data() + 100, 200);
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->offset, 100u);
  EXPECT_GE(in->fd, 0);
  const auto whole = find_shared_region(a.data(), a.size());
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->id, in->id);
  const auto other = find_shared_region(b.data(), 1);
  ASSERT_TRUE(other.has_value());
  EXPECT_NE(other->id, in->id);
  EXPECT_NE(other->fd, in->fd);
  // Past the end of a (its mapping is exactly 3 pages), or not in any region at all.
  EXPECT_FALSE(find_shared_region(a.data() + 2 * 4096, 4097).has_value());
  int heap = 0;
  EXPECT_FALSE(find_shared_region(&heap, sizeof heap).has_value());
  // A freed region is no longer found, and a new one never reuses its id.
  const std::uint64_t old_id = other->id;
  const void* old_base = b.data();
  b = SharedMemory();
  EXPECT_FALSE(find_shared_region(old_base, 1).has_value());
  SharedMemory c(4096);
  const auto fresh = find_shared_region(c.data(), 1);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_GT(fresh->id, old_id);
}

TEST(SharedMappings, MapsARegionOnceAndReadsItInPlace) {
  SharedMemory m(2 * 4096);
  std::memcpy(m.data() + 4096, "hello", 5);
  const auto ref = find_shared_region(m.data() + 4096, 5);
  ASSERT_TRUE(ref.has_value());
  SharedMappings maps(getpid());
  const std::byte* p = nullptr;
  std::string why;
  ASSERT_FALSE(maps.view(ref->fd, ref->id, ref->offset, 5, p, why)) << why;
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p, m.data() + 4096) << "a mapping of its own, not the sender's address";
  EXPECT_EQ(std::memcmp(p, "hello", 5), 0);
  // The same region again: the same mapping, which sees later writes.
  std::memcpy(m.data() + 4096, "world", 5);
  const std::byte* q = nullptr;
  ASSERT_FALSE(maps.view(ref->fd, ref->id, ref->offset, 5, q, why)) << why;
  EXPECT_EQ(q, p);
  EXPECT_EQ(std::memcmp(q, "world", 5), 0);
}

TEST(SharedMappings, RefusesWhatIsNotASealedMemoryFileOrLiesPastItsEnd) {
  SharedMemory m(4096);
  const auto ref = find_shared_region(m.data(), 1);
  ASSERT_TRUE(ref.has_value());
  SharedMappings maps(getpid());
  const std::byte* p = nullptr;
  std::string why;
  // Past the end.
  EXPECT_EQ(maps.view(ref->fd, ref->id, 4000, 97, p, why), make_error_code(errc::protocol_error));
  EXPECT_NE(why.find("of a shared region of 4096"), std::string::npos) << why;
  // A pipe is not a memory file; an unsealed memory file could shrink under the mapping.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  EXPECT_EQ(maps.view(fds[0], 1000, 0, 1, p, why), make_error_code(errc::protocol_error));
  EXPECT_NE(why.find("not a memory file sealed against shrinking"), std::string::npos) << why;
  close(fds[0]);
  close(fds[1]);
  const int loose = memfd_create("loose", MFD_CLOEXEC);
  ASSERT_GE(loose, 0);
  ASSERT_EQ(ftruncate(loose, 4096), 0);
  EXPECT_EQ(maps.view(loose, 1001, 0, 1, p, why), make_error_code(errc::protocol_error));
  EXPECT_NE(why.find("not a memory file sealed against shrinking"), std::string::npos) << why;
  close(loose);
  // A descriptor the sender does not have.
  const int closed = dup(0);
  ASSERT_GE(closed, 0);
  close(closed);
  EXPECT_EQ(maps.view(closed, 1002, 0, 1, p, why), make_error_code(errc::protocol_error));
  EXPECT_NE(why.find("which its sender does not have"), std::string::npos) << why;
}

TEST(SharedMappings, KeepsAtMostItsLimitOfRegions) {
  SharedMappings maps(getpid());
  std::vector<SharedMemory> regions;
  std::vector<const std::byte*> seen;
  for (std::size_t i = 0; i < SharedMappings::kMaxRegions + 2; ++i) {
    regions.emplace_back(4096);
    regions.back().data()[0] = static_cast<std::byte>(i + 1);
    const auto ref = find_shared_region(regions.back().data(), 1);
    ASSERT_TRUE(ref.has_value());
    const std::byte* p = nullptr;
    std::string why;
    ASSERT_FALSE(maps.view(ref->fd, ref->id, 0, 1, p, why)) << why;
    EXPECT_EQ(p[0], static_cast<std::byte>(i + 1));
    seen.push_back(p);
  }
  // The first region was unmapped to make room: naming it again maps it afresh, and reads
  // what it holds now.
  regions.front().data()[0] = std::byte{99};
  const auto ref = find_shared_region(regions.front().data(), 1);
  const std::byte* p = nullptr;
  std::string why;
  ASSERT_FALSE(maps.view(ref->fd, ref->id, 0, 1, p, why)) << why;
  EXPECT_EQ(p[0], std::byte{99});
}

}  // namespace
}  // namespace kf
