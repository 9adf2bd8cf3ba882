# SPDX-License-Identifier: Apache-2.0
"""Training through kf.torch.DistributedOptimizer against plain PyTorch: one worker gives the
same parameters bit for bit, two workers on halves of the batch those of one process on the
whole batch, for every optimizer whose state kf registers."""

import os

import pytest
import torch

import common
from conftest import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "train_worker.py")
STEPS = 12


def trained(np, name, tmp_path):
    out = str(tmp_path / "params")
    r = run_workers(np, [WORKER, name, str(STEPS), out])
    assert r.returncode == 0, r.stdout + r.stderr
    return [torch.load("%s.%d" % (out, rank)) for rank in range(np)]


@pytest.mark.parametrize("name", sorted(common.OPTIMIZERS))
def test_one_worker_gives_exactly_the_plain_parameters(name, tmp_path):
    want = common.train_plain(name, STEPS)
    got = trained(1, name, tmp_path)[0]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), "parameter %d differs by %g" % (i, (g - w).abs().max())


@pytest.mark.parametrize("name", sorted(common.OPTIMIZERS))
def test_two_workers_on_halves_match_one_process_on_the_whole_batch(name, tmp_path):
    want = common.train_plain(name, STEPS)
    a, b = trained(2, name, tmp_path)
    for i, (pa, pb, w) in enumerate(zip(a, b, want)):
        assert torch.equal(pa, pb), "the workers differ at parameter %d" % i
        assert torch.allclose(pa, w, rtol=1e-4, atol=1e-5), \
            "parameter %d: max difference %g" % (i, (pa - w).abs().max())


@pytest.mark.parametrize("name", sorted(common.OPTIMIZERS))
def test_the_registered_optimizer_state_comes_back_with_a_restore(name):
    r = run_workers(1, [os.path.join(HERE, "workers", "restore_worker.py"), name])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restored: 0/" in r.stdout, r.stdout
