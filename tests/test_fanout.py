"""The search fanned out through Dask: a local cluster of two CPU worker processes searches the tiny
model (captured on one worker, its kernels sent with each task) while one of its workers is killed mid-task;
with the device's clock replaced by a fixed function of each compiled program, its route and ledger equal
the single-process search's, the killed worker's task costing nothing twice and losing nothing; bad
configuration is one line and leaves the ledger untouched.

Each search runs in its own process (tinygrad stays out of the test process), the two at once.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from boltbeam.errors import Refused
from boltbeam.search import fanout
from tests.processes import once

CPU_TARGETS = str(Path(__file__).parent / "data" / "cpu_target.toml")
BUDGET = 1      # settings timed a kernel besides its default: what the workers share is the same at any budget

SEARCH_SCRIPT = r'''
import json, os, sys, threading, time, zlib
from dataclasses import asdict
from boltbeam.bound.targets import get_target
from boltbeam.files import sha256_file
from boltbeam.ledger.store import Ledger
from boltbeam.search import decide, fanout
from boltbeam.foresight.space import searchable
from distributed import WorkerPlugin

def fixed_clock():
    """The device's clock replaced by a fixed function of the kernel and the opts tinygrad applied
    (not the program's text: its name carries a per-process counter): runs agree exactly."""
    def clock(c, prg, reps):
        return [float(zlib.crc32(f"{c.shape.key} {prg.src[0].arg.applied_opts}".encode()) % 997 + 1)] * reps
    decide.time_program = clock

class FixedClock(WorkerPlugin):
    """The fixed clock on every worker, the one the nanny starts after a kill too."""
    def setup(self, worker):
        fixed_clock()

def kill_a_busy_worker(client, seen):
    while "killed" not in seen:
        for addr, keys in client.processing().items():
            if any(str(k).startswith("time_plan-") for k in keys):
                seen["killed"] = addr
                try:
                    client.run(os._exit, 1, workers=[addr])
                except Exception:
                    pass
                return
        time.sleep(0.01)

# Guarded: Dask starts worker processes that import the main module again.
if __name__ == "__main__":
    model, targets, ledger_path, mode, budget = *sys.argv[1:5], int(sys.argv[5])
    fam, target = searchable("tinygrad_opts"), get_target("host-like", [targets])
    job = fanout.Job(os.path.abspath(model), sha256_file(model), "CPU", 8)
    seen = {}
    with Ledger(ledger_path) as ledger:
        if mode == "single":
            from boltbeam.read.census import take_census
            from boltbeam.search.compiler import capture
            fixed_clock()
            captured = capture(model, take_census(model), "CPU", 8)
            result = decide.search([c.kernel for c in captured], fam, target, "CPU", budget, decide.in_process(captured),
                                   ledger)
        else:
            with fanout.cluster("CPU", workers=2) as cl:
                seen["workers"] = cl.workers
                cl.client.register_plugin(FixedClock())
                captured = cl.kernels(job)   # on one worker; the kernels travel with each task
                threading.Thread(target=kill_a_busy_worker, args=(cl.client, seen), daemon=True).start()
                result = decide.search([c.kernel for c in captured], fam, target, "CPU", budget,
                                       cl.time_all("CPU", captured), ledger)
                seen["after"] = list(cl.client.scheduler_info(n_workers=-1)["workers"])
        entries = [[e.candidate, e.verdict, e.reasons, e.scope, e.reopen] for e in ledger.entries()]
    print(json.dumps({"choices": [asdict(c) for c in result.route.choices], "entries": entries, **seen,
                      "timed_now": result.timed_now, "unbuilt": result.unbuilt,
                      "kernels": [[k.key, k.survivors, len(k.timed), len(k.refused)] for k in result.kernels]}))
'''


def _search(tmp: Path, model: str, mode: str) -> dict:
    script = tmp / "search.py"
    script.write_text(SEARCH_SCRIPT)
    done = subprocess.run([sys.executable, str(script), model, CPU_TARGETS, str(tmp / f"{mode}.sqlite"), mode, str(BUDGET)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def searches(tiny_model, shared):
    """Made once a test run, by whichever pytest-xdist worker asks first; the others read it back."""
    made = once(shared / "fanout.json", lambda path: path.write_text(json.dumps(_searches(tiny_model, shared))))
    return json.loads(made.read_text())


def _searches(tiny_model: str, shared: Path) -> dict:
    tmp = shared / "fanout"
    tmp.mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = {m: pool.submit(_search, tmp, tiny_model, m) for m in ("single", "cluster")}
        return {m: f.result() for m, f in runs.items()}


def test_two_workers_choose_and_record_what_one_process_does(searches):
    """Though one of them was killed mid-task (the next test)."""
    one, two = searches["single"], searches["cluster"]
    assert len(two["workers"]) == 2
    assert two["choices"] == one["choices"] and one["choices"]
    # Same entries in the same kernel order is not promised (workers finish in any order): same contents.
    key = lambda e: json.dumps(e, sort_keys=True)
    assert sorted(map(key, two["entries"])) == sorted(map(key, one["entries"]))
    assert two["timed_now"] == one["timed_now"] == len(one["entries"]) - sum(
        e[1] == "search-space-incomplete" for e in one["entries"])


def test_a_worker_killed_mid_task_costs_nothing_twice_and_loses_nothing(searches):
    run = searches["cluster"]
    assert run["killed"] in run["workers"] and run["killed"] not in run["after"]   # it died
    assert run["unbuilt"] == {}
    timings = [e for e in run["entries"] if "measured_us" in e[3] and e[3]["setting"] != "space"]
    assert max(Counter(e[0] for e in timings).values()) == 1                      # nothing recorded twice
    # nothing lost: every kernel's default and its budget of survivors, as the single process timed them
    for k, survivors, timed, refused in run["kernels"]:
        assert timed + refused == min(BUDGET, survivors), k
    assert len(timings) == run["timed_now"] == sum(t + 1 for _, _, t, _ in run["kernels"])
    assert sorted(e[0] for e in timings) == sorted(e[0] for e in searches["single"]["entries"]
                                                  if "measured_us" in e[3] and e[3]["setting"] != "space")


def _cli(tmp: Path, model: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "boltbeam", "search", model, "--device", flags[0], "--target",
                           "host-like", "--targets", CPU_TARGETS, "--budget", "1", "--ledger", str(tmp / "l.sqlite"),
                           "--out", str(tmp / "out"), *flags[1:]], capture_output=True, text=True, timeout=300)


def _one_line_and_untouched(done: subprocess.CompletedProcess, tmp: Path, code: int, says: str) -> None:
    assert done.returncode == code, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp / "l.sqlite").exists() and not (tmp / "out").exists()


def test_an_unreachable_scheduler_is_one_line(tiny_model, tmp_path):
    done = _cli(tmp_path, tiny_model, "CPU", "--scheduler", "tcp://127.0.0.1:9")
    _one_line_and_untouched(done, tmp_path, 2, "cannot reach the Dask scheduler at tcp://127.0.0.1:9")


def test_workers_without_a_gpu(tiny_model, tmp_path):
    from distributed import LocalCluster
    with LocalCluster(n_workers=1, processes=False, protocol="tcp", dashboard_address=":0") as bare:   # offers no GPU resource
        done = _cli(tmp_path, tiny_model, "CPU", "--scheduler", bare.scheduler_address)
    _one_line_and_untouched(done, tmp_path, 3, "no Dask worker offers a GPU resource")
    done = _cli(tmp_path, tiny_model, "CUDA", "--workers", "1")   # this machine has no CUDA device
    _one_line_and_untouched(done, tmp_path, 3, "cannot open CUDA")


class _Client:
    """Dask's client as _check uses it, over workers whose facts are given."""

    def __init__(self, facts: dict[str, fanout.WorkerFacts]):
        self.facts = facts

    def scheduler_info(self, n_workers):
        return {"workers": {a: {"resources": {fanout.RESOURCE: 1}} for a in self.facts}}

    def submit(self, fn, device, key, pure, workers, allow_other_workers):
        return self.facts[workers[0]]

    def gather(self, futures):
        return futures


def test_a_worker_on_another_compiler_is_refused():
    from boltbeam import __version__
    from boltbeam.measure.route import engine
    ok = fanout.WorkerFacts(engine(), __version__, None)
    assert fanout._check(_Client({"tcp://a:1": ok, "tcp://b:1": ok}), "CPU") == ["tcp://a:1", "tcp://b:1"]
    with pytest.raises(Refused, match="tcp://b:1 runs tinygrad 0.12.0"):
        fanout._check(_Client({"tcp://a:1": ok, "tcp://b:1": dataclasses.replace(ok, engine="tinygrad 0.12.0")}), "CPU")
