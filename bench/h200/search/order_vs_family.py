"""Was the order (FutureSight) or the family the limit in search runs 1-3? (CPU only, from the records)

    python bench/h200/search/order_vs_family.py

For each kernel of run 3's summary: BubbleBeam's legal settings of the family those runs searched (the
four splits, each reduction split on the longest axis), FutureSight's order with the default and the
fitted constants, the first B settings of that order, and, of those, the ones runs 1-3 measured (their
ledgers): the best of them (or the default) per kernel, times its launches, summed. Against it: the
best of every setting measured in any of the three runs. Kernel times alone, caches emptied, so the
sums are not whole tokens.
"""
import collections
import dataclasses
import json
import sqlite3
from pathlib import Path

from boltbeam.bound.targets import get_target
from boltbeam.foresight.future import Calibration, Work, foresee
from boltbeam.foresight.space import SPLITS, KernelShape, propose, searchable

HERE = Path(__file__).parent
h200 = get_target("h200")
full = searchable("tinygrad_opts")
fam = dataclasses.replace(full, parameters={p: v for p, v in full.parameters.items() if p in SPLITS})
fam = dataclasses.replace(fam, parameters={**fam.parameters, "group": (1, 4, 8, 16, 32, 64, 128, 256)})  # runs 1-3's values
measured = collections.defaultdict(dict)
for run, ledger in (("run1", "ledger.sqlite"), ("run2", "ledger24.sqlite"), ("run3", "ledger.sqlite")):
    for (scope,) in sqlite3.connect(HERE / run / ledger).execute("select scope from entries"):
        s = json.loads(scope)
        if "measured_us" in s and s.get("setting") not in (None, "space"):
            measured[s["kernel_name"]].setdefault(s["setting"], []).append(s["measured_us"])
summary = json.loads((HERE / "run3" / "search.json").read_text())
sid = lambda st: ",".join(f"{k}={v}" for k, v in sorted(st.items()))
rows = []
for cal in (Calibration(), Calibration(32, False)):
    for budget in (8, 16, 32):
        total = oracle = 0.0
        for k in summary["per_kernel"]:
            shape = KernelShape(k["kernel"], k["name"], k["output"], k["reduce"], outputs=k["outputs"])
            work = Work(int(k["floor_us"] * h200.bandwidth / 1e6), 0, max(1, k["outputs"]))
            order = [sid(s) for s, _ in foresee(work, propose(shape, fam, h200).legal, h200, cal).ordered[:budget]]
            m = measured[k["name"]]
            total += min([min(m["default"])] + [min(m[s]) for s in order if s in m]) * k["launches"]
            oracle += min(min(v) for v in m.values()) * k["launches"]
        rows.append({"calibration": dataclasses.asdict(cal), "budget": budget, "sum_alone_us": round(total),
                     "best_measured_sum_alone_us": round(oracle)})
print(json.dumps(rows, indent=1))
