// SPDX-License-Identifier: Apache-2.0
// run_group with /bin/sh children: captured output, exit codes, the deadline, a failing member
// ending its group, and a command that cannot be executed.
#include "kf-bench/lib/spawn.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace kf::tools::bench {
namespace {

using namespace std::chrono_literals;

Command sh(const std::string& script, std::vector<EnvChange> env = {}) {
  return Command{{"/bin/sh", "-c", script}, std::move(env)};
}

TEST(RunGroup, CapturesOutputAndExitCodes) {
  const GroupResult r =
      run_group({sh("echo out; echo err >&2; echo \"$KF_SPAWN_TEST_A-${KF_SPAWN_TEST_B-unset}\""),
                 sh("exit 0")},
                GroupLimits{10s, 1s});
  ASSERT_EQ(r.processes.size(), 2u);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.processes[0].out, "out\n-unset\n");
  EXPECT_EQ(r.processes[0].err, "err\n");
  const GroupResult with_env =
      run_group({sh("echo \"$KF_SPAWN_TEST_A-${KF_SPAWN_TEST_B-unset}\"",
                    {{"KF_SPAWN_TEST_A", "x"}, {"KF_SPAWN_TEST_B", std::nullopt}})},
                {10s, 1s});
  EXPECT_EQ(with_env.processes[0].out, "x-unset\n");
}

TEST(RunGroup, AFailingMemberStopsTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  const GroupResult r = run_group({sh("exec sleep 30"), sh("exit 3")}, GroupLimits{60s, 5s});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.processes[0].exit_code, 128 + 15);  // SIGTERM
  EXPECT_EQ(r.processes[1].exit_code, 3);
}

TEST(RunGroup, TheDeadlineEndsTheWholeGroup) {
  const auto start = std::chrono::steady_clock::now();
  // The shell ignores SIGTERM, and its child holds stdout open: SIGKILL to the group ends both.
  const GroupResult r =
      run_group({sh("trap '' TERM; sleep 30 & echo started; wait")}, GroupLimits{300ms, 300ms});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.processes[0].out, "started\n");
  EXPECT_EQ(r.processes[0].exit_code, 128 + 9);  // SIGKILL
}

TEST(RunGroup, ReportsACommandThatCannotBeExecuted) {
  const GroupResult r = run_group({Command{{"/nonexistent/kf-bench-gloo"}, {}}}, {10s, 1s});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.processes[0].exit_code, 127);
  EXPECT_NE(r.processes[0].err.find("cannot execute /nonexistent/kf-bench-gloo"), std::string::npos)
      << r.processes[0].err;
}

}  // namespace
}  // namespace kf::tools::bench
