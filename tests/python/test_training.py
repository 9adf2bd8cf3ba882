# SPDX-License-Identifier: Apache-2.0
"""Training through kf.torch.DistributedOptimizer against plain PyTorch: one worker gives the
same parameters bit for bit, two workers on halves of the batch those of one process on the
whole batch, for every optimizer whose state kf registers. Each kind of run is one kfrun job for
all the optimizers (Python and torch start once per worker), checked optimizer by optimizer."""

import os

import pytest
import torch

import common
from conftest import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "train_worker.py")
STEPS = 12


NAMES = sorted(common.OPTIMIZERS)


def train_all(np, folder):
    """Trains with every optimizer on np workers, in one kfrun job (each optimizer in a session of
    its own): name -> the parameters of each rank, or the job's output if it failed."""
    out = str(folder / "params")
    r = run_workers(np, [WORKER, str(STEPS), out, *NAMES])
    params = {}
    for name in NAMES:
        files = ["%s.%s.%d" % (out, name, rank) for rank in range(np)]
        if r.returncode == 0 and all(os.path.exists(f) for f in files):
            params[name] = [torch.load(f) for f in files]
        else:
            params[name] = "exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr)
    return params


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    return train_all(1, tmp_path_factory.mktemp("one"))


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    return train_all(2, tmp_path_factory.mktemp("two"))


@pytest.fixture(scope="module")
def restores():
    return run_workers(1, [os.path.join(HERE, "workers", "restore_worker.py"), *NAMES])


def trained(results, name):
    got = results[name]
    assert not isinstance(got, str), got
    return got


@pytest.mark.parametrize("name", NAMES)
def test_one_worker_gives_exactly_the_plain_parameters(name, one_worker):
    want = common.train_plain(name, STEPS)
    got = trained(one_worker, name)[0]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), "parameter %d differs by %g" % (i, (g - w).abs().max())


@pytest.mark.parametrize("name", NAMES)
def test_two_workers_on_halves_match_one_process_on_the_whole_batch(name, two_workers):
    want = common.train_plain(name, STEPS)
    a, b = trained(two_workers, name)
    for i, (pa, pb, w) in enumerate(zip(a, b, want)):
        assert torch.equal(pa, pb), "the workers differ at parameter %d" % i
        assert torch.allclose(pa, w, rtol=1e-4, atol=1e-5), \
            "parameter %d: max difference %g" % (i, (pa - w).abs().max())


@pytest.mark.parametrize("name", NAMES)
def test_the_registered_optimizer_state_comes_back_with_a_restore(name, restores):
    r = restores
    assert ("restored %s: 0/" % name) in r.stdout, r.stdout + r.stderr
