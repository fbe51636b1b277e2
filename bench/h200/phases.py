"""Where tune's minutes went, process by process: every trace under a folder (tune's DIR/traces), its phases
(the trace's provenance.phases: setup, load, families, prefill, warm-up, tokens) and their sums, as JSON.

  python3 bench/h200/phases.py DIR/traces OUT.json
"""
import dataclasses
import json
import sys
from pathlib import Path

from boltbeam.errors import BadInput
from boltbeam.measure import trace as tracefile


def main(folder: str, out: str) -> None:
    rows, sums = [], {}
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            phases = tracefile.load(str(path)).provenance.phases
        except BadInput:        # a route file, not a trace
            continue
        if phases is None:
            continue
        row = dataclasses.asdict(phases)
        rows.append({"trace": str(path.relative_to(folder)), **row})
        for k, v in row.items():
            sums[k] = round(sums.get(k, 0.0) + v, 3)
    Path(out).write_text(json.dumps({"command": " ".join(sys.argv), "processes": len(rows), "sums_s": sums,
                                     "each": rows}, indent=1))
    print(f"{len(rows)} profiles: " + ", ".join(f"{k} {v:,.0f} s" for k, v in sums.items()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
