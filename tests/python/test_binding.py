# SPDX-License-Identifier: Apache-2.0
"""The binding's calls and errors, in this process (no job) and in a worker of a 1-worker job."""

import os

import pytest
import torch

import kf
import kf.torch
from conftest import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))


def test_state_registers_tensors_and_counters():
    s = kf.State()
    c = s.counter("epoch")
    assert c.value == 0 and c.name == "epoch"
    c.value = 7
    assert s.counter("epoch").value == 7 and int(c) == 7
    t = torch.arange(4, dtype=torch.float32)
    s.add("w", t)
    s.add("i", torch.zeros(2, dtype=torch.int64))
    assert s.names == ["w", "i"] and s.bytes == 4 * 4 + 2 * 8 + 8
    s.commit()
    t.fill_(9)
    c.value = 1
    s.restore()
    assert torch.equal(t, torch.arange(4, dtype=torch.float32)) and c.value == 7


def test_a_modules_state_dict_is_registered_in_place():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    s = kf.State()
    s.add_state_dict("model", model.state_dict())
    assert "model/0.weight" in s.names and "model/1.num_batches_tracked" in s.names
    s.commit()
    with torch.no_grad():
        before = model[0].weight.clone()
        model[0].weight.add_(1.0)
    s.restore()
    assert torch.equal(model[0].weight, before)
    with pytest.raises(TypeError, match="'opt/param_groups' is a list"):
        kf.State().add_state_dict("opt", {"param_groups": [1]})
    with pytest.raises(TypeError, match="a mapping is needed"):
        kf.State().add_state_dict("x", 3)


@pytest.mark.parametrize("bad,why", [
    (torch.zeros(3, dtype=torch.int32), "cannot be registered"),
    (torch.zeros(4, 4).t(), "contiguous"),
])
def test_state_refuses_tensors_it_cannot_hold(bad, why):
    with pytest.raises(ValueError, match=why):
        kf.State().add("x", bad)


def test_a_name_twice_is_an_error():
    s = kf.State()
    s.add("x", torch.zeros(1))
    with pytest.raises(ValueError, match="registered twice"):
        s.add("x", torch.zeros(1))


def test_restore_without_a_commit_is_an_error():
    with pytest.raises(RuntimeError, match="commit"):
        kf.State().restore()


def test_the_sampler_splits_each_step_over_the_workers():
    s = kf.ElasticSampler(10, 3)
    s.start_epoch(0)
    a, b = s.batch(0, 2, 4), s.batch(1, 2, 4)
    assert len(a) == 2 and len(b) == 2 and not set(a) & set(b)
    assert s.range(0, 4) == a + b and s.step_samples(4) == 4
    seen = []
    while not s.epoch_done:
        seen += s.range(0, s.step_samples(4))
        s.advance(4)
    assert sorted(seen) == list(range(10)) and len(s) == 10
    with pytest.raises(ValueError):
        kf.ElasticSampler(0, 1)


def test_a_session_outside_kfrun_says_what_is_missing():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    old = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        with pytest.raises(ValueError, match="KF_SELF"):
            kf.Session(kf.State())
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_the_optimizer_wrapper_refuses_what_it_cannot_wrap():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        kf.torch.DistributedOptimizer(None, object())
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(TypeError, match="LBFGS"):
        kf.torch.DistributedOptimizer(None, torch.optim.LBFGS(p))


def test_elastic_batch_collates_a_dataset():
    data = torch.utils.data.TensorDataset(torch.arange(10.0).view(5, 2), torch.arange(5))
    x, y = kf.torch.elastic_batch(data, [4, 1])
    assert torch.equal(y, torch.tensor([4, 1])) and x.shape == (2, 2)
    pairs = [(torch.tensor([float(i)]), i) for i in range(5)]
    x, y = kf.torch.elastic_batch(pairs, [2, 3])
    assert torch.equal(x, torch.tensor([[2.0], [3.0]])) and torch.equal(y, torch.tensor([2, 3]))
    assert kf.torch.elastic_batch(data, []) is None


def test_a_shared_tensor_is_zeroed_memory_of_its_shape_and_type():
    t = kf.shared_tensor((3, 5), dtype=torch.float64)
    assert t.shape == (3, 5) and t.dtype == torch.float64 and t.is_contiguous()
    assert torch.count_nonzero(t) == 0
    t += 2
    assert float(t.sum()) == 30.0
    assert kf.shared_tensor(7).shape == (7,) and kf.shared_tensor(0).numel() == 0
    assert kf.shared_tensor([2, 2], dtype=torch.int64).dtype == torch.int64
    with pytest.raises(ValueError, match="negative size -1"):
        kf.shared_tensor((2, -1))


def test_peers_on_one_host_read_a_shared_tensor_in_place():
    r = run_workers(2, [os.path.join(HERE, "workers", "shared_worker.py")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok: rank") == 2, r.stdout + r.stderr


def test_a_worker_sees_the_session_and_its_errors():
    r = run_workers(1, [os.path.join(HERE, "workers", "session_worker.py")])
    assert r.returncode == 0, r.stdout + r.stderr
    for what in ["model and optimizer state registered", "rank, size, version, settings",
                 "learning rate", "steps commit", "kf.Error", "bad arguments raise",
                 "the body's exception", "KeyboardInterrupt", "done"]:
        assert "ok: " + what in r.stdout, what + "\n" + r.stdout + r.stderr


def test_a_dataloader_with_the_elastic_batch_sampler_takes_every_sample_once_per_epoch():
    r = run_workers(2, [os.path.join(HERE, "workers", "loader_worker.py")])
    assert r.returncode == 0, r.stdout + r.stderr
    per_epoch = {0: [], 1: []}
    steps = set()
    for line in r.stdout.splitlines():
        w = line.split()
        if len(w) >= 4 and w[1] == "step":
            steps.add(int(w[2]))
            per_epoch[int(w[4])] += [int(i) for i in w[5:]]
    for e, samples in per_epoch.items():
        assert sorted(samples) == list(range(50)), "epoch %d: %s" % (e, sorted(samples))
    assert steps == set(range(1, 15)), steps  # ceil(50 / 8) = 7 steps per epoch


def test_plugins_without_policies_are_refused():
    with pytest.raises(ValueError, match="plugins are loaded for the policies"):
        kf.Session(kf.State(), plugins=["/nonexistent/libx.so"])


@pytest.mark.parametrize("bad,kind,why", [
    ([3], TypeError, "a policy is a name"),
    ([("gns-batch-size",)], TypeError, "a policy is a name"),
    ([type("P", (), {"after_step": lambda self, ctx: None})(),
      type("P", (), {"after_step": lambda self, ctx: None})()], ValueError, "two Python policies"),
])
def test_policies_of_no_known_kind_are_refused_before_the_session_is_made(bad, kind, why):
    with pytest.raises(kind, match=why):
        kf.Session(kf.State(), policies=bad)
