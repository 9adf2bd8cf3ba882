// SPDX-License-Identifier: Apache-2.0
// Telling an orphaned worker from the rest of a host's processes (kfrun/lib/adopt.hpp).
#include "kfrun/lib/adopt.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "kf/common/fd.hpp"

namespace kf::tools {
namespace {

ProcessFacts worker(pid_t pid, pid_t parent, pid_t group, std::vector<std::string> env) {
  return ProcessFacts{pid, parent, group, std::move(env)};
}

const std::vector<std::string> kEnv{"PATH=/bin", "KF_JOB_ID=job-1", "KF_SELF=10.0.0.2:7001",
                                    "KF_AGENT_PID=500"};

TEST(Adopt, AWorkerWhoseAgentIsGoneIsAnOrphan) {
  const auto o = orphan_of(worker(700, 1, 700, kEnv), "job-1", "10.0.0.2");
  ASSERT_TRUE(o);
  EXPECT_EQ(o->pid, 700);
  EXPECT_EQ(o->name, "10.0.0.2:7001");
  // Reparented to a subreaper rather than init: still an orphan.
  EXPECT_TRUE(orphan_of(worker(700, 42, 700, kEnv), "job-1", "10.0.0.2"));
}

TEST(Adopt, OthersAreNot) {
  // Its agent still runs (is its parent).
  EXPECT_FALSE(orphan_of(worker(700, 500, 700, kEnv), "job-1", "10.0.0.2"));
  // A helper the worker forked: not the leader of its process group.
  EXPECT_FALSE(orphan_of(worker(701, 1, 700, kEnv), "job-1", "10.0.0.2"));
  // Another job, another host, a host that only shares a prefix.
  EXPECT_FALSE(orphan_of(worker(700, 1, 700, kEnv), "job-2", "10.0.0.2"));
  EXPECT_FALSE(orphan_of(worker(700, 1, 700, kEnv), "job-1", "10.0.0.3"));
  EXPECT_FALSE(orphan_of(worker(700, 1, 700, kEnv), "job-1", "10.0.0."));
  // Not started by an agent (a static job's worker), or with a nonsense agent pid.
  EXPECT_FALSE(orphan_of(worker(700, 1, 700, {"KF_JOB_ID=job-1", "KF_SELF=10.0.0.2:7001"}), "job-1",
                         "10.0.0.2"));
  EXPECT_FALSE(
      orphan_of(worker(700, 1, 700, {"KF_JOB_ID=job-1", "KF_SELF=10.0.0.2:7001", "KF_AGENT_PID=x"}),
                "job-1", "10.0.0.2"));
  EXPECT_FALSE(
      orphan_of(worker(700, 1, 700, {"KF_JOB_ID=job-1", "KF_SELF=nonsense", "KF_AGENT_PID=500"}),
                "job-1", "10.0.0.2"));
}

TEST(Adopt, ReadsThisProcessFromProc) {
  const auto me = read_process(::getpid());
  ASSERT_TRUE(me);
  EXPECT_EQ(me->pid, ::getpid());
  EXPECT_EQ(me->parent, ::getppid());
  EXPECT_EQ(me->group, ::getpgrp());
  EXPECT_FALSE(me->environment.empty());
  EXPECT_FALSE(read_process(0));
}

// kf::read_whole_file, which kfrun reads /proc with: a read that fails after the open (a /proc
// file of a process that exits meanwhile fails with ESRCH; a directory, here, with EISDIR) is
// "cannot be read", not an exception that ends kfrun.
TEST(Adopt, AFileThatCannotBeReadWholeIsNothingAndNoThrow) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kf-adopt-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(read_whole_file(dir.string()));
  EXPECT_FALSE(read_whole_file((dir / "missing").string()));
  // Longer than one read: every byte, in order.
  std::string text;
  for (int i = 0; i < 3000; ++i) text += std::to_string(i) + '\0';
  std::ofstream((dir / "environ").string(), std::ios::binary) << text;
  EXPECT_EQ(read_whole_file((dir / "environ").string()), text);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kf::tools
