// SPDX-License-Identifier: Apache-2.0
// Stands in for the LibTorch adapter's tests in a build without LibTorch.
#include <gtest/gtest.h>

TEST(TorchAdapter, NeedsLibTorch) {
  GTEST_SKIP() << "LibTorch was not found when this build was configured (install libtorch-dev "
                  "and reconfigure, or -Dtorch=enabled to make its absence an error)";
}
