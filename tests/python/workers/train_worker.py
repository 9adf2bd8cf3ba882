# SPDX-License-Identifier: Apache-2.0
"""A kf worker (started by kfrun) that trains common.Net on its rows of common's batch with a
kf.torch.DistributedOptimizer, and saves its parameters to OUT.<optimizer>.<rank>: for each
optimizer named, one after the other, each in a session of its own (one start of Python and
torch for them all).
    train_worker.py STEPS OUT OPTIMIZER..."""

import gc
import sys

import torch

import common
import kf
import kf.torch


def train(name, steps, out):
    state = kf.State()
    session = kf.Session(state)
    # Every worker starts from its own weights: rank 0's (those of plain PyTorch) reach the
    # others when they join.
    net = common.make_net(1 + session.rank)
    opt = kf.torch.DistributedOptimizer(session, common.OPTIMIZERS[name](net.parameters()))
    opt.register_state(state, net)
    assert session.join()
    x, y = common.make_data()
    n, r = session.size, session.rank
    lo, hi = common.ROWS * r // n, common.ROWS * (r + 1) // n

    def body():
        opt.zero_grad()
        opt.begin_step(hi - lo, common.ROWS)
        torch.nn.functional.cross_entropy(net(x[lo:hi]), y[lo:hi]).backward()
        opt.step()

    for _ in range(steps):
        assert session.step(body) == kf.COMMITTED
    torch.save([p.detach() for p in net.parameters()], "%s.%s.%d" % (out, name, r))


def main():
    steps, out = int(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    for name in sys.argv[3:]:
        train(name, steps, out)
        gc.collect()  # this optimizer's session ends before the next one's starts
    return 0


if __name__ == "__main__":
    sys.exit(main())
