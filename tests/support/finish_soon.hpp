// SPDX-License-Identifier: Apache-2.0
// A setting of a test's elastic job, written by compare-and-swap; finish_soon() ends the job at
// the end of the epoch its workers are in (settings "epochs" = 1, which the worker programs of
// tests/support read). For the suites that run such jobs (multiproc, cluster, slurm).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "kf/runtime/config_client.hpp"

namespace kf::test {

/// settings[key] = value by compare-and-swap, read again after each conflict.
inline void write_setting(ConfigClient& client, const std::string& key,
                          const nlohmann::json& value) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    Cluster cur = client.get_cluster();
    cur.settings[key] = value;
    try {
      client.put_cluster(cur);
      return;
    } catch (const ConflictError&) {
      // Changed in between (a recovery, a policy): read it again.
    }
  }
  ADD_FAILURE() << "could not set the job's " << key;
}

inline void finish_soon(ConfigClient& client) { write_setting(client, "epochs", 1); }

}  // namespace kf::test
