# SPDX-License-Identifier: Apache-2.0
"""examples/fashion_mnist.py as an elastic job (kfrun --watch with the built-in config service):
grown from 2 to 3 workers by `kf-member add`, back to 2 by a kill -9 of an original worker. At
every change every worker holds one model, at the end all parameters are identical, and the
committed steps trained on every sample of each epoch exactly once."""

import collections
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import kfrun, source_root

DATA = "/usr/share/datasets/fashion-mnist"


class Job:
    def __init__(self, tmp_path, args):
        self.log_path = tmp_path / "job.log"
        self.log = open(self.log_path, "w")
        cmd = [kfrun(), "--watch", "--config-server", "builtin", "--slots", "8", "-np", "2",
               "--leave-grace-ms", "20000", "--", sys.executable, "-u", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def text(self):
        return self.log_path.read_text()

    def wait_for(self, pattern, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text(), re.M)
            if m:
                return m
            assert self.proc.poll() is None, "the job ended early:\n" + self.text()[-3000:]
            time.sleep(0.05)  # polling a log file that grows while the job trains
        raise AssertionError("no '%s' after %d s:\n%s" % (pattern, timeout, self.text()[-3000:]))

    def newest_step(self):
        steps = re.findall(r"\] epoch \d+ step (\d+) ", self.text())
        return int(steps[-1]) if steps else 0

    def wait_steps(self, n, timeout=120):
        target = self.newest_step() + n
        self.wait_for(r"\] epoch \d+ step (%s)" % "|".join(str(s) for s in range(target,
                                                                                   target + 11)),
                      timeout)

    def member(self, *args):
        url = self.wait_for(r"^kfrun: config server (\S+)").group(1)
        token = self.wait_for(r"^kfrun: job token file (\S+)").group(1)
        tool = os.environ.get("KF_MEMBER", "")
        if not tool:
            pytest.skip("KF_MEMBER is not set (run the suite through meson test)")
        r = subprocess.run([tool, "--server", url, "--token-file", token, *args],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def worker_pids(marker):
    """The workers (Python processes, not kfrun) whose command line holds `marker`."""
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    pids = []
    for p in r.stdout.split():
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode()
        except OSError:
            continue  # gone meanwhile
        if argv0 == sys.executable:
            pids.append(int(p))
    return sorted(pids)


@pytest.mark.skipif(not os.path.isdir(DATA), reason=DATA + " is missing (dataset-fashion-mnist)")
def test_grown_by_add_and_killed_it_keeps_one_model_and_every_sample_once(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    example = os.path.join(source_root(), "examples", "fashion_mnist.py")
    job = Job(tmp_path, [example, "--limit", "3000", "--epochs", "1000", "--batch", "32",
                         "--log-every", "10", "--trace-samples", str(traces)])
    try:
        job.wait_steps(30)
        job.member("add")
        job.wait_for(r"-> 3 workers, ")
        job.wait_steps(30)
        # An original worker (the lowest pid of the three), without notice.
        pids = worker_pids(str(traces))
        assert len(pids) == 3, pids
        os.kill(pids[0], signal.SIGKILL)
        job.wait_for(r"3 -> 2 workers, recovery")
        job.wait_steps(30)
        job.member("set", "epochs=1")
        assert job.proc.wait(timeout=120) == 0, job.text()[-3000:]
    finally:
        job.stop()
    out = job.text()
    assert "parameters identical on all 2 workers: yes" in out, out[-3000:]
    assert "final test accuracy: " in out

    # "[worker] membership vV step S workers N params H": one model per version.
    models = collections.defaultdict(set)
    reporters = collections.defaultdict(set)
    size_of = {}
    for worker, version, size, params in re.findall(
            r"^\[([^\]]+)\] membership v(\d+) step \d+ workers (\d+) params (\w+)", out, re.M):
        models[version].add(params)
        reporters[version].add(worker)
        size_of[version] = int(size)
    assert len(models) >= 3, out[-3000:]
    for version, hashes in models.items():
        assert len(hashes) == 1, "v%s: the workers hold different models %s" % (version, hashes)
        if size_of[version] == 3:
            assert len(reporters[version]) == 3, "v%s: the joiner and both survivors" % version

    # The newest version's lines of each step are its committed ones (a step that failed was
    # tried again in a newer version).
    newest = {}
    for f in traces.iterdir():
        for line in f.read_text().splitlines():
            w = line.split()
            step, version, epoch, position = int(w[1]), int(w[3]), int(w[5]), int(w[7])
            samples = [int(i) for i in w[8:]]
            old = newest.get(step)
            if old is None or version > old[0]:
                newest[step] = (version, epoch, position, samples)
            elif version == old[0]:
                assert (epoch, position) == old[1:3], "step %d: two places" % step
                old[3].extend(samples)
    seen = collections.defaultdict(list)
    for step in sorted(newest):
        _, epoch, _, samples = newest[step]
        seen[epoch].extend(samples)
    assert len(seen) >= 2, "at least one whole epoch"
    for epoch in sorted(seen)[:-1]:  # the last one may be unfinished
        assert sorted(seen[epoch]) == list(range(3000)), "epoch %d" % epoch
    last = seen[max(seen)]
    assert len(last) == len(set(last)), "a sample twice in the last epoch"
