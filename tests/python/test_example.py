# SPDX-License-Identifier: Apache-2.0
"""examples/fashion_mnist.py: AdamW trains it, two workers end with one model, and bad data is
a clear error."""

import os
import re

import pytest

from conftest import run_workers, source_root

DATA = "/usr/share/datasets/fashion-mnist"


def example():
    return os.path.join(source_root(), "examples", "fashion_mnist.py")


def final_accuracy(out):
    m = re.search(r"final test accuracy: ([0-9.]+) \(workers at end: (\d+)", out)
    assert m, out
    return float(m.group(1)), int(m.group(2))


@pytest.mark.skipif(not os.path.isdir(DATA), reason=DATA + " is missing (dataset-fashion-mnist)")
def test_adamw_trains_the_mlp_on_two_workers():
    r = run_workers(2, [example(), "--optimizer", "adamw", "--limit", "6000", "--epochs", "2",
                        "--log-every", "1000"])
    assert r.returncode == 0, r.stdout + r.stderr
    accuracy, workers = final_accuracy(r.stdout)
    assert workers == 2
    assert accuracy >= 0.75, r.stdout
    assert "parameters identical on all 2 workers: yes" in r.stdout


def test_missing_data_is_a_clear_error(tmp_path):
    r = run_workers(1, [example(), "--data", str(tmp_path)])
    assert r.returncode != 0
    assert "train-images-idx3-ubyte.gz: no such file" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_a_bad_file_is_named(tmp_path):
    for name in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]:
        (tmp_path / name).write_bytes(b"\x00\x00\x08\x03garbage")
    r = run_workers(1, [example(), "--data", str(tmp_path)])
    assert r.returncode != 0
    assert "train-images-idx3-ubyte: truncated header" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.isdir(DATA), reason=DATA + " is missing (dataset-fashion-mnist)")
@pytest.mark.parametrize("mode", ["sma:period=4", "pair-avg", "async-ps", "sync-sgd/topk:0.1",
                                  "sync-sgd/fp16"])
def test_the_training_modes_and_compression_train_from_python(mode):
    mode, _, compression = mode.partition("/")
    args = [example(), "--mode", mode, "--limit", "3000", "--epochs", "2", "--log-every", "1000"]
    if compression:
        args += ["--compression", compression]
    r = run_workers(2, args)
    assert r.returncode == 0, r.stdout + r.stderr
    accuracy, workers = final_accuracy(r.stdout)
    assert workers == 2 and accuracy >= 0.6, r.stdout
    # The models differ between averages in sma and pair-avg; the example averages them at the
    # end, so every worker holds one.
    assert "parameters identical on all 2 workers: yes" in r.stdout, r.stdout
    assert ("mode %s, compression %s" % (mode, compression or "none")) in r.stdout, r.stdout
