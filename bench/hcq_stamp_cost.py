"""What one bracket stamp costs the host on tinygrad's CPU device: the Recorder's _HcqBracket marks,
submitted 1,000 times and waited for, per mark (µs); three repeats.

  DEV=CPU python bench/hcq_stamp_cost.py --out bench/records/hcq_stamp_cost.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from importlib.metadata import version

from boltbeam.measure.tinygrad_run import _HcqBracket


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--marks", type=int, default=1000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tinygrad import Device
    bracket = _HcqBracket("CPU")
    bracket.first()
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(args.marks):
            bracket.last()
        Device["CPU"].synchronize()
        samples.append((time.perf_counter() - t0) * 1e6 / args.marks)
    record = {"command": f"DEV=CPU python bench/hcq_stamp_cost.py --marks {args.marks} --out {args.out}",
              "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "versions": {p: version(p) for p in ("boltbeam", "tinygrad")},
              "us_per_mark": samples}
    with open(args.out, "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    print(", ".join(f"{s:.1f}" for s in samples), "µs a mark")


if __name__ == "__main__":
    main()
