// SPDX-License-Identifier: Apache-2.0
// make_recycled: objects come back fresh from the releasing thread's cache, the cache is
// bounded, and a thread's cached objects are destroyed when it ends.
#include "common/recycle.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace kf::detail {
namespace {

struct Counted {
  static inline int constructed = 0;
  static inline int destroyed = 0;
  static inline int recycled = 0;
  int value = 7;
  std::string text = "fresh";
  std::shared_ptr<int> held;

  Counted() { ++constructed; }
  ~Counted() { ++destroyed; }
  void recycle() noexcept {
    ++recycled;
    value = 7;
    text = "fresh";
    held.reset();
  }
  static void reset_counts() { constructed = destroyed = recycled = 0; }
};

TEST(Recycle, AReleasedObjectComesBackFreshOnTheSameThread) {
  // On a thread of its own, so that nothing cached before counts.
  std::thread([] {
    Counted::reset_counts();
    auto held = std::make_shared<int>(1);
    Counted* first = nullptr;
    {
      auto a = make_recycled<Counted>();
      first = a.get();
      EXPECT_EQ(a->value, 7);
      a->value = 99;
      a->text = "used";
      a->held = held;
      auto b = a;  // two owners: the object is recycled when the last one goes
      a.reset();
      EXPECT_EQ(Counted::recycled, 0);
      EXPECT_EQ(held.use_count(), 2);
    }
    EXPECT_EQ(Counted::recycled, 1);
    EXPECT_EQ(held.use_count(), 1) << "recycle() drops what the object referred to";
    auto c = make_recycled<Counted>();
    EXPECT_EQ(c.get(), first);
    EXPECT_EQ(c->value, 7);
    EXPECT_EQ(c->text, "fresh");
    EXPECT_EQ(Counted::constructed, 1);
    EXPECT_EQ(Counted::destroyed, 0);
  }).join();
  // The thread's end destroyed what its cache held.
  EXPECT_EQ(Counted::constructed, Counted::destroyed);
}

TEST(Recycle, TheCacheIsBoundedAndEmptiedAtTheThreadsEnd) {
  std::thread([] {
    Counted::reset_counts();
    std::vector<std::shared_ptr<Counted>> live;
    for (int i = 0; i < 6; ++i) live.push_back(make_recycled<Counted, 4>());
    live.clear();  // four are kept, two destroyed
    EXPECT_EQ(Counted::recycled, 6);
    EXPECT_EQ(Counted::destroyed, 2);
    for (int i = 0; i < 4; ++i) live.push_back(make_recycled<Counted, 4>());
    EXPECT_EQ(Counted::constructed, 6) << "the four kept are reused";
    live.push_back(make_recycled<Counted, 4>());
    EXPECT_EQ(Counted::constructed, 7);
    live.clear();
    EXPECT_EQ(Counted::destroyed, 3);
  }).join();
  EXPECT_EQ(Counted::constructed, 7);
  EXPECT_EQ(Counted::destroyed, 7);
}

// Made on one thread and released on another, an object goes to the releasing thread's cache:
// made again there, it is reused; the making thread makes a new one.
TEST(Recycle, AnObjectReleasedOnAnotherThreadJoinsThatThreadsCache) {
  std::thread([] {
    Counted::reset_counts();
    auto a = make_recycled<Counted>();
    Counted* made_here = a.get();
    std::thread([a = std::move(a), made_here]() mutable {
      a.reset();
      EXPECT_EQ(Counted::recycled, 1);
      auto again = make_recycled<Counted>();
      EXPECT_EQ(again.get(), made_here);
    }).join();
    // The other thread has ended and destroyed it.
    EXPECT_EQ(Counted::destroyed, 1);
    auto b = make_recycled<Counted>();
    EXPECT_EQ(Counted::constructed, 2);
  }).join();
  EXPECT_EQ(Counted::constructed, Counted::destroyed);
}

}  // namespace
}  // namespace kf::detail
