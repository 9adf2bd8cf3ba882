# SPDX-License-Identifier: Apache-2.0
"""A kf worker (started by kfrun) that exercises the binding's calls and errors and prints
"ok: WHAT" for each check that held (an assertion that fails ends it with a traceback)."""

import os
import signal
import sys

import torch

import common
import kf
import kf.torch


def main():
    torch.set_num_threads(1)
    state = kf.State()
    epoch = state.counter("epoch")
    session = kf.Session(state, defaults={"batch_size": 16})
    net = common.make_net(1)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    opt = kf.torch.DistributedOptimizer(session, sgd)
    opt.register_state(state, net)
    loss_slot = session.add_metric("loss")
    assert "model/fc1.weight" in state.names and "optimizer/0/momentum_buffer" in state.names
    print("ok: model and optimizer state registered", flush=True)
    assert session.join()
    assert session.rank == 0 and session.size == 1 and session.version >= 1
    assert session.settings["batch_size"] == 16 and session.mode == "sync-sgd"
    print("ok: rank, size, version, settings and mode", flush=True)

    # The learning rate is the Python optimizer's.
    opt.learning_rate = 0.25
    assert all(g["lr"] == 0.25 for g in sgd.param_groups) and opt.learning_rate == 0.25
    print("ok: learning rate", flush=True)

    x, y = common.make_data()

    def body():
        opt.zero_grad()
        opt.begin_step(len(x), len(x))
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        session.set_metric(loss_slot, loss.item())
        opt.step()
        epoch.value += 1

    for _ in range(5):
        assert session.step(body) == kf.COMMITTED
    assert session.steps == 5 and epoch.value == 5 and int(epoch) == 5
    assert session.metrics["loss"] > 0 and "throughput" in session.metrics
    assert session.changes[0]["kind"] == "join"
    print("ok: steps commit; metrics %s" % ",".join(sorted(session.metrics)), flush=True)

    # kf's errors: kf.Error with the C++ message, code and category.
    try:
        session.allreduce(torch.zeros(3), "")
        raise AssertionError("an empty collective name was taken")
    except kf.Error as e:
        assert "a collective needs a name of 1-1024 bytes" in str(e), str(e)
        assert e.category == "kf" and isinstance(e.code, int) and isinstance(e, RuntimeError)
    print("ok: kf.Error", flush=True)
    for call, kind in [(lambda: session.add_metric("late"), RuntimeError),
                       (lambda: session.allreduce(torch.zeros(3), "x", op="median"), ValueError),
                       (lambda: session.allreduce(torch.zeros(3, dtype=torch.int8), "x"),
                        ValueError),
                       (lambda: state.add("model/fc1.weight", torch.zeros(2)), ValueError),
                       (lambda: kf.ElasticSampler(0, 1), ValueError),
                       (lambda: kf.Session(state, defaults=[1]), TypeError)]:
        try:
            call()
            raise AssertionError("no error")
        except kind as e:
            assert str(e), "an empty message"
    print("ok: bad arguments raise ValueError, TypeError or RuntimeError", flush=True)

    # An exception of the step's body goes on, unchanged.
    def failing():
        raise ValueError("from the body")
    try:
        session.step(failing)
        raise AssertionError("the body's error was lost")
    except ValueError as e:
        assert str(e) == "from the body"
    print("ok: the body's exception", flush=True)

    # Ctrl-C in a step: KeyboardInterrupt, as in any Python program.
    def interrupted():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    try:
        session.step(interrupted)
        raise AssertionError("SIGINT was lost")
    except KeyboardInterrupt:
        pass
    print("ok: KeyboardInterrupt", flush=True)

    same = session.consensus(torch.cat([p.detach().reshape(-1) for p in net.parameters()]),
                             "final")
    assert same
    session.finish()
    print("ok: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
