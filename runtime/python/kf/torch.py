# SPDX-License-Identifier: Apache-2.0
"""kf for PyTorch models: the distributed optimizer and the data of a step.

``DistributedOptimizer`` wraps any ``torch.optim`` optimizer. Gradients are averaged over the
workers in buckets whose allreduce starts, from a gradient hook, as soon as backward has made
every gradient of the bucket; the wait, the write of the averages into ``.grad``, the
gradient-noise-scale and throughput monitors, the training modes (sync-sgd, sma, pair-avg,
async-ps) and gradient compression are those of the C++ ``kf::DistributedOptimizer``, which
does the work (docs/torch.md). ``register_state`` registers the model and the optimizer's state
with a ``kf.State``, so that they are committed, restored and sent to joiners.
"""

import torch
from torch.utils.data import default_collate

from . import ElasticSampler as _ElasticSampler
from . import _DistributedOptimizer

__all__ = ["DistributedOptimizer", "ElasticBatchSampler", "elastic_batch"]


def _zeros(p):
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _adam_step(group, p):
    # As Adam and AdamW of torch 1.13 make it at their first step.
    if group.get("capturable", False) or group.get("fused", False):
        return torch.zeros((1,), dtype=torch.float, device=p.device)
    return torch.tensor(0.0)


def _make_state(optimizer, group, p, st):
    """Creates the state torch would create at the first step, for the optimizers whose first
    step fills it in; returns False for an optimizer kf does not know."""
    if isinstance(optimizer, torch.optim.SGD):
        if group["momentum"] != 0:
            st["momentum_buffer"] = _zeros(p)
        return True
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        st["step"] = _adam_step(group, p)
        st["exp_avg"] = _zeros(p)
        st["exp_avg_sq"] = _zeros(p)
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = _zeros(p)
        return True
    if isinstance(optimizer, torch.optim.RMSprop):
        # A tensor, which RMSprop increments in place (+= 1), so that State.restore() puts it
        # back where the optimizer reads it; an int for a differentiable RMSprop, which refuses
        # a tensor.
        st["step"] = 0 if group["differentiable"] else torch.zeros((), dtype=torch.int64)
        st["square_avg"] = _zeros(p)
        if group["momentum"] > 0:
            st["momentum_buffer"] = _zeros(p)
        if group["centered"]:
            st["grad_avg"] = _zeros(p)
        return True
    return False


