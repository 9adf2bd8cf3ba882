# SPDX-License-Identifier: Apache-2.0
"""kf from Python: the elastic, adaptive data-parallel runtime of kf for PyTorch programs.

A worker is started by ``kfrun`` (``kfrun -np 2 -- python3 train.py``), which gives it the job
in its environment. The program registers its training state, makes a session, joins the job
and runs its steps through the session::

    import kf, kf.torch
    state = kf.State()
    epoch = state.counter("epoch")
    session = kf.Session(state)
    opt = kf.torch.DistributedOptimizer(session, torch.optim.AdamW(model.parameters()))
    opt.register_state(state, model)
    if not session.join():
        raise SystemExit(0)
    while epoch.value < 3:
        outcome = session.step(lambda: train_one_step(opt))
        if outcome == kf.LEFT:
            break

docs/python.md says more: the loop, the sampler, policies, elastic jobs on one host and many.
"""

import torch as _torch  # noqa: F401  (loads LibTorch before the extension that links it)

from ._kf import Counter, DistributedOptimizer as _DistributedOptimizer  # noqa: F401
from ._kf import ElasticSampler, Error, Session, State

#: What Session.step() returns: the step is committed on every worker.
COMMITTED = "committed"
#: The step failed (a worker was lost or the cluster changed) and the state is back at the last
#: commit: counters and registered tensors hold the committed values; re-read them.
ROLLED_BACK = "rolled_back"
#: This worker is no longer a member (revoked or removed), or the job was suspended: exit.
LEFT = "left"

__all__ = [
    "COMMITTED",
    "Counter",
    "ElasticSampler",
    "Error",
    "LEFT",
    "ROLLED_BACK",
    "Session",
    "State",
]
