# SPDX-License-Identifier: Apache-2.0
"""Policies given to kf.Session: a C++ plugin and a Python policy each change the batch at one
step on every worker; a Python policy that decides differently on each worker is found and
disabled on every worker; a built-in refuses a bad parameter by name."""

import os
import re

import pytest

from conftest import run_workers

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "policy_worker.py")


def batches(out):
    """rank -> [batch after step 1, after step 2, ...]"""
    per = {}
    for rank, step, batch in re.findall(r"^\[(\d+)\] step (\d+) batch (\d+)", out, re.M):
        per.setdefault(int(rank), []).append(int(batch))
    return per


def expect_batch_change_at_step_5(out):
    per = batches(out)
    assert sorted(per) == [0, 1], out
    for rank, seen in per.items():
        # The policy runs after step 5 and its batch is the settings' from then on.
        assert seen == [16] * 4 + [24] * 6, "rank %d: %s" % (rank, seen)


def test_a_cpp_plugin_policy_changes_the_batch_on_every_worker_at_one_step():
    plugin = os.environ.get("KF_TEST_BATCH_PLUGIN", "")
    if not plugin:
        pytest.skip("KF_TEST_BATCH_PLUGIN is not set (run the suite through meson test)")
    r = run_workers(2, [WORKER, "plugin", "10", plugin])
    assert r.returncode == 0, r.stdout + r.stderr
    expect_batch_change_at_step_5(r.stdout)


def test_a_python_policy_changes_the_batch_on_every_worker_at_one_step():
    r = run_workers(2, [WORKER, "python", "10"])
    assert r.returncode == 0, r.stdout + r.stderr
    expect_batch_change_at_step_5(r.stdout)
    assert "[0] calls 10" in r.stdout and "[1] calls 10" in r.stdout, r.stdout
    assert "[0] disabled: \n" in r.stdout, r.stdout
    # The decision, as every worker's session applied it.
    for rank in (0, 1):
        decisions = re.findall(r"^\[%d\] decision (.*)$" % rank, r.stdout, re.M)
        assert len(decisions) == 1, r.stdout
        assert decisions[0].startswith("step 5 after_step {'batch_size': 24"), decisions
        assert "py-batch-at-step" in decisions[0], decisions


def test_a_policy_that_decides_differently_on_each_worker_is_disabled_on_every_worker():
    r = run_workers(2, [WORKER, "rank-dependent", "10"])
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        m = re.search(r"^\[%d\] disabled: (.*)$" % rank, r.stdout, re.M)
        assert m and "RankDependent: the workers decided differently" in m.group(1), r.stdout
    assert "decided differently" in r.stderr, r.stderr


def test_a_builtin_policy_refuses_a_bad_parameter_by_name():
    r = run_workers(1, [WORKER, "builtin", "1"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused: " in r.stdout and "no_such_parameter" in r.stdout, r.stdout
