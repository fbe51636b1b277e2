"""The README's main command, timed whole: `boltbeam audit` on the embedded model on CPU.

    python bench/audit_speed.py --runs 3 --out bench/records/audit_cpu.json

Each run is a fresh process (time.monotonic around it; peak memory from the operating system's
accounting of the finished child), into a fresh folder; the record keeps every run's seconds, its
summary (`--json`) and the report's size. Goal (issue 10): under 2 minutes on a 2-core machine.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

COMMAND = ["audit", "--device", "CPU", "--target", "host", "--context", "16", "--tokens", "5"]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--runs", type=int, default=3)
parser.add_argument("--out", required=True)
args = parser.parse_args()

samples = []
for i in range(args.runs):
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "boltbeam", *COMMAND, "--out", tmp, "--json"],
                              capture_output=True, text=True, check=True)
        seconds = time.monotonic() - start
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        summary = json.loads(done.stdout)
        samples.append({"seconds": seconds, "peak_rss_bytes": peak_kib * 1024 if peak_kib > before else None,
                        "report_bytes": (Path(tmp) / "report.html").stat().st_size,
                        "account": summary["account"], "wall_us": summary["wall_us"]})
    print(f"run {i + 1}: {seconds:.1f} s, account {summary['account']}", file=sys.stderr)

record = {"command": "boltbeam " + " ".join(COMMAND) + " --out DIR", "machine": platform.node() or "unknown",
          "platform": platform.platform(), "cpus": os.cpu_count(), "date": dt.date.today().isoformat(),
          "python": platform.python_version(),
          "versions": {p: metadata.version(p) for p in ("boltbeam", "tinygrad", "matplotlib", "jinja2")},
          "goal": "under 120 s on a 2-core machine", "median_seconds": statistics.median(s["seconds"] for s in samples),
          "accounts_closed": sum(s["account"] == "closed" for s in samples), "samples": samples}
Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
print(json.dumps({k: v for k, v in record.items() if k != "samples"}, indent=1))
