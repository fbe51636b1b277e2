"""Each product shape of the 8B-shaped Q4_K_M route, its word kernel checked and timed alone at every
legal gemv geometry (spaces.toml `gemv` on the target's facts), beside FutureSight's prediction, and
the byte kernel at the opts BEAM chose for it on the searched route (bench/h200/searched), as a yardstick.

Calibration data, not a decision: the search judges geometries on the whole token. Each geometry's
product is first checked on the device against the planes' weights times the input (tensor code),
on random planes; a geometry that computes anything else is reported and not timed. Timed as
tinygrad's BEAM times a kernel (its own _time_program, caches emptied before each run), on scratch
buffers of the kernel's sizes filled with random bytes (never zeros). Run on the device:

    DEV=CUDA python bench/h200/gemv_geometry.py OUT.json [REPS] [SHRINK]

SHRINK divides every shape's rows (a quick run on a CPU to check the script: DEV=CPU ... 5 64).
"""
import json
import sys
import time
from dataclasses import asdict
from statistics import median

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.codegen.opt import Opt, OptOps

from boltbeam.bound.targets import get_target
from boltbeam.search.alone import Shape, kernel_asts, random_planes, time_alone, time_product
from boltbeam.route import gemv
from boltbeam.search.choose import space
from boltbeam.foresight.future import calibration

SECONDS_PER_SHAPE = 30    # then the rest of FutureSight's order goes untimed (the output says how many)
# (name, rows, cols, bits, group, an offset a group, BEAM's opts for the byte kernel on the searched route)
SHAPES = [
    ("gate+up Q4_K", 24576, 4096, 4, 32, True,
     [("LOCAL", 0, 16), ("GROUP", 0, 16), ("UPCAST", 1, 4), ("UNROLL", 2, 0)]),
    ("q+k Q4_K", 5120, 4096, 4, 32, True,
     [("LOCAL", 0, 8), ("GROUP", 0, 4), ("UPCAST", 1, 2), ("GROUP", 0, 8), ("UNROLL", 3, 4), ("UNROLL", 2, 0), ("UNROLL", 2, 0)]),
    ("output Q4_K", 4096, 4096, 4, 32, True,
     [("LOCAL", 0, 8), ("GROUP", 0, 16), ("UNROLL", 2, 0), ("UNROLL", 1, 4), ("UPCAST", 1, 2)]),
    ("down Q6_K", 4096, 12288, 6, 16, False,
     [("GROUP", 0, 16), ("UNROLL", 2, 0), ("GROUP", 0, 4), ("UPCAST", 0, 2), ("LOCAL", 0, 16), ("UNROLL", 2, 4)]),
]


def main(out, reps=20, shrink=1):
    rng = np.random.default_rng(0)
    target = get_target("h200")
    cal = calibration("h200")
    geometries = space(gemv.FAMILY, target)[0]
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "reps": reps,
              "shrink": shrink, "device": Device.DEFAULT, "shapes": []}
    for name, rows, cols, bits, group, offset, beam_opts in SHAPES:
        shape = Shape(rows // shrink, cols, bits, group, offset)
        byte_p = random_planes(shape, "float16", rng)
        x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
        yard = time_alone(kernel_asts(byte_p, x), [Opt(OptOps[o], a, g) for o, a, g in beam_opts], reps, rng)
        yard = yard[0] if isinstance(yard, list) else yard      # the byte kernel: one kernel
        # every legal geometry in FutureSight's order, each checked then timed, until the time is up
        got = time_product(shape, 1, "float16", geometries, target, cal, len(geometries), SECONDS_PER_SHAPE, rng, reps)
        ok = [r for r in got.timed if r.median_us is not None]
        row = {"name": name, "rows": shape.rows, "cols": cols, "bits": bits, "bytes": got.bytes,
               "byte_kernel_beam_opts_us": median(yard) if isinstance(yard, list) else yard,
               "byte_kernel_samples_us": yard if isinstance(yard, list) else None,
               "best": got.best and {"geometry": got.best, "median_us": got.best_us, "gb_s": got.bytes / got.best_us / 1e3},
               "futuresight_first": ok[0].geometry if ok else None, "spearman": got.spearman, "fitting": got.legal,
               "geometries": [asdict(r) for r in got.timed], "seconds": got.seconds}
        result["shapes"].append(row)
        print(f"{name}: BEAM's byte kernel {row['byte_kernel_beam_opts_us']} µs; best word geometry {got.best} "
              f"{got.best_us and round(got.best_us, 2)} µs ({got.best and round(row['best']['gb_s'])} GB/s); "
              f"FutureSight first {row['futuresight_first']}; spearman {got.spearman and round(got.spearman, 3)}; "
              f"{len(ok)} of {got.legal} timed, {got.seconds} s", flush=True)
        json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
