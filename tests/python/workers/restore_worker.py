# SPDX-License-Identifier: Apache-2.0
"""A kf worker (started by kfrun): the optimizer's state registered by kf.torch comes back with
State.restore() after steps that were not committed, and the next steps then give exactly what
they gave the first time. For each optimizer named, one after the other, each in a session of its
own.
    restore_worker.py OPTIMIZER..."""

import gc
import sys

import torch

import common
import kf
import kf.torch


def snapshot(opt):
    out = {}
    for i, p in enumerate(opt.param_groups[0]["params"]):
        for key, value in opt.state[p].items():
            out["%d/%s" % (i, key)] = value.clone() if torch.is_tensor(value) else value
    return out


def check(name):
    state = kf.State()
    session = kf.Session(state)
    net = common.make_net(1)
    base = common.OPTIMIZERS[name](net.parameters())
    opt = kf.torch.DistributedOptimizer(session, base)
    opt.register_state(state, net)
    assert session.join()
    x, y = common.make_data()

    def body():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(3):
        assert session.step(body) == kf.COMMITTED
    committed = snapshot(base)
    params = [p.detach().clone() for p in net.parameters()]
    # Two steps that are never committed (the state is committed at the boundary only).
    body()
    body()
    after_two = [p.detach().clone() for p in net.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after_two, params))
    state.restore()
    for key, value in snapshot(base).items():
        want = committed[key]
        same = torch.equal(value, want) if torch.is_tensor(want) else value == want
        assert same, "optimizer state %s not restored" % key
    for p, want in zip(net.parameters(), params):
        assert torch.equal(p, want), "parameters not restored"
    body()
    body()
    for p, want in zip(net.parameters(), after_two):
        assert torch.equal(p, want), "the restored state stepped differently"
    print("restored %s: %s" % (name, ", ".join(sorted(committed))), flush=True)


def main():
    torch.set_num_threads(1)
    for name in sys.argv[1:]:
        check(name)
        gc.collect()  # this optimizer's session ends before the next one's starts
    return 0


if __name__ == "__main__":
    sys.exit(main())
