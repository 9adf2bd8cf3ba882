// SPDX-License-Identifier: Apache-2.0
// The metrics registry: the three types, labels, name and label validation, re-registration
// rules, the names a summary takes, snapshot order, and a concurrency smoke test (registration,
// updates and snapshots from several threads at once, with exact totals at the end).
#include "kf/monitor/metrics.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kf::monitor {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The what() of the std::invalid_argument that `f` throws; fails the test when it throws none.
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no std::invalid_argument";
  return "";
}

TEST(Counter, StartsAtZeroAndAddsIncrements) {
  MetricsRegistry registry;
  Counter& steps = registry.counter("kf_steps_total", "Optimizer steps.");
  EXPECT_EQ(steps.value(), 0.0);
  steps.inc();
  steps.inc(2.5);
  steps.inc(0.0);
  EXPECT_EQ(steps.value(), 3.5);
}

TEST(Counter, RejectsNegativeAndNonFiniteIncrementsNamingTheSeries) {
  MetricsRegistry registry;
  Counter& c = registry.counter("kf_samples_total", "", {{"rank", "3"}});
  c.inc(4);
  for (const double bad : {-1.0, -kInf, kInf, kNaN}) {
    const auto what = invalid_argument_message([&] { c.inc(bad); });
    EXPECT_NE(what.find("kf_samples_total{rank=\"3\"}"), std::string::npos) << what;
  }
  EXPECT_EQ(c.value(), 4.0);
}

TEST(Gauge, SetsAddsAndKeepsNonFiniteValues) {
  MetricsRegistry registry;
  Gauge& g = registry.gauge("kf_batch_size", "Global batch size.");
  g.set(256);
  g.add(-64);
  EXPECT_EQ(g.value(), 192.0);
  g.set(kInf);
  EXPECT_EQ(g.value(), kInf);
  g.set(kNaN);
  EXPECT_TRUE(std::isnan(g.value()));
}

TEST(Summary, KeepsLastValueSumAndCount) {
  MetricsRegistry registry;
  Summary& s = registry.summary("kf_step_seconds", "Step time.");
  EXPECT_TRUE(std::isnan(s.value().last));
  EXPECT_EQ(s.value().sum, 0.0);
  EXPECT_EQ(s.value().count, 0u);
  s.observe(0.5);
  s.observe(0.25);
  EXPECT_EQ(s.value().last, 0.25);
  EXPECT_EQ(s.value().sum, 0.75);
  EXPECT_EQ(s.value().count, 2u);
}

TEST(Histogram, CountsEachObservationInTheFirstBucketThatHoldsIt) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 4.0, 9.0, std::nan("")}) h.observe(v);
  std::vector<std::uint64_t> cumulative;
  double sum = 0;
  std::uint64_t count = 0;
  h.read(cumulative, sum, count);
  EXPECT_EQ(cumulative, (std::vector<std::uint64_t>{2, 3, 4}));
  EXPECT_EQ(count, 6u) << "the NaN counts, in +Inf";
  EXPECT_TRUE(std::isnan(sum)) << "and stays in the sum, visibly";
  const std::vector<double> durations = duration_buckets();
  EXPECT_EQ(durations.front(), 0.0001);
  EXPECT_TRUE(std::is_sorted(durations.begin(), durations.end()));
}

