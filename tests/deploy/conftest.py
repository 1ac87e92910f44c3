"""Fixtures for the deployment tests: the repository layout, the legate binary, and child
processes that are always stopped at the end of a test."""

import os
import pathlib
import shutil
import subprocess
import threading

import pytest

import deploytool

ROOT = deploytool.ROOT


@pytest.fixture
def legate_bin():
    path = pathlib.Path(os.environ.get("LEGATE_BIN", str(ROOT / "target" / "debug" / "legate")))
    if not path.is_file():
        pytest.fail(f"legate binary not found at {path}: run `cargo build` or set LEGATE_BIN")
    return path


@pytest.fixture
def prometheus_bin():
    """The `prometheus` server binary. Missing is a skip on a developer machine, but a
    failure under CI, where .ci/deploy-checks installs it."""
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed, and CI is set: .ci/deploy-checks installs it")
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    return path


class Child:
    """A child process. With `announce`, its stdout's first line says where it listens (read it
    with `first_line`); otherwise stdout joins stderr in the log file that failures quote."""

    def __init__(self, args, log_path, env=None, announce=True):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if announce else self._log,
            stderr=self._log,
            env={**os.environ, **(env or {})},
        )

    def first_line(self, timeout=15):
        """The first stdout line; the rest of stdout is drained so the child never blocks."""
        box = []
        got_line = threading.Event()

        def read():
            # An empty string means the child closed stdout (it exited) before printing.
            box.append(self.proc.stdout.readline().decode(errors="replace"))
            got_line.set()
            for _ in self.proc.stdout:
                pass

        threading.Thread(target=read, daemon=True).start()
        if not got_line.wait(timeout) or not box[0]:
            raise AssertionError(f"{self.proc.args[0]} printed no line; log:\n{self.log_tail()}")
        return box[0].strip()

    def alive(self):
        return self.proc.poll() is None

    def log_tail(self, n=30):
        self._log.flush()
        lines = pathlib.Path(self.log_path).read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def spawn(tmp_path):
    """spawn(name, args, env=None, announce=True) -> Child; every child is stopped after the
    test."""
    children = []

    def start(name, args, env=None, announce=True):
        child = Child(args, tmp_path / f"{name}.log", env, announce)
        children.append(child)
        return child

    yield start
    for child in reversed(children):
        child.stop()
