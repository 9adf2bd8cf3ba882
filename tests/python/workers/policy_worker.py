# SPDX-License-Identifier: Apache-2.0
"""A kf worker (started by kfrun) whose session runs the policies the test names, and which
prints "step S batch B" after each committed step (B: the settings' batch_size then).
    policy_worker.py KIND STEPS [PLUGIN]
KIND: plugin (the C++ plugin's batch-at-step), python (a Python policy doing the same),
rank-dependent (a Python policy that breaks the determinism rule), builtin (a built-in by
name with a parameter it refuses)."""

import os
import sys

import torch

import common
import kf
import kf.torch


class BatchAtStep:
    """Sets the global batch to 24 after step 5; counts its calls."""
    name = "py-batch-at-step"

    def __init__(self):
        self.calls = 0

    def after_step(self, ctx):
        self.calls += 1
        assert ctx.workers >= 1 and "batch_size" in ctx.settings and "loss" in ctx.metrics
        if ctx.step == 5:
            ctx.set_batch_size(24, "the test's step")


class RankDependent:
    """Breaks the rule: what it proposes depends on this worker's own process."""

    def after_step(self, ctx):
        if ctx.step == 3:
            ctx.set_learning_rate(0.01 * (1 + int(os.environ["KF_SELF"].rsplit(":", 1)[1]) % 7))


def main():
    kind, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    state = kf.State()
    if kind == "plugin":
        policies, plugins = [("batch-at-step", {"step": 5, "batch": 24})], [sys.argv[3]]
    elif kind == "python":
        policies, plugins = [BatchAtStep()], []
    elif kind == "rank-dependent":
        policies, plugins = [RankDependent()], []
    else:
        policies, plugins = [("gns-batch-size", {"no_such_parameter": 1})], []
    try:
        session = kf.Session(state, defaults={"batch_size": 16}, policies=policies,
                             plugins=plugins)
    except ValueError as e:
        print("refused: %s" % e, flush=True)
        return 0
    net = common.make_net(1)
    opt = kf.torch.DistributedOptimizer(session, torch.optim.SGD(net.parameters(), lr=0.1))
    opt.register_state(state, net)
    loss_slot = session.add_metric("loss")
    assert session.join()
    x, y = common.make_data()
    for _ in range(steps):
        batch = session.settings["batch_size"]
        n, r = session.size, session.rank
        lo, hi = batch * r // n, batch * (r + 1) // n

        def body():
            opt.zero_grad()
            opt.begin_step(hi - lo, batch)
            loss = torch.nn.functional.cross_entropy(net(x[lo:hi]), y[lo:hi])
            loss.backward()
            session.set_metric(loss_slot, loss.item())
            opt.step()

        assert session.step(body) == kf.COMMITTED
        print("step %d batch %d lr %g" % (session.steps, session.settings["batch_size"],
                                          session.settings.get("lr", 0.1)), flush=True)
    if kind == "python":
        print("calls %d" % policies[0].calls, flush=True)
    for d in session.decisions:
        print("decision step %d %s %s" % (d["step"], d["hook"], d["proposal"]), flush=True)
    print("disabled: %s" % "; ".join(session.policies.disabled), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
