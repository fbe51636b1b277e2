"""`boltbeam profile` in its own process, as the CLI runs it (the adapter's hook must be in place before tinygrad
first compiles its executors), and files made once a test run, whichever pytest worker asks first."""
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from boltbeam.measure import trace as tracefile

# The depth of the tiny model's shared traces: the whole-token searches' own (their judge takes 5 tokens at least),
# so the default route's trace is also their baseline, and every trace's greedy tokens compare with every other's.
DEPTH = ("--context", "4", "--tokens", "5")


def profile(model: str, out, *extra: str) -> tracefile.Trace:
    cmd = [sys.executable, "-m", "boltbeam", "profile", model, "--device", "CPU", "--out", str(out), "--json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["out"] == str(out)
    return tracefile.load(out)


def shared_root(basetemp: Path) -> Path:
    """This run's folder that every worker sees: under pytest-xdist the parent of the workers' own, else the run's."""
    return basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp


def once(path: Path, make: Callable[[Path], object]) -> Path:
    """`path`, made by make(path) by the first worker that asks; the others wait for it, then read it."""
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            make(path)
    return path
