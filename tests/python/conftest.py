# SPDX-License-Identifier: Apache-2.0
"""pytest for the Python package kf (suite 'python', run by meson test and tools/run-tests).

meson passes the built package (PYTHONPATH), kfrun (KFRUN) and the source tree (KF_SOURCE_ROOT)
in the environment. With --tap (and -p no:terminal) the results go to stdout as TAP, one line
per test, so that meson counts every test; a failure's report follows its line as TAP comments."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "workers"))


def pytest_addoption(parser):
    parser.addoption("--tap", action="store_true", help="report as TAP on stdout (meson)")


class _Tap:
    def __init__(self):
        self.out = sys.__stdout__
        self.count = 0
        self.results = {}
        self.reports = {}

    def pytest_runtest_logreport(self, report):
        old = self.results.get(report.nodeid)
        if report.failed:
            self.results[report.nodeid] = ("not ok", "")
            self.reports.setdefault(report.nodeid, []).append(report.longreprtext)
        elif report.skipped and old is None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            self.results[report.nodeid] = ("ok", " # SKIP " + str(reason).replace("\n", " "))
        elif report.when == "call" and old is None:
            self.results[report.nodeid] = ("ok", "")

    def pytest_runtest_logfinish(self, nodeid, location):
        status, extra = self.results.get(nodeid, ("not ok", " (no result)"))
        self.count += 1
        self.out.write("%s %d %s%s\n" % (status, self.count, nodeid, extra))
        for text in self.reports.get(nodeid, []):
            for line in text.splitlines():
                self.out.write("# " + line + "\n")
        self.out.flush()

    def pytest_collectreport(self, report):
        if report.failed:
            self.out.write("Bail out! cannot collect %s\n" % report.nodeid)
            for line in report.longreprtext.splitlines():
                self.out.write("# " + line + "\n")
            self.out.flush()

    def pytest_sessionfinish(self, session, exitstatus):
        self.out.write("1..%d\n" % self.count)


def pytest_configure(config):
    if config.getoption("--tap"):
        config.pluginmanager.register(_Tap(), "kf-tap")


def kfrun():
    path = os.environ.get("KFRUN", "")
    if not path:
        pytest.skip("KFRUN is not set (run the suite through meson test)")
    return path


def source_root():
    return os.environ.get("KF_SOURCE_ROOT", os.path.normpath(os.path.join(HERE, "..", "..")))


def run_workers(np, argv, timeout=180, extra_env=None, kfrun_args=()):
    """Runs `python3 argv...` as np workers of a static kf job; returns the CompletedProcess
    (stdout and stderr as text, rank prefixes included)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    cmd = [kfrun(), *kfrun_args, "-np", str(np), "--", sys.executable, "-u", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
