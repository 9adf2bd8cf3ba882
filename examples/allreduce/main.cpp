// SPDX-License-Identifier: Apache-2.0
// The smallest kf program: every worker contributes its rank + 1 and checks the sum.
// Build against an installed kf:  c++ -std=c++20 main.cpp $(pkg-config --cflags --libs kf)
// Run:                            kfrun -np 4 -- ./a.out
#include <kf/peer.hpp>

#include <cstdio>
#include <vector>

int main() {
  try {
    auto peer = kf::Peer::from_environment();
    const int n = peer->size();
    std::vector<float> v(1000, static_cast<float>(peer->rank() + 1));
    peer->allreduce("example", kf::buffer(v.data(), v.size()), kf::buffer(v.data(), v.size()))
        .wait();
    const float want = static_cast<float>(n * (n + 1) / 2);
    std::printf("rank %d of %d: sum %.0f (%s)\n", peer->rank(), n, v[0],
                v[0] == want ? "ok" : "WRONG");
    return v[0] == want ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example: %s\n", e.what());
    return 1;
  }
}
