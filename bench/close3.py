"""Run tests/test_close3.py (the CPU account closing three times of three) several times on this machine and record
each run: the command, the date, the machine's load before and after, each account's residual and refusals.

    .venv/bin/python bench/close3.py --runs 4 --out bench/records/close3.json
"""
import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

COMMAND = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-s", "-p", "no:cacheprovider", "tests/test_close3.py"]


def one_run() -> dict:
    load_before, started = os.getloadavg(), time.time()
    with tempfile.TemporaryDirectory(prefix="close3-") as tmp:     # pytest's own folder, not the shared default
        done = subprocess.run([*COMMAND, f"--basetemp={tmp}/t"], capture_output=True, text=True)
    said = [line for line in done.stdout.splitlines() if line.startswith("close3 ")]
    return {"started": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(time.time() - started, 1), "passed": done.returncode == 0,
            "load_before": load_before, "load_after": os.getloadavg(),
            "accounts": json.loads(said[-1][len("close3 "):]) if said else None,
            "tail": None if said else done.stdout[-2000:] + done.stderr[-2000:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(one_run())
        print(json.dumps(runs[-1]), flush=True)
    record = {"command": " ".join(["python"] + COMMAND[1:]), "host": platform.node(), "cpus": os.cpu_count(),
              "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "note": "the machine is shared: load is every process's on it, ours included", "runs": runs}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
