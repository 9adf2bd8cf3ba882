# SPDX-License-Identifier: Apache-2.0
"""A kf worker (started by kfrun) that trains common.Net for two epochs over a TensorDataset
through a DataLoader with kf.torch.ElasticBatchSampler, and prints "step S epoch E i..." (the
samples it trained on) after each committed step."""

import sys

import torch

import common
import kf
import kf.torch


def main():
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    # The third tensor is each example's own index: what the loader really gave.
    data = torch.utils.data.TensorDataset(torch.randn(50, 10, generator=g),
                                          torch.randint(0, 3, (50,), generator=g),
                                          torch.arange(50))
    state = kf.State()
    epoch, position = state.counter("epoch"), state.counter("position")
    session = kf.Session(state, defaults={"batch_size": 8})
    net = common.make_net(1)
    opt = kf.torch.DistributedOptimizer(session, torch.optim.SGD(net.parameters(), lr=0.1))
    opt.register_state(state, net)
    assert session.join()
    sampler = kf.torch.ElasticBatchSampler(len(data), session, epoch, position, seed=3)
    while epoch.value < 2:
        for x, y, mine in torch.utils.data.DataLoader(data, batch_sampler=sampler):
            at = epoch.value

            def step():
                opt.zero_grad()
                opt.begin_step(len(x), sampler.step_samples)
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
                sampler.advance()

            assert session.step(step) == kf.COMMITTED
            print("step %d epoch %d %s" % (session.steps, at, " ".join(map(str, mine.tolist()))),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
