"""What the search's Dask fan-out costs, simulated on a CPU machine (no GPU): the scheduler's per-task
overhead, the ledger's append rate, the size of what travels, and each worker's model load + capture.

    .venv/bin/python bench/fanout_sim.py      # about 2.5 minutes on 2 cores; writes bench/records/fanout_sim.json

1. Task rate: fanout.cluster("CPU", K) (Nanny workers, 1 thread and GPU=1 each: K "simulated GPUs"), K in
   WORKERS; TASKS tasks that sleep 0 or 10 ms and return a tuple, submitted as Cluster.submit does
   (pure=False, resources GPU=1) and read back as Cluster.time_all does (as_completed, then .result() each);
   tasks/s from the first submit to the last result, REPS times. K > 2 oversubscribes the 2 cores: 0 ms
   gives the scheduler's per-task overhead, 10 ms whether K sleeping workers scale (ideal K x 100/s).
2. Ledger: APPENDS search-shaped Records appended one by one (Record.append_to: WAL, synchronous=FULL).
3. Sizes, pickled with cloudpickle as Dask sends them: a Timings of 16 settings and 17 records, a Plan of
   16 settings, 30 hand-made Kernels, and the real captured token of part 4 (ASTs and renderer).
4. Capture: Cluster.kernels(Job) on the tiny synthetic model (DEV=CPU): the token captured once, on one
   worker of two; the worker's compute time (Dask's task stream), the coordinator's wall, and each
   captured kernel's pickled size (what travels with each task). The cluster start includes fanout's
   check, which already imports tinygrad.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

WORKERS, SLEEPS_MS, TASKS, REPS, APPENDS = (2, 4, 8, 16), (0, 10), 1000, 3, 2000
OUT = Path(__file__).resolve().parent / "records" / "fanout_sim.json"
SETTINGS = [{"local": lo, "group": g, "upcast": up, "unroll": un, "group_axis": 0, "unroll_axis": 0}
            for lo in (8, 16) for g in (1, 2) for up in (2, 4) for un in (2, 4)]   # 16 settings


def tiny_task(i: int, seconds: float) -> tuple[int, float]:
    if seconds:
        time.sleep(seconds)
    return i, 1.0


def task_rate(k: int) -> dict:
    from distributed import as_completed
    from boltbeam.search import fanout
    t0 = time.perf_counter()
    with fanout.cluster("CPU", k) as c:
        out = {"workers": k, "cluster_start_s": time.perf_counter() - t0, "samples_s": {},
               "tasks_per_worker_last_rep": {}}
        c.client.gather([c.submit(tiny_task, i, 0) for i in range(4 * k)])   # warm-up, not counted
        for ms in SLEEPS_MS:
            samples = []
            for _ in range(REPS):
                t = time.perf_counter()
                futures = [c.submit(tiny_task, i, ms / 1e3) for i in range(TASKS)]
                for f in as_completed(futures):
                    f.result()
                samples.append(time.perf_counter() - t)
            out["tasks_per_worker_last_rep"][f"{ms}ms"] = sorted(Counter(w for ws in c.client.who_has(futures).values()
                                                                for w in ws).values())
            out["samples_s"][f"{ms}ms"] = samples
            del futures
    out["tasks_per_s"] = {d: [TASKS / s for s in v] for d, v in out["samples_s"].items()}
    return out


def record(i: int, kernel: str, name: str, setting: dict | None, default_us: float):
    from boltbeam.judge.verdicts import DIAGNOSTIC, REFUTE
    from boltbeam.measure.route import engine
    from boltbeam.search.decide import Record, Scope, setting_id
    sid = "default" if setting is None else setting_id(setting)
    us = default_us * (1 + 0.001 * (i % 97))
    scope = {**Scope("CPU", "h200", engine(), "tinygrad_opts").of(kernel, sid), "measured_us": us, "kernel_name": name}
    if setting is None:
        return Record(f"{kernel}:{sid}", DIAGNOSTIC, [f"tinygrad's heuristics: {us:,.3f} µs alone on the device"],
                      scope, None)
    return Record(f"{kernel}:{sid}", REFUTE, [f"{us:,.3f} µs, not faster than the default's {default_us:,.3f} µs "
                                              f"by more than 5%"], scope, f"engine!={engine()}")


def ledger_rate() -> dict:
    from boltbeam.ledger.store import Ledger
    recs = [record(i, f"{i // 17:024x}", f"r_128_2_4_2_2_2_32n{i // 17}", None if i % 17 == 0 else
                   SETTINGS[i % 17 - 1], 123.456) for i in range(APPENDS)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.sqlite"
        samples = []
        with Ledger(path) as ledger:
            for r in recs:
                t = time.perf_counter()
                r.append_to(ledger)
                samples.append(time.perf_counter() - t)
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())   # the WAL is checkpointed away on close
    return {"appends": APPENDS, "total_s": sum(samples), "appends_per_s": APPENDS / sum(samples),
            "median_append_s": statistics.median(samples), "file_bytes": size, "bytes_per_entry": size / APPENDS,
            "samples_s": samples}


def sizes() -> dict:
    import cloudpickle
    from boltbeam.search.compiler import Kernel
    from boltbeam.search.decide import Plan, Scope, Timings
    from boltbeam.search.fanout import Job
    from boltbeam.foresight.space import KernelShape
    key, name = "040d0b05d2baf15c2947d5cd", "r_128_2_4_2_2_2_32n1"
    timings = Timings(key, 123.456, [(s, 120.0 + i) for i, s in enumerate(SETTINGS)],
                      [record(0, key, name, None, 123.456)] + [record(i, key, name, s, 123.456)
                                                                for i, s in enumerate(SETTINGS, 1)],
                      seconds=4.2, timed_now=17)
    kernels = [Kernel(KernelShape(f"{i:024x}", f"r_{128 * (i % 4 + 1)}_4_2_32n{i}", 128 * (i % 4 + 1), 32,
                                  128 * (i % 4 + 1), 0, (4, 2, 32)), 1 + i % 2, 77828, 2202624,
                      ["Opt(op=OptOps.UPCAST, axis=0, arg=4)", "Opt(op=OptOps.UNROLL, axis=2, arg=0)"])
               for i in range(30)]
    objs = {"timings_16": timings, "plan_16": Plan(key, SETTINGS, {}, math.inf), "kernels_30": kernels,
            "scope": Scope("CPU", "h200", "tinygrad 0.13.0", "tinygrad_opts"),
            "job": Job("/tmp/sim_tiny.gguf", "0" * 64, "CPU", 8)}
    return {k: len(cloudpickle.dumps(v)) for k, v in objs.items()}


def capture(job) -> tuple[dict, list]:
    """The token captured once, on one worker of two (Cluster.kernels), and what each kernel weighs in a task."""
    import cloudpickle
    from distributed import get_task_stream
    from boltbeam.search import fanout
    t0 = time.perf_counter()
    with fanout.cluster("CPU", 2) as c:
        out = {"workers": 2, "cluster_start_s": time.perf_counter() - t0}
        with get_task_stream(c.client) as ts:
            t = time.perf_counter()
            captured = c.kernels(job)
            out["capture_wall_s"] = time.perf_counter() - t
        out["capture_compute_s"] = [s["stop"] - s["start"] for task in ts.data for s in task["startstops"]
                                    if s["action"] == "compute"]
    out["kernels"] = len(captured)
    out["pickled_bytes_per_kernel"] = sorted(len(cloudpickle.dumps(k)) for k in captured)
    return out, captured


if __name__ == "__main__":
    import cloudpickle
    from boltbeam.files import sha256_file
    from boltbeam.search.fanout import Job
    for name in ("distributed", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ["DEV"] = "CPU"
    t_start = time.perf_counter()
    model = Path(tempfile.gettempdir()) / "sim_tiny.gguf"
    subprocess.run([sys.executable, "-m", "boltbeam", "synth", str(model), "--arch", "qwen3", "--preset", "tiny",
                    "--mix", "q4_k_m"], check=True, capture_output=True)
    job = Job(str(model), sha256_file(model), "CPU", 8)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    rates = [task_rate(k) for k in WORKERS]
    ledger = ledger_rate()
    size = sizes()
    cap, captured = capture(job)
    size["captured_token"] = len(cloudpickle.dumps(captured))
    rec = {"command": " ".join([sys.executable.replace(os.getcwd() + "/", ""), *sys.argv]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
           "versions": {p: version(p) for p in ("boltbeam", "dask", "distributed", "tinygrad", "cloudpickle")},
           "note": f"CPU only, no GPU: each 'GPU' is a Dask resource on one worker process. K > {os.cpu_count()} "
                   "workers oversubscribe the cores (sleeping tasks do not need a core; the scheduler, the client "
                   "and the workers' event loops do). Tasks are read back one .result() at a time, as time_all does. "
                   "The ledger's fsyncs go to this VM's virtual disk (ext4); a real disk may be slower.",
           "task_rate": {"tasks": TASKS, "reps": REPS, "sleeps_ms": list(SLEEPS_MS), "by_workers": rates},
           "ledger": ledger, "pickled_bytes": size,
           "capture": {"model": "boltbeam synth --arch qwen3 --preset tiny --mix q4_k_m", "context": 8,
                       **cap},
           "run_s": time.perf_counter() - t_start}
    OUT.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {OUT} in {rec['run_s']:.0f} s")
    for r in rates:
        print(f"K={r['workers']:2}: start {r['cluster_start_s']:5.1f} s; tasks/s (median of {REPS}) " + ", ".join(
            f"{d} {statistics.median(v):7.1f}" for d, v in r["tasks_per_s"].items()))
    print(f"ledger: {ledger['appends_per_s']:.0f} appends/s, {ledger['bytes_per_entry']:.0f} bytes/entry")
    print("pickled bytes: " + ", ".join(f"{k} {v:,}" for k, v in size.items()))
    print(f"capture on one worker of two: compute {', '.join(f'{x:.1f}' for x in cap['capture_compute_s'])} s, "
          f"wall {cap['capture_wall_s']:.1f} s; {cap['kernels']} kernels of "
          f"{min(cap['pickled_bytes_per_kernel']):,}-{max(cap['pickled_bytes_per_kernel']):,} bytes pickled")
