// SPDX-License-Identifier: Apache-2.0
// Plugins that load_plugin must refuse, built from this one file: without a plugin API version
// (KF_TEST_NO_VERSION: an entry point as plugins had before the version), and with another
// version (KF_TEST_API=N).
#include "kf/policies/policy.hpp"

#ifdef KF_TEST_NO_VERSION
extern "C" void kf_register_policies(kf::PolicyRegistry* registry) {
  registry->add("never", [](const nlohmann::json&) -> std::unique_ptr<kf::Policy> { return {}; });
}
#else
extern "C" int kf_policy_plugin_api_version() { return KF_TEST_API; }
extern "C" void kf_register_policies(kf::PolicyRegistry* registry) {
  registry->add("never", [](const nlohmann::json&) -> std::unique_ptr<kf::Policy> { return {}; });
}
#endif
