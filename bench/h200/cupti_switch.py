"""Which CUPTI switch orders survive a CUDA graph replay (for tokens timed per launch, switches.CUPTI_PER_LAUNCH).

On an H200 (driver 580.159.04, cupti-python 13.0.1, 2026-12-05) a profile that switched CUPTI from kernel records to
graph records between tokens crashed inside cuGraphLaunch (bench/h200/models/README.md). This script replays a small
tinygrad CUDA graph (a TinyJit captured before CUPTI starts, as profile's decode is) under each order below, each in a
child process of its own so a crash is one result, and prints a JSON line per order: its exit code and the records
it saw.

    source bench/h200/setup.sh && python3 bench/h200/cupti_switch.py > $OUT/cupti_switch.jsonl
"""
from __future__ import annotations

import json
import subprocess
import sys

# Each order: the activity kinds enabled before each of three graph replays ("kernel", "graph", "graph+calls" or
# "none"); between replays what was on is disabled first, as graph_timing.Cupti switches.
ORDERS = {
    "kernel, graph, kernel (profile's switch)": ["kernel", "graph", "kernel"],
    "graph, kernel (the switch the other way)": ["graph", "kernel", "kernel"],
    "graph only": ["graph", "graph", "graph"],
    "kernel only": ["kernel", "kernel", "kernel"],
    "kernel, graph with its launch calls": ["kernel", "graph+calls", "kernel"],
    "graph, kernel, graph (back and forth from graph records)": ["graph", "kernel", "graph"],
    "kernel, nothing, graph (a replay with CUPTI idle between)": ["kernel", "none", "graph"],
    "nothing, graph, kernel": ["none", "graph", "kernel"],
}


def child(steps: list[str]) -> None:
    import os
    os.environ.setdefault("DEV", "CUDA")
    from cupti import cupti
    from tinygrad import Tensor, TinyJit

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ x).relu() + 1).sum(axis=0).realize()

    x = Tensor.rand(256, 256).realize()
    for _ in range(3):               # captured and replayed before CUPTI starts
        step(x).numpy()
    seen = {"kernel": 0, "graph": 0, "calls": 0}
    kind = cupti.ActivityKind

    def completed(activities):
        for a in activities:
            if a.kind == kind.CONCURRENT_KERNEL:
                seen["kernel"] += 1
            elif a.kind == kind.GRAPH_TRACE:
                seen["graph"] += 1
            elif a.kind in (kind.DRIVER, kind.RUNTIME):
                seen["calls"] += 1
    cupti.activity_register_callbacks(lambda: (8 << 20, 0), completed)
    on = []
    for s in steps:
        for k in on:
            cupti.activity_disable(k)
        on = {"kernel": [kind.CONCURRENT_KERNEL], "graph": [kind.GRAPH_TRACE],
              "graph+calls": [kind.GRAPH_TRACE, kind.DRIVER], "none": []}[s]
        for k in on:
            cupti.activity_enable(k)
        print(f"replay with {s}", file=sys.stderr, flush=True)
        step(x).numpy()
    cupti.activity_flush_all(1)
    print(json.dumps(seen))


def main() -> None:
    if len(sys.argv) > 1:
        child(json.loads(sys.argv[1]))
        return
    for name, steps in ORDERS.items():
        done = subprocess.run([sys.executable, "-X", "faulthandler", __file__, json.dumps(steps)], capture_output=True,
                              text=True, timeout=300)
        last = done.stdout.strip().splitlines()[-1:] or ["{}"]
        print(json.dumps({"order": name, "steps": steps, "rc": done.returncode,
                          "records": json.loads(last[0]) if done.returncode == 0 else None,
                          "stderr_tail": done.stderr.strip().splitlines()[-4:]}), flush=True)


if __name__ == "__main__":
    main()