TEST(MetricsRegistry, AHistogramNeedsAscendingBoundsAndKeepsThemAndItsNames) {
  MetricsRegistry r;
  EXPECT_THROW(r.histogram("h", "", {}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "", {2, 1}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "", {1, 1}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "", {1, std::numeric_limits<double>::infinity()}),
               std::invalid_argument);
  EXPECT_THROW(r.histogram("h", "", {1}, {{"le", "x"}}), std::invalid_argument);
  Histogram& a = r.histogram("h", "", {1, 2}, {{"k", "a"}});
  EXPECT_EQ(&r.histogram("h", "", {1, 2}, {{"k", "a"}}), &a);
  EXPECT_EQ(r.histogram("h", "", {1, 2}, {{"k", "b"}}).bounds(), a.bounds());
  try {
    r.histogram("h", "", {1, 3}, {{"k", "c"}});
    FAIL() << "other bounds were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("other bucket bounds"), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.gauge("h_bucket", ""), std::invalid_argument) << "taken by the histogram";
  EXPECT_THROW(r.counter("h_count", ""), std::invalid_argument);
}

TEST(MetricsRegistry, ReturnsTheSameSeriesForTheSameNameAndLabelsInAnyOrder) {
  MetricsRegistry registry;
  Gauge& a = registry.gauge("kf_lr", "LR.", {{"group", "0"}, {"rank", "1"}});
  Gauge& b = registry.gauge("kf_lr", "LR.", {{"rank", "1"}, {"group", "0"}});
  Gauge& other = registry.gauge("kf_lr", "LR.", {{"group", "1"}, {"rank", "1"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  a.set(0.1);
  EXPECT_EQ(b.value(), 0.1);
  EXPECT_EQ(other.value(), 0.0);
}

TEST(MetricsRegistry, RejectsInvalidMetricNamesNamingThem) {
  MetricsRegistry registry;
  for (const std::string bad : {"", "9lives", "a-b", "a b", "caf\xc3\xa9", "x{}", "a.b"}) {
    const auto what = invalid_argument_message([&] { registry.gauge(bad, ""); });
    EXPECT_NE(what.find("metric name '" + bad + "'"), std::string::npos) << what;
  }
  for (const std::string good : {"a", "_x", ":x", "job:kf_steps:rate5m", "A9_b"}) {
    EXPECT_NO_THROW(registry.gauge(good, "")) << good;
  }
  EXPECT_EQ(registry.snapshot().size(), 5u);
}

TEST(MetricsRegistry, RejectsInvalidLabelNamesNamingThem) {
  MetricsRegistry registry;
  for (const std::string bad : {"", "9a", "a:b", "__name__", "__x", "a-b"}) {
    const auto what = invalid_argument_message([&] { registry.gauge("g", "", {{bad, "v"}}); });
    EXPECT_NE(what.find("label name '" + bad + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("metric 'g'"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(registry.gauge("g", "", {{"_x", "v"}, {"a9", "w"}}));
}

TEST(MetricsRegistry, RejectsALabelGivenTwice) {
  MetricsRegistry registry;
  const auto what = invalid_argument_message([&] {
    registry.gauge("g", "", {{"rank", "0"}, {"rank", "1"}});
  });
  EXPECT_NE(what.find("label 'rank' given twice"), std::string::npos) << what;
}

TEST(MetricsRegistry, AcceptsAnyUtf8ButRejectsInvalidUtf8) {
  MetricsRegistry registry;
  EXPECT_NO_THROW(
      registry.gauge("g", "h\"elp\\\n \xe2\x82\xac", {{"host", "a\"b\\c\nd \xf0\x9f\x9a\x80"}}));
  // A lone continuation byte, a truncated sequence, an overlong '/', a surrogate.
  for (const std::string bad : {"\x80", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80"}) {
    auto what = invalid_argument_message([&] { registry.gauge("g", "", {{"host", bad}}); });
    EXPECT_NE(what.find("value of label 'host' is not valid UTF-8"), std::string::npos) << what;
    what = invalid_argument_message([&] { registry.gauge("other", bad); });
    EXPECT_NE(what.find("help text is not valid UTF-8"), std::string::npos) << what;
  }
}

TEST(MetricsRegistry, RejectsAnotherTypeHelpOrLabelNamesForARegisteredName) {
  MetricsRegistry registry;
  registry.counter("kf_steps_total", "Steps.", {{"rank", "0"}});
  auto what = invalid_argument_message([&] { registry.gauge("kf_steps_total", "Steps."); });
  EXPECT_NE(what.find("already registered as a counter, not a gauge"), std::string::npos) << what;
  what = invalid_argument_message([&] {
    registry.counter("kf_steps_total", "Other.", {{"rank", "0"}});
  });
  EXPECT_NE(what.find("already registered with the help 'Steps.'"), std::string::npos) << what;
  what = invalid_argument_message([&] {
    registry.counter("kf_steps_total", "Steps.", {{"host", "a"}});
  });
  EXPECT_NE(what.find("other label names"), std::string::npos) << what;
  what = invalid_argument_message([&] { registry.counter("kf_steps_total", "Steps."); });
  EXPECT_NE(what.find("other label names"), std::string::npos) << what;
}

TEST(MetricsRegistry, ASummaryTakesItsExportedNamesInEitherOrder) {
  MetricsRegistry registry;
  registry.summary("kf_step_seconds", "");
  for (const char* taken :
       {"kf_step_seconds_sum", "kf_step_seconds_count", "kf_step_seconds_last"}) {
    const auto what = invalid_argument_message([&] { registry.gauge(taken, ""); });
    EXPECT_NE(what.find("already exported by 'kf_step_seconds'"), std::string::npos) << what;
  }
  registry.counter("kf_loss_count", "");
  const auto what = invalid_argument_message([&] { registry.summary("kf_loss", ""); });
  EXPECT_NE(what.find("'kf_loss_count' is already exported by 'kf_loss_count'"), std::string::npos)
      << what;
  const auto quantile = invalid_argument_message([&] {
    registry.summary("kf_x", "", {{"quantile", "0.5"}});
  });
  EXPECT_NE(quantile.find("'quantile'"), std::string::npos) << quantile;
}

TEST(MetricsRegistry, AFailedRegistrationChangesNothing) {
  MetricsRegistry registry;
  registry.gauge("g", "");
  EXPECT_THROW(registry.summary("s", "", {{"__bad", "x"}}), std::invalid_argument);
  EXPECT_THROW(registry.summary("g", ""), std::invalid_argument);
  ASSERT_EQ(registry.snapshot().size(), 1u);
  // "s" was not taken by the failed attempt.
  EXPECT_NO_THROW(registry.gauge("s_sum", ""));
}

TEST(MetricsRegistry, SnapshotIsSortedByNameThenLabelValuesWithLabelsSortedByName) {
  MetricsRegistry registry;
  registry.gauge("zeta", "Z.", {{"rank", "1"}, {"host", "b"}}).set(4);
  registry.gauge("zeta", "Z.", {{"rank", "0"}, {"host", "b"}}).set(3);
  registry.gauge("zeta", "Z.", {{"rank", "9"}, {"host", "a"}}).set(2);
  registry.counter("alpha", "A.").inc(7);
  Summary& s = registry.summary("mid", "M.");
  s.observe(1);
  s.observe(2);

  const auto families = registry.snapshot();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "alpha");
  EXPECT_EQ(families[0].type, MetricType::counter);
  EXPECT_EQ(families[0].help, "A.");
  EXPECT_EQ(families[0].samples.at(0).value, 7.0);
  EXPECT_EQ(families[1].name, "mid");
  EXPECT_EQ(families[1].type, MetricType::summary);
  EXPECT_EQ(families[1].samples.at(0).value, 2.0);
  EXPECT_EQ(families[1].samples.at(0).sum, 3.0);
  EXPECT_EQ(families[1].samples.at(0).count, 2u);
  EXPECT_EQ(families[2].name, "zeta");
  const auto& z = families[2].samples;
  ASSERT_EQ(z.size(), 3u);
  EXPECT_EQ(z[0].labels, (Labels{{"host", "a"}, {"rank", "9"}}));
  EXPECT_EQ(z[1].labels, (Labels{{"host", "b"}, {"rank", "0"}}));
  EXPECT_EQ(z[2].labels, (Labels{{"host", "b"}, {"rank", "1"}}));
  EXPECT_EQ(z[0].value, 2.0);
  EXPECT_EQ(z[1].value, 3.0);
  EXPECT_EQ(z[2].value, 4.0);
  EXPECT_EQ(to_string(MetricType::gauge), "gauge");
}

// Writers register (the same series from several threads) and update; a reader snapshots all
// the while; one thread keeps trying invalid registrations. A thread records what went wrong
// instead of throwing past its end (which would terminate the test binary).
TEST(MetricsRegistry, ConcurrentRegistrationUpdatesAndSnapshotsKeepExactTotals) {
  constexpr int kWriters = 6;
  constexpr int kUpdates = 20'000;
  MetricsRegistry registry;
  std::mutex errors_mutex;  // guards errors
  std::vector<std::string> errors;
  auto guarded = [&](auto body) {
    return [&, body] {
      try {
        body();
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mutex);
        errors.emplace_back(e.what());
      }
    };
  };
  registry.counter("kf_total", "All updates.");  // so that the gauge attempts below all fail
  std::atomic<int> writers_left{kWriters};
  std::atomic<bool> reading{false};  // the writers start with the reader's first snapshot
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back(guarded([&, w] {
      while (!reading.load()) std::this_thread::yield();
      Counter& total = registry.counter("kf_total", "All updates.");
      Counter& mine = registry.counter("kf_by_parity", "", {{"parity", std::to_string(w % 2)}});
      Gauge& gauge = registry.gauge("kf_gauge", "");
      Summary& summary = registry.summary("kf_summary", "", {{"writer", std::to_string(w)}});
      for (int i = 0; i < kUpdates; ++i) {
        total.inc();
        mine.inc(2);
        gauge.add(1);
        summary.observe(1);
      }
      writers_left.fetch_sub(1);
    }));
  }
  std::atomic<int> snapshots{0};
  threads.emplace_back(guarded([&] {
    do {
      reading.store(true);
      for (const auto& family : registry.snapshot()) {
        for (const auto& s : family.samples) {
          if (family.name == "kf_summary" && s.sum != static_cast<double>(s.count)) {
            throw std::runtime_error("a summary's sum and count were read apart");
          }
        }
      }
      snapshots.fetch_add(1);
    } while (writers_left.load() > 0);
  }));
  std::atomic<int> rejected{0};
  threads.emplace_back(guarded([&] {
    for (int i = 0; i < 1000; ++i) {
      try {
        registry.gauge("kf_total", "");  // a counter already
      } catch (const std::invalid_argument&) {
        rejected.fetch_add(1);
      }
      try {
        registry.counter("bad name", "");
      } catch (const std::invalid_argument&) {
        rejected.fetch_add(1);
      }
    }
  }));
  for (auto& t : threads) t.join();

  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_GE(snapshots.load(), 1);
  EXPECT_GE(rejected.load(), 1000);
  const double updates = double{kWriters} * kUpdates;
  EXPECT_EQ(registry.counter("kf_total", "All updates.").value(), updates);
  EXPECT_EQ(registry.counter("kf_by_parity", "", {{"parity", "0"}}).value(), updates);
  EXPECT_EQ(registry.counter("kf_by_parity", "", {{"parity", "1"}}).value(), updates);
  EXPECT_EQ(registry.gauge("kf_gauge", "").value(), updates);
  const auto families = registry.snapshot();
  ASSERT_EQ(families.size(), 4u);  // the invalid attempts added nothing
  EXPECT_EQ(families[3].name, "kf_total");
  ASSERT_EQ(families[2].samples.size(), std::size_t{kWriters});
  for (const auto& s : families[2].samples) EXPECT_EQ(s.count, std::uint64_t{kUpdates});
}

}  // namespace
}  // namespace kf::monitor
