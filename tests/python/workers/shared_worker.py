# SPDX-License-Identifier: Apache-2.0
"""A worker of a 2-worker job: allreduces an 8 MiB tensor from kf.shared_tensor and an ordinary
one, checks both sums, and prints "ok: ..." with what it read in place from its peer."""

import torch

import kf


def main():
    torch.set_num_threads(1)
    session = kf.Session(kf.State())
    assert session.join()
    n = 1 << 21  # 8 MiB of float32: pieces too large for the rings, which go single-copy
    shared = kf.shared_tensor((2, n // 2))
    shared.fill_(session.rank + 1)
    session.allreduce(shared, "shared")
    assert torch.all(shared == 3), shared
    after_shared = session.transport_stats["shared_read_bytes"]
    plain = torch.full((n,), float(session.rank + 1))
    session.allreduce(plain, "plain")
    assert torch.all(plain == 3), plain
    after_plain = session.transport_stats["shared_read_bytes"]
    assert after_shared > 0, session.transport_stats
    assert after_plain == after_shared, session.transport_stats
    print("ok: rank %d read %d bytes in place" % (session.rank, after_shared), flush=True)
    session.finish()


if __name__ == "__main__":
    main()
