// SPDX-License-Identifier: Apache-2.0
// Ends a test's elastic job at the end of the epoch its workers are in: settings "epochs" = 1,
// written by compare-and-swap (the worker programs of tests/support read it). For the suites
// that run such jobs (multiproc, cluster, slurm).
#pragma once

#include <gtest/gtest.h>

#include "kf/runtime/config_client.hpp"

namespace kf::test {

inline void finish_soon(ConfigClient& client) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    Cluster cur = client.get_cluster();
    cur.settings["epochs"] = 1;
    try {
      client.put_cluster(cur);
      return;
    } catch (const ConflictError&) {
      // Changed in between (a recovery, a policy): read it again.
    }
  }
  ADD_FAILURE() << "could not set the job's epochs";
}

}  // namespace kf::test
