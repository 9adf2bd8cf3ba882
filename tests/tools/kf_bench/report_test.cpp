// SPDX-License-Identifier: Apache-2.0
#include "kf-bench/lib/report.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace kf::tools::bench {
namespace {

Row sample_row() {
  Row row;
  row.algo = "auto(ring)";
  row.bytes = 4096;
  row.count = 1024;
  row.iters = 200;
  row.median_us = 12.5;
  row.p90_us = 20.0;
  row.algbw_gbps = 0.3;
  row.busbw_gbps = 0.45;
  row.correct = true;
  return row;
}

TEST(Report, TransportLineNamesEveryPathAndTheEarlyBytes) {
  TransportStats s;
  s.tcp_bytes = 1;
  s.socket_bytes = 22;
  s.shm_bytes = 333;
  s.single_copy_bytes = 4444;
  s.early_bytes = 55555;
  s.shared_read_bytes = 666666;
  std::ostringstream out;
  print_transport(out, s);
  EXPECT_EQ(out.str(),
            "# rank 0 sent: tcp 1 B, same-host socket 22 B, shared-memory ring 333 B, single "
            "copy 4444 B; received before the receive was posted: 55555 B; read in place from "
            "peers' shared memory: 666666 B\n");
}

TEST(Report, JsonRowHasEveryKeyOnOneLine) {
  const RunInfo info{CollOp::reduce_scatter, 4, DType::bf16, ReduceOp::avg, 0, 5};
  std::ostringstream out;
  print_row(out, info, sample_row(), true);
  const std::string text = out.str();
  ASSERT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);
  const auto j = nlohmann::json::parse(text);
  for (const char* key : {"op", "algo", "np", "dtype", "reduce_op", "bytes", "count", "iters",
                          "median_us", "p90_us", "algbw_gbps", "busbw_gbps", "correct"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["op"], "reduce-scatter");
  EXPECT_EQ(j["algo"], "auto(ring)");
  EXPECT_EQ(j["np"], 4);
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["reduce_op"], "avg");
  EXPECT_FALSE(j.contains("root"));
  EXPECT_EQ(j["correct"], true);
}

TEST(Report, JsonNamesTheRootOfRootedCollectives) {
  const RunInfo info{CollOp::gather, 3, DType::f32, ReduceOp::sum, 2, 5};
  const auto j = to_json(info, sample_row());
  EXPECT_EQ(j["root"], 2);
  EXPECT_FALSE(j.contains("reduce_op"));
}

TEST(Report, TableHeaderDefinesTheColumnsAndRowsAlign) {
  const RunInfo info{CollOp::allreduce, 2, DType::f32, ReduceOp::sum, 0, 5};
  std::ostringstream out;
  print_header(out, info);
  const std::string header = out.str();
  EXPECT_NE(header.find("np=2"), std::string::npos);
  EXPECT_NE(header.find("2(n-1)/n"), std::string::npos);
  std::ostringstream row;
  print_row(row, info, sample_row(), false);
  const std::string last = header.substr(header.rfind("# "));
  EXPECT_EQ(last.size(), row.str().size());  // columns line up
  EXPECT_NE(row.str().find("auto(ring)"), std::string::npos);
  EXPECT_NE(row.str().find("true"), std::string::npos);
}

}  // namespace
}  // namespace kf::tools::bench
