"""Speed and memory of Read and Bound: `inspect` plus `bound` of one model file, in a fresh process.

  python bench/speed_read_bound.py MODEL.gguf [--target h200] [--runs 5] [--out RECORD.json]

Goal: under 1 second and under 300 MB peak memory for the 5 GB Qwen3-8B-shaped synthetic file,
without reading tensor data (peak RSS far below the file's size shows the data stayed on disk).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version

CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from boltbeam.read.census import take_census
from boltbeam.bound.roofline import bound
from boltbeam.bound.targets import get_target
c = take_census(sys.argv[1])
inspect = c.to_dict()
b = bound(c, get_target(sys.argv[2]), context=512).to_dict()
t1 = time.perf_counter()
json.dump({"seconds": t1 - t0, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "tensors": len(inspect["tensors"]), "bytes_per_token": inspect["bytes_per_token"],
           "token_floor_us": b["token_floor_us"]}, sys.stdout)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--target", default="h200")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    samples, cli = [], []
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CHILD, args.model, args.target], capture_output=True, text=True, check=True)
        samples.append(json.loads(done.stdout))
        t0 = time.perf_counter()   # the same work through the CLI, interpreter start-up included
        subprocess.run([sys.executable, "-m", "boltbeam", "inspect", args.model, "--json"], capture_output=True, check=True)
        subprocess.run([sys.executable, "-m", "boltbeam", "bound", args.model, "--target", args.target, "--json"],
                       capture_output=True, check=True)
        cli.append(time.perf_counter() - t0)
    secs = [s["seconds"] for s in samples]
    record = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "machine": platform.node(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(), "versions": {k: version(k) for k in ("boltbeam", "gguf", "numpy")},
        "model": args.model, "model_bytes": os.path.getsize(args.model),
        "median_seconds": statistics.median(secs), "max_peak_rss_bytes": max(s["peak_rss_bytes"] for s in samples),
        "median_cli_seconds_inspect_plus_bound": statistics.median(cli),
        "goal": "inspect + bound under 1 s and under 300 MB peak memory, no tensor data read",
        "samples": samples, "cli_samples_s": cli,
    }
    text = json.dumps(record, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
