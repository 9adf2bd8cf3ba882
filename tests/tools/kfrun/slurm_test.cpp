// SPDX-License-Identifier: Apache-2.0
// kfrun --slurm: what the agent takes from Slurm's environment (a fake one here), and the clear
// errors outside an allocation or with Slurm's variables missing or malformed.
#include "kfrun/lib/slurm.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <map>
#include <stdexcept>
#include <string>

namespace kf::tools {
namespace {

EnvLookup fake(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

AgentOptions external() {
  AgentOptions o;
  o.config_server = "http://127.0.0.1:7070";
  return o;
}

std::string error_of(AgentOptions o, const EnvLookup& env, bool host_given = false) {
  try {
    apply_slurm(o, host_given, env);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Slurm, TakesTheSlotsTheHostAndTheWorkersFromTheAllocation) {
  AgentOptions o = external();
  apply_slurm(o, false, fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "2"}}));
  EXPECT_EQ(o.slots, 2);
  EXPECT_EQ(o.np, 2);
  EXPECT_TRUE(o.join);
  EXPECT_EQ(o.host, "127.0.0.1");  // the route to the service at 127.0.0.1
  EXPECT_EQ(o.notice.signals, (std::vector<int>{SIGUSR1, SIGTERM}));
}

TEST(Slurm, GpusWinOverCpusAndTheCommandLineWinsOverBoth) {
  AgentOptions o = external();
  apply_slurm(
      o, false,
      fake({{"SLURM_JOB_ID", "17"}, {"SLURM_GPUS_ON_NODE", "4"}, {"SLURM_CPUS_ON_NODE", "64"}}));
  EXPECT_EQ(o.slots, 4);
  o = external();
  apply_slurm(
      o, false,
      fake({{"SLURM_JOB_ID", "17"}, {"SLURM_GPUS_ON_NODE", "0"}, {"SLURM_CPUS_ON_NODE", "8"}}));
  EXPECT_EQ(o.slots, 8);
  o = external();
  o.slots = 3;
  o.np = 1;
  o.host = "10.1.2.3";
  o.notice.signals = {SIGUSR2};
  apply_slurm(o, true, fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "8"}}));
  EXPECT_EQ(o.slots, 3);
  EXPECT_EQ(o.np, 1);
  EXPECT_EQ(o.host, "10.1.2.3");
  EXPECT_EQ(o.notice.signals, (std::vector<int>{SIGUSR2}));
}

TEST(Slurm, SaysWhatIsWrongOutsideAnAllocationOrWithBadVariables) {
  EXPECT_NE(error_of(external(), fake({{"SLURM_CPUS_ON_NODE", "2"}})).find("SLURM_JOB_ID"),
            std::string::npos);
  EXPECT_NE(error_of(external(), fake({{"SLURM_JOB_ID", "17"}})).find("SLURM_CPUS_ON_NODE"),
            std::string::npos);
  const auto bad =
      error_of(external(), fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "2(x3)"}}));
  EXPECT_NE(bad.find("SLURM_CPUS_ON_NODE='2(x3)'"), std::string::npos) << bad;
  EXPECT_NE(error_of(external(), fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "0"}}))
                .find("SLURM_CPUS_ON_NODE='0'"),
            std::string::npos);
  AgentOptions builtin;
  builtin.config_server = "builtin";
  EXPECT_NE(error_of(builtin, fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "2"}}))
                .find("not builtin"),
            std::string::npos);
  AgentOptions nowhere = external();
  nowhere.config_server = "http://no-such-host.invalid:7070";
  EXPECT_NE(error_of(nowhere, fake({{"SLURM_JOB_ID", "17"}, {"SLURM_CPUS_ON_NODE", "2"}}))
                .find("'no-such-host.invalid'"),
            std::string::npos);
}

TEST(Slurm, RequeueTakesTheJobIdAndRefusesAnythingElse) {
  AgentOptions o = external();
  apply_slurm_requeue(o, fake({{"SLURM_JOB_ID", "4711"}}));
  EXPECT_EQ(o.requeue_job, "4711");
  apply_slurm_requeue(o, fake({{"SLURM_JOB_ID", "4711_3"}}));
  EXPECT_EQ(o.requeue_job, "4711_3");
  for (const std::string bad : {"", "12; rm -rf /", "abc", "1 2"}) {
    AgentOptions b = external();
    try {
      apply_slurm_requeue(b, fake({{"SLURM_JOB_ID", bad}}));
      ADD_FAILURE() << "took '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is not a Slurm job id"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(b.requeue_job);
  }
}

}  // namespace
}  // namespace kf::tools
