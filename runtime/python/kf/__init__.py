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

import os as _os

import torch as _torch  # (loads LibTorch before the extension that links it)

from . import _kf
from ._kf import Counter, DistributedOptimizer as _DistributedOptimizer  # noqa: F401
from ._kf import ElasticSampler, Error, PolicyContext, PolicyRunner, State

def shared_tensor(shape, dtype=_torch.float32):
    """A zeroed CPU tensor of ``shape`` and ``dtype`` in kf's shared memory (kf::SharedMemory).

    Workers on the same host read such a tensor in place when it is exchanged
    (``Session.allreduce``), instead of copying it out of this process first: allocate it once
    for a buffer exchanged every step, not per step. Raises ValueError for a negative size.
    """
    dims = tuple(shape) if isinstance(shape, (tuple, list, _torch.Size)) else (shape,)
    count = 1
    for d in dims:
        if int(d) < 0:
            raise ValueError("shared_tensor: negative size %d in shape %s" % (int(d), dims))
        count *= int(d)
    itemsize = _torch.empty((), dtype=dtype).element_size()
    return _kf._shared_bytes(count * itemsize).view(dtype).reshape(dims)


#: The hooks a policy may have, in the order of a job's life.
HOOKS = ("before_train", "before_epoch", "after_step", "after_epoch", "on_membership_change")


class Session(_kf.Session):
    """The job as this worker sees it: made from the environment kfrun gives the worker.

    ``state`` is the kf.State with everything a step changes (registered before ``join()``);
    ``defaults`` are the program's own cluster settings (``{"mode": "sma"}``), which the job's
    settings override. ``policies``, when given, replaces the job file's policies: each is the
    name of a built-in or plugin policy, a ``(name, params)`` pair, or a Python object whose
    methods named as in ``HOOKS`` are called with a ``kf.PolicyContext``. Such an object must
    decide the same on every worker from the same inputs; kf checks it (docs/python.md). Its
    name is its ``name`` attribute, else its class's. ``plugins`` are C++ policy plugins
    (shared libraries made with KF_POLICY_PLUGIN) to load first.

    Raises ValueError naming a bad environment variable or argument, TypeError for a policy
    that is none of these, kf.Error from the runtime.
    """

    def __init__(self, state, defaults=None, policies=None, plugins=()):
        if policies is None and plugins:
            raise ValueError("plugins are loaded for the policies given as policies=; a job "
                             "file lists its own plugins")
        # What each policy is, checked before the session is made.
        wanted = []
        names = set()
        for p in policies or ():
            if isinstance(p, str):
                wanted.append((p, None, None))
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                wanted.append((p[0], p[1], None))
            elif any(callable(getattr(p, h, None)) for h in HOOKS):
                name = str(getattr(p, "name", type(p).__name__))
                if name in names:
                    raise ValueError("two Python policies are named '%s'; give each its own "
                                     "name attribute" % name)
                names.add(name)
                wanted.append((name, None, p))
            else:
                raise TypeError("a policy is a name, a (name, params) pair or an object with "
                                "one of the hooks %s, not %r" % (", ".join(HOOKS), p))
        super().__init__(state, defaults)
        self.policies = None
        if policies is None:
            return
        runner = PolicyRunner()
        for path in plugins:
            runner.load_plugin(_os.path.abspath(path))
        for name, params, python in wanted:
            if python is None:
                runner.add(name, params)
            else:
                _kf._add_python_policy(self, runner, python, name)
        _kf._set_policies(self, runner)
        self.policies = runner

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
    "HOOKS",
    "PolicyContext",
    "PolicyRunner",
    "LEFT",
    "ROLLED_BACK",
    "Session",
    "State",
    "shared_tensor",
]
