// SPDX-License-Identifier: Apache-2.0
// The Kubernetes manifests of deploy/kubernetes/ (no cluster runs here): every file parses as
// YAML, every kfrun option they pass is one kfrun has (from `kfrun --help`, the real binary),
// the agents' grace fits in the pods' termination grace, and what they name (the etcd Service,
// the token Secret, the checkpoint claim) is defined by the other files.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace kf::test {
namespace {

namespace fs = std::filesystem;

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Every document of every manifest, by "Kind/name".
std::map<std::string, YAML::Node> load_manifests() {
  std::map<std::string, YAML::Node> found;
  for (const auto& entry : fs::directory_iterator(env_or_empty("KF_DEPLOY_DIR"))) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& doc : YAML::LoadAllFromFile(entry.path().string())) {
      found[doc["kind"].as<std::string>() + "/" + doc["metadata"]["name"].as<std::string>()] = doc;
    }
  }
  return found;
}

// kfrun's long options, as its --help lists them.
std::set<std::string> kfrun_options() {
  const auto help = run_shell(env_or_empty("KFRUN") + " --help");
  std::set<std::string> options;
  const std::regex option(R"((^|\n)\s+(-\w,)?(--[a-z][a-z-]*))");
  for (auto it = std::sregex_iterator(help.output.begin(), help.output.end(), option);
       it != std::sregex_iterator(); ++it) {
    options.insert((*it)[3]);
  }
  return options;
}

TEST(KubernetesManifests, ParseAndDefineTheAgentsTheControlPlaneAndTheToken) {
  ASSERT_FALSE(env_or_empty("KF_DEPLOY_DIR").empty());
  const auto docs = load_manifests();
  for (const char* needed : {"StatefulSet/kf-agents", "StatefulSet/kf-etcd", "Service/kf-etcd",
                             "Secret/kf-job-token", "PersistentVolumeClaim/kf-checkpoint"}) {
    EXPECT_TRUE(docs.contains(needed)) << needed;
  }
}

TEST(KubernetesManifests, TheAgentsPassOnlyOptionsKfrunHasAndFitTheirGrace) {
  const auto options = kfrun_options();
  ASSERT_TRUE(options.contains("--watch")) << "kfrun --help listed no options";
  const auto docs = load_manifests();
  ASSERT_TRUE(docs.contains("StatefulSet/kf-agents"));
  const YAML::Node pod = docs.at("StatefulSet/kf-agents")["spec"]["template"]["spec"];
  const YAML::Node agent = pod["containers"][0];
  std::vector<std::string> command;
  for (const auto& a : agent["command"]) command.push_back(a.as<std::string>());
  ASSERT_FALSE(command.empty());
  EXPECT_EQ(command.front(), "kfrun");
  std::map<std::string, std::string> values;
  for (std::size_t i = 1; i < command.size() && command[i] != "--"; ++i) {
    const std::string& arg = command[i];
    if (!arg.starts_with("-")) continue;  // a value
    EXPECT_TRUE(arg == "-np" || options.contains(arg)) << arg << " is not an option of kfrun";
    if (i + 1 < command.size() && !command[i + 1].starts_with("-")) values[arg] = command[i + 1];
  }
  EXPECT_NE(std::find(command.begin(), command.end(), "--watch"), command.end());
  // SIGTERM is the notice, and the agent is gone before Kubernetes sends SIGKILL.
  EXPECT_EQ(values["--on-sigterm"], "leave");
  ASSERT_TRUE(values.contains("--grace"));
  EXPECT_LT(std::stoi(values["--grace"]), pod["terminationGracePeriodSeconds"].as<int>());
  // What it names is defined.
  EXPECT_EQ(values["--config-server"], "etcd://kf-etcd:2379");
  EXPECT_TRUE(docs.contains("Service/kf-etcd"));
  bool token = false, claim = false;
  for (const auto& v : pod["volumes"]) {
    if (v["secret"]) token = v["secret"]["secretName"].as<std::string>() == "kf-job-token";
    if (v["persistentVolumeClaim"]) {
      claim = docs.contains("PersistentVolumeClaim/" +
                            v["persistentVolumeClaim"]["claimName"].as<std::string>());
    }
  }
  EXPECT_TRUE(token);
  EXPECT_TRUE(claim);
  EXPECT_EQ(agent["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
}

}  // namespace
}  // namespace kf::test