class _Stepper:
    """What the C++ optimizer calls: the Python optimizer's step, with the integer entries of
    its state taken from and given back to their State counters (an entry read between a
    restore and the next step still holds its value before the restore)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.param_groups = optimizer.param_groups
        self.counters = []  # (state dict of a parameter, key, kf.Counter)

    def step(self):
        for st, key, counter in self.counters:
            st[key] = counter.value
        self.optimizer.step()
        for st, key, counter in self.counters:
            counter.value = int(st[key])


class DistributedOptimizer:
    """Wraps a ``torch.optim`` optimizer for a kf job.

    Every worker builds the same model and the same optimizer (the same parameters in the same
    order), makes this before ``session.join()`` and calls ``register_state`` then. Per step::

        opt.zero_grad()
        opt.begin_step(local_samples, global_samples)   # this worker's share of the step
        loss_fn(model(x), y).backward()                  # the mean over the local batch
        opt.step()                                        # averaged gradients, then the step

    Parameters must be dense, contiguous float32 tensors, all on the CPU or all on one CUDA
    device; one backward per step. ``bucket_bytes`` sizes the gradient buckets; ``overlap=False``
    makes one allreduce after backward. ``momentum_correction`` and ``momentum_masking`` are
    for SGD with sparse compression (docs/training-modes.md).
    """

    def __init__(self, session, optimizer, *, bucket_bytes=4 << 20, overlap=True,
                 momentum_correction=True, momentum_masking=True):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("DistributedOptimizer wraps a torch.optim.Optimizer, not "
                            + type(optimizer).__name__)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise TypeError("DistributedOptimizer: LBFGS needs a closure per step; kf cannot "
                            "average its inner evaluations")
        self.optimizer = optimizer
        self.session = session
        self._stepper = _Stepper(optimizer)
        self._impl = _DistributedOptimizer(session, self._stepper, bucket_bytes, overlap,
                                           momentum_correction, momentum_masking)

    def register_state(self, state, model):
        """Registers with ``state`` (before ``session.join()``) every parameter and buffer of
        ``model`` as ``model/<name>`` and the optimizer's per-parameter state as
        ``optimizer/<i>/<key>``, created now as the optimizer's first step would create it, so
        that every worker has the same layout before the first step. Known: SGD, Adam, AdamW,
        RMSprop (their state is made here; RMSprop's step as an int64 tensor) and every optimizer
        whose state exists once it is constructed (Adagrad). Tensors are registered as they
        are; integer entries become State counters, given to the optimizer before each step. Raises TypeError for an optimizer whose state kf cannot make, ValueError for a
        tensor kf cannot register."""
        for name, p in model.named_parameters():
            state.add("model/" + name, p.detach())
        for name, b in model.named_buffers():
            state.add("model/" + name, b)
        opt = self.optimizer
        i = 0
        for group in opt.param_groups:
            for p in group["params"]:
                st = opt.state[p]
                if len(st) == 0 and not _make_state(opt, group, p, st):
                    raise TypeError(
                        "DistributedOptimizer.register_state: the state of "
                        + type(opt).__name__ + " is made at its first step, and kf does not "
                        "know how (SGD, Adam, AdamW, RMSprop and Adagrad it does)")
                tag = "optimizer/%d" % i
                for key in sorted(st):
                    value = st[key]
                    if isinstance(value, torch.Tensor):
                        state.add(tag + "/" + key, value)
                    elif isinstance(value, int) and not isinstance(value, bool):
                        counter = state.counter(tag + "/" + key)
                        counter.value = value
                        self._stepper.counters.append((st, key, counter))
                    else:
                        raise ValueError(
                            "DistributedOptimizer.register_state: %s/%s is a %s; kf registers "
                            "tensors and integers" % (tag, key, type(value).__name__))
                i += 1

    def zero_grad(self):
        """Zeroes the gradients."""
        self._impl.zero_grad()

    def begin_step(self, local_samples, global_samples):
        """Before backward: this worker's samples in the step and the step's over all workers.
        Each worker's gradient (the mean over its samples) is weighted local/global, so the
        average is the mean over every sample of the step however the batch was split."""
        self._impl.begin_step(int(local_samples), int(global_samples))

    def step(self):
        """Waits for the averaged gradients, writes them into ``.grad``, reports to the
        session's monitors and runs the optimizer's step. Raises kf.Error from the exchange
        (``Session.step`` recovers from peer failures)."""
        self._impl.step()

    def average_parameters(self):
        """Replaces the parameters with their mean over the workers (one allreduce)."""
        self._impl.average_parameters()

    @property
    def learning_rate(self):
        """The learning rate of the first parameter group; setting it sets every group's."""
        return self._impl.learning_rate

    @learning_rate.setter
    def learning_rate(self, lr):
        self._impl.learning_rate = float(lr)

    @property
    def bytes_sent(self):
        """Bytes this worker has sent for gradients and models."""
        return self._impl.bytes_sent

    @property
    def exposed_comm(self):
        """Seconds the last step() waited for communication that backward did not hide."""
        return self._impl.exposed_comm

    @property
    def buckets(self):
        return self._impl.buckets


def elastic_batch(dataset, indices):
    """The examples ``indices`` of a map-style dataset, collated as a DataLoader would
    (``default_collate``); a ``TensorDataset`` is indexed at once. None for no indices."""
    if len(indices) == 0:
        return None
    if isinstance(dataset, torch.utils.data.TensorDataset):
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [t[idx] for t in dataset.tensors]
    return default_collate([dataset[i] for i in indices])


class ElasticBatchSampler(torch.utils.data.Sampler):
    """A ``torch.utils.data`` batch sampler over one epoch of a kf job: each item is this
    worker's part of the next step (a list of indices), computed when it is asked for from the
    State counters ``epoch`` and ``position``, the session's size and the settings' batch size.
    So after a step that rolled back (the counters are back at the last commit) or a change of
    the cluster, the next item is right again. The iteration ends when the epoch does.

        sampler = kf.torch.ElasticBatchSampler(len(data), session, epoch, position, seed=7)
        for x, y in torch.utils.data.DataLoader(data, batch_sampler=sampler):
            def step():
                ...                           # opt.begin_step(len(x), sampler.step_samples)
                sampler.advance()             # inside the step: it moves the counters
            session.step(step)

    Use it with ``num_workers=0`` (the default): a DataLoader with worker processes asks for
    batches ahead of the steps. ``batch_size`` is the global batch when the settings have none.
    """

    def __init__(self, dataset_size, session, epoch, position, seed, batch_size=64,
                 shuffle=True):
        self.session = session
        self.epoch_counter = epoch
        self.position_counter = position
        self.batch_size = batch_size
        self._sampler = _ElasticSampler(dataset_size, seed, shuffle)
        self._epoch = None
        self.step_samples = 0  # the current step's samples over every worker
        self.global_batch = 0

    def __len__(self):
        return len(self._sampler)

    def __iter__(self):
        self._epoch = self.epoch_counter.value
        while self.epoch_counter.value == self._epoch:
            self.global_batch = int(self.session.settings.get("batch_size", self.batch_size))
            self._sampler.start_epoch(self.epoch_counter.value, self.position_counter.value)
            self.step_samples = self._sampler.step_samples(self.global_batch)
            first, count = self.session.batch_part(self.step_samples)
            yield self._sampler.range(first, count)

    def advance(self):
        """Moves the counters past the current step (call it inside the step, so that a step
        that rolls back rolls it back too); at the epoch's end, to the next epoch."""
        self._sampler.advance(self.global_batch)
        if self._sampler.epoch_done:
            self.epoch_counter.value += 1
            self.position_counter.value = 0
        else:
            self.position_counter.value = self._sampler.position
