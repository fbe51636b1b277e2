"""Each product of a route's per-product gemv setting timed alone at its geometry and at a few others, each
with the input's group sums summed by every thread (input_sums 0) and computed once by a kernel of their
own (input_sums 1, that kernel's time added): route/alone.py's check and timing, nothing else. Calibration
data, not a decision: the search judges on the whole token. Run on the device:

    DEV=CUDA python bench/h200/input_sums.py ROUTE.json OUT.json [REPS] [SHRINK]

SHRINK divides every shape's rows (a quick run on a CPU to check the script: DEV=CPU ... 5 64).
"""
import dataclasses
import json
import sys
import time
from dataclasses import asdict

import numpy as np
from tinygrad import Device

from boltbeam.bound.targets import get_target
from boltbeam.search.alone import Shape, time_product
from boltbeam.route.gemv import Geometry, PerProduct
from boltbeam.foresight.future import calibration

OTHERS = ("32:4:4:16", "32:4:2:16")     # beside each product's own: the uniform route's and a common runner-up


def main(route: str, out: str, reps: int = 20, shrink: int = 1) -> None:
    rng = np.random.default_rng(0)
    target, cal = get_target("h200"), calibration("h200")
    setting = PerProduct.from_table(json.load(open(route))["gemv"], route)
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "reps": reps,
              "shrink": shrink, "device": Device.DEFAULT, "products": []}
    for key, own in setting.geometries:
        dims, q, g = key.split(":")
        rows, cols = map(int, dims.split("x"))
        bits, group = int(q[1:]), int(g[1:])
        shape = Shape(rows // shrink, cols, bits, group, offset=bits == 4)   # the route's 4-bit format (Q4_K) stores one
        geometries = [dataclasses.replace(geo, input_sums=s) for geo in dict.fromkeys([own, *map(Geometry.parse, OTHERS)])
                      for s in (0, 1)]
        got = time_product(shape, 1, "float16", geometries, target, cal, len(geometries), 600, rng, reps)
        result["products"].append({"key": key, "own": own.flag, **asdict(got)})
        print(key, [(r.geometry, r.median_us and round(r.median_us, 2), r.refused) for r in got.timed], flush=True)
        json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
