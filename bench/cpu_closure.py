"""Does the CPU account close every time? Profile and account each model RUNS times in fresh processes,
and record every residual. Launch and sync are measured on each token (the brackets and the host's
marks), so no launch facts are calibrated first; the target is this machine's measured `host`.

  python bench/cpu_closure.py --runs 3 --tokens 64 --out bench/records/cpu_closure_brackets.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from boltbeam.cli.read import default_model
from boltbeam.synth.writer import shape_from, write

BOLTBEAM = [sys.executable, "-m", "boltbeam"]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BOLTBEAM, *argv], capture_output=True, text=True, env={**os.environ, "DEV": "CPU"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="boltbeam-closure-"))
    tiny = tmp / "tiny.gguf"
    write(tiny, "qwen3", shape_from("tiny"), "q4_k_m")
    models = {"tiny synthetic (qwen3, q4_k_m)": (str(tiny), "8"), "embedded SmolLM2-135M Q4_1": (default_model(), "4")}
    results = []
    for name, (model, context) in models.items():
        for i in range(args.runs):
            trace = tmp / f"{i}.json"
            p = run("profile", model, "--device", "CPU", "--context", context, "--tokens", str(args.tokens),
                    "--no-hash", "--out", str(trace))
            assert p.returncode == 0, p.stderr
            a = run("account", str(trace), "--model", model, "--target", "host", "--no-hash-check", "--json")
            d = json.loads(a.stdout)
            results.append({"model": name, "run": i, "exit": a.returncode, "closed": d["closed"],
                            "wall_us": d["wall_us"], "residual_us": d["residual_us"],
                            "residual_fraction": d["residual_fraction"], "timed_wall_us": d["kernel_pass_wall_us"],
                            "outside_span_us": d["outside_span_us"], "lead_us": d["lead_us"], "trail_us": d["trail_us"],
                            "measured_lines_us": {x["label"]: x["us"] for x in d["lines"] if x["kind"] in ("launch", "timing")},
                            "refusals": d["refusals"]})
            print(f"{name} run {i}: residual {d['residual_fraction']:+.2%} ({'closed' if d['closed'] else 'refused'})")
    record = {"command": " ".join(["bench/cpu_closure.py", *sys.argv[1:]]),
              "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
              "versions": {p: version(p) for p in ("boltbeam", "tinygrad", "gguf")},
              "results": results,
              "closed": sum(r["closed"] for r in results), "of": len(results)}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
