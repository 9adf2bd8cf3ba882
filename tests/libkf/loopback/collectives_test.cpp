// SPDX-License-Identifier: Apache-2.0
// Every operation x algorithm x worker count over real TCP connections on 127.0.0.1, with the
// ranks as threads of this process. Values are small integers so that float sums are exact and
// results can be compared for equality.
#include "kf/peer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "support/local_cluster.hpp"

namespace kf {
namespace {

using Param = std::tuple<Algorithm, int>;

float val(int r, std::size_t i) { return static_cast<float>((r + 1) + static_cast<int>(i % 13)); }

class Collectives : public ::testing::TestWithParam<Param> {};

TEST_P(Collectives, EveryOperationGivesTheExpectedResult) {
  const auto [algo, p] = GetParam();
  auto peers = test::make_local_cluster(p);
  std::mutex mu;  // guards failures
  std::vector<std::string> failures;
  auto fail = [&](int r, const std::string& what) {
    std::lock_guard<std::mutex> lk(mu);
    failures.push_back("rank " + std::to_string(r) + ": " + what);
  };
  test::run_all(p, [&](int r) {
    Peer& peer = *peers[static_cast<std::size_t>(r)];
    CollOptions o;
    o.algorithm = algo;
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}}) {
      const std::string tag = "#" + std::to_string(n);
      // allreduce sum, in place and out of place
      std::vector<float> in(n), out(n);
      for (std::size_t i = 0; i < n; ++i) in[i] = val(r, i);
      peer.allreduce("ar" + tag, buffer(in.data(), n), buffer(out.data(), n), o).wait();
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, i);
        if (out[i] != want) return fail(r, "allreduce sum n=" + std::to_string(n));
      }
      // allreduce max over i32, in place
      std::vector<std::int32_t> m(n);
      for (std::size_t i = 0; i < n; ++i) m[i] = static_cast<std::int32_t>((r * 7 + i) % 11);
      CollOptions om = o;
      om.op = ReduceOp::max;
      peer.allreduce("max" + tag, buffer(m.data(), n), buffer(m.data(), n), om).wait();
      for (std::size_t i = 0; i < n; ++i) {
        std::int32_t want = 0;
        for (int q = 0; q < p; ++q)
          want = std::max(want, static_cast<std::int32_t>((q * 7 + i) % 11));
        if (m[i] != want) return fail(r, "allreduce max n=" + std::to_string(n));
      }
      // broadcast from the last rank
      std::vector<double> b(n, -1.0);
      if (r == p - 1) {
        for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<double>(i) * 0.5;
      }
      CollOptions ob = o;
      ob.root = p - 1;
      peer.broadcast("bc" + tag, buffer(b.data(), n), ob).wait();
      for (std::size_t i = 0; i < n; ++i) {
        if (b[i] != static_cast<double>(i) * 0.5)
          return fail(r, "broadcast n=" + std::to_string(n));
      }
      // allgather
      std::vector<float> g(n * p, -1.f);
      peer.allgather("ag" + tag, buffer(in.data(), n), buffer(g.data(), n * p), o).wait();
      for (int q = 0; q < p; ++q) {
        for (std::size_t i = 0; i < n; ++i) {
          if (g[q * n + i] != val(q, i)) return fail(r, "allgather n=" + std::to_string(n));
        }
      }
      // reduce_scatter (input: p blocks of n)
      std::vector<float> rin(n * p), rout(n, -1.f);
      for (std::size_t i = 0; i < n * p; ++i) rin[i] = val(r, i);
      peer.reduce_scatter("rs" + tag, buffer(rin.data(), n * p), buffer(rout.data(), n), o).wait();
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, r * n + i);
        if (rout[i] != want) return fail(r, "reduce_scatter n=" + std::to_string(n));
      }
      for (std::size_t i = 0; i < n * p; ++i) {  // blocks are sent from the input, never into it
        if (rin[i] != val(r, i)) return fail(r, "reduce_scatter wrote into its input");
      }
      // and with the result written over the front of the input
      peer.reduce_scatter("rsi" + tag, buffer(rin.data(), n * p), buffer(rin.data(), n), o).wait();
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += val(q, r * n + i);
        if (rin[i] != want) return fail(r, "reduce_scatter into its input n=" + std::to_string(n));
      }
      // gather at the middle rank
      CollOptions og = o;
      og.root = p / 2;
      std::vector<float> ga(r == og.root ? n * p : 0, -1.f);
      peer.gather("ga" + tag, buffer(in.data(), n), buffer(ga.data(), ga.size()), og).wait();
      if (r == og.root) {
        for (int q = 0; q < p; ++q) {
          for (std::size_t i = 0; i < n; ++i) {
            if (ga[q * n + i] != val(q, i)) return fail(r, "gather n=" + std::to_string(n));
          }
        }
      }
    }
    peer.barrier("barrier", o).wait();
    // consensus: same bytes everywhere, then one rank differs
    std::vector<std::uint8_t> same(33, 7);
    bool agreed = false;
    peer.consensus("cons1", buffer(same.data(), same.size()), &agreed, o).wait();
    if (!agreed) return fail(r, "consensus on equal bytes said no");
    std::vector<std::uint8_t> diff(33, 7);
    if (r == p - 1) diff[5] = 8;
    peer.consensus("cons2", buffer(diff.data(), diff.size()), &agreed, o).wait();
    if (agreed != (p == 1)) return fail(r, "consensus on different bytes gave the wrong answer");
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST_P(Collectives, ChunkedLargeAllreduceIsBitwiseIdenticalEverywhere) {
  const auto [algo, p] = GetParam();
  if (p > 5) GTEST_SKIP() << "large messages are swept up to 5 workers to keep the suite short";
#if defined(__SANITIZE_THREAD__)
  // TSan looks for races between the lanes, the I/O thread and the waiters, which 5 workers
  // have all of (4 where recursive doubling and auto take their power-of-two path, 2 where one
  // lane runs alone); each case costs 1-3 s under it (0.7 s with one worker: this test's own
  // loops). The release and ASan builds sweep every count.
  const bool kept = p == 5 ||
                    (p == 4 && (algo == Algorithm::rhd || algo == Algorithm::auto_select)) ||
                    (p == 2 && algo == Algorithm::auto_select);
  if (!kept) {
    GTEST_SKIP() << "under TSan, large messages run with 5 workers (4 with rhd and auto, 2 with "
                    "auto)";
  }
#endif
  auto peers = test::make_local_cluster(p);
  const std::size_t n = (std::size_t{9} << 20) / 4 + 3;  // > 2 pipeline lanes, odd count
  std::vector<std::vector<float>> out(p, std::vector<float>(n));
  test::run_all(p, [&](int r) {
    std::vector<float> in(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = 1.0f / static_cast<float>(r + 1 + (i % 97));
    CollOptions o;
    o.algorithm = algo;
    peers[r]->allreduce("big", buffer(in.data(), n), buffer(out[r].data(), n), o).wait();
  });
  for (int r = 1; r < p; ++r) {
    ASSERT_EQ(std::memcmp(out[0].data(), out[r].data(), n * 4), 0) << "rank " << r << " differs";
  }
  // Every 61st element against its sum (the order of the additions is the plan's, hence the
  // tolerance): a reduction cut into slices (PeerImpl::advance) that lost its place would put
  // some range's values on every rank alike, which the comparison above cannot see.
  for (std::size_t i = 0; i < n; i += 61) {
    float want = 0;
    for (int q = 0; q < p; ++q) want += 1.0f / static_cast<float>(q + 1 + (i % 97));
    ASSERT_NEAR(out[0][i], want, 1e-5f * want) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Loopback, Collectives,
    ::testing::Combine(::testing::Values(Algorithm::star, Algorithm::ring, Algorithm::tree,
                                         Algorithm::clique, Algorithm::rhd, Algorithm::hierarchical,
                                         Algorithm::auto_select),
                       ::testing::Values(1, 2, 3, 4, 5, 8)),
    [](const auto& tpi) {
      return std::string(to_string(std::get<0>(tpi.param))) + "_p" +
             std::to_string(std::get<1>(tpi.param));
    });

// The express path (PeerOptions::express_bytes) sends the plan's frames: workers that run tiny
// allreduces and barriers through it and workers that run them through the plan (express off)
// give the same, bitwise identical results in one job. Fractions make the sums depend on the
// grouping, so a worker that reduced in another order would differ. A short timeout turns a
// frame that the other side never matches into a failure instead of a hang.
TEST(Express, WorkersWithAndWithoutItAgree) {
  for (const int p : {2, 4, 8}) {
    std::vector<PeerOptions> options(static_cast<std::size_t>(p));
    for (std::size_t i = 0; i < options.size(); i += 2) options[i].express_bytes = 0;
    auto peers = test::make_local_cluster(options);
    const std::vector<std::size_t> counts = {1, 7, 256, 4096};
    std::vector<std::vector<std::vector<float>>> sums(p), avgs(p);
    std::vector<std::vector<std::int32_t>> maxes(p);
    std::vector<std::string> failed(p);
    test::run_all(p, [&](int r) {
      Peer& peer = *peers[static_cast<std::size_t>(r)];
      CollOptions o;
      o.timeout = std::chrono::milliseconds(2000);
      auto run = [&](Handle h, const std::string& what) {
        if (const auto ec = h.wait_status(); ec && failed[r].empty()) {
          failed[r] = what + ": " + h.message();
        }
      };
      for (const std::size_t n : counts) {
        std::vector<float> in(n), out(n, -1.f), avg(n);
        for (std::size_t i = 0; i < n; ++i) {
          in[i] = 1.0f / static_cast<float>(3 + r * 5 + static_cast<int>(i % 11));
          avg[i] = in[i];
        }
        run(peer.barrier("b#" + std::to_string(n), o), "barrier");
        run(peer.allreduce("sum#" + std::to_string(n), buffer(in.data(), n), buffer(out.data(), n),
                           o),
            "sum");
        CollOptions oa = o;
        oa.op = ReduceOp::avg;
        run(peer.allreduce("avg#" + std::to_string(n), buffer(avg.data(), n), buffer(avg.data(), n),
                           oa),
            "avg");
        sums[r].push_back(out);
        avgs[r].push_back(avg);
      }
      std::int32_t m = 10 * r - 7;
      CollOptions om = o;
      om.op = ReduceOp::max;
      run(peer.allreduce("max", buffer(&m, 1), buffer(&m, 1), om), "max");
      maxes[r].push_back(m);
    });
    for (int r = 0; r < p; ++r)
      ASSERT_TRUE(failed[r].empty()) << "p=" << p << " rank " << r << ": " << failed[r];
    for (std::size_t k = 0; k < counts.size(); ++k) {
      const std::size_t n = counts[k];
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0;
        for (int q = 0; q < p; ++q) want += 1.0 / (3 + q * 5 + static_cast<int>(i % 11));
        ASSERT_NEAR(sums[0][k][i], want, 1e-5) << "p=" << p << " n=" << n << " i=" << i;
        ASSERT_NEAR(avgs[0][k][i], want / p, 1e-6) << "p=" << p << " n=" << n << " i=" << i;
      }
      for (int r = 1; r < p; ++r) {
        EXPECT_EQ(std::memcmp(sums[0][k].data(), sums[r][k].data(), n * 4), 0)
            << "p=" << p << " n=" << n << ": rank " << r << "'s sum differs";
        EXPECT_EQ(std::memcmp(avgs[0][k].data(), avgs[r][k].data(), n * 4), 0)
            << "p=" << p << " n=" << n << ": rank " << r << "'s average differs";
      }
    }
    for (int r = 0; r < p; ++r) EXPECT_EQ(maxes[r][0], 10 * (p - 1) - 7) << "p=" << p;
  }
}

// A partner that leaves (says goodbye) while an express allreduce waits for its frame fails that
// allreduce at once, not at its deadline.
TEST(Express, APartnerThatLeavesFailsTheWaitingAllreduce) {
  auto peers = test::make_local_cluster(2);
  float x = 1;
  CollOptions o;
  o.timeout = std::chrono::milliseconds(60000);  // only the departure can end it in time
  Handle h = peers[0]->allreduce("left", buffer(&x, 1), buffer(&x, 1), o);
  // The connection exists before the partner leaves, so that its goodbye reaches rank 0.
  int sync = 1;
  test::run_all(2, [&](int r) {
    if (r == 1) {
      peers[1]->allreduce("hello", buffer(&sync, 1), buffer(&sync, 1)).wait();
    } else {
      int mine = 1;
      peers[0]->allreduce("hello", buffer(&mine, 1), buffer(&mine, 1)).wait();
    }
  });
  const auto start = std::chrono::steady_clock::now();
  peers[1].reset();
  const std::error_code ec = h.wait_status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(ec, make_error_code(errc::peer_lost)) << h.message();
  EXPECT_NE(h.message().find("allreduce 'left'"), std::string::npos) << h.message();
}

// Blocks above 8 MiB are gathered in two lanes, each taking its part of every block: for every
// algorithm that runs lanes (star and clique do not), with up to 4 workers.
TEST(LargeAllgather, LanesCollectEveryBlock) {
  const std::size_t n = (std::size_t{9} << 20) / 4 + 3;
  // Every worker's block, as the gather must deliver them; each worker sends its own from here.
  // The buffers are made once: the sanitizer builds check each access of a loop over them, and
  // fresh ones fault in their pages and the sanitizer's shadow of them for every case. So the
  // results are set with memset (to NaN, which equals nothing) and compared with one memcmp,
  // and counted element by element only when they differ.
  std::vector<float> blocks(n * 4);
  for (int q = 0; q < 4; ++q) {
    for (std::size_t i = 0; i < n; ++i) blocks[q * n + i] = val(q, i);
  }
  std::vector<std::vector<float>> outs(4, std::vector<float>(n * 4));
  for (const Algorithm algo :
       {Algorithm::ring, Algorithm::tree, Algorithm::rhd, Algorithm::auto_select}) {
    for (const int p : {2, 3, 4}) {
      auto peers = test::make_local_cluster(p);
      std::vector<int> wrong(p, 0);
      test::run_all(p, [&](int r) {
        float* out = outs[r].data();
        std::memset(out, 0xff, n * p * sizeof(float));
        CollOptions o;
        o.algorithm = algo;
        peers[r]->allgather("big", buffer(blocks.data() + r * n, n), buffer(out, n * p), o).wait();
        if (std::memcmp(out, blocks.data(), n * p * sizeof(float)) != 0) {
          for (std::size_t i = 0; i < n * p; ++i) wrong[r] += out[i] != blocks[i];
        }
      });
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(wrong[r], 0) << to_string(algo) << " p=" << p << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace kf
