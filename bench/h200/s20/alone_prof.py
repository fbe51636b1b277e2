"""gemv's products timed alone as tune times them (search/alone.py), for the first N product shapes, biggest first,
at most K geometries and S seconds each, their kernels compiled by W processes beside this one (0: here, one at
a time): run under cProfile to see where the host's seconds go.

  python3 bench/h200/s20/alone_prof.py MODEL TARGET K S N W
"""
import sys
import time

import numpy as np

from boltbeam.bound.targets import get_target
from boltbeam.foresight.future import calibration
from boltbeam.read.census import take_census
from boltbeam.route.families import BY_NAME
from boltbeam.route.gemv import product_key
from boltbeam.route.layout import Setting
from boltbeam.search import alone
from boltbeam.search.choose import legal_space
from boltbeam.search.compiler import compile_pool


def main():
    model, target_name, most, seconds, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    workers = int(sys.argv[6])
    census, target = take_census(model), get_target(target_name)
    legal = legal_space(BY_NAME["gemv"], target)[0]
    setting = Setting(scale_dtype="float16", form="kernel")
    rng = np.random.default_rng(0)
    counted = sorted(alone.shapes(census, setting).items(), key=lambda kv: -kv[0].rows * kv[0].cols * kv[0].bits)
    with compile_pool(workers) as pool:
        for shape, count in counted[:n]:
            t = time.monotonic()
            p = alone.time_product(shape, count, setting.scale_dtype, legal, target, calibration(target.name), most, seconds,
                                   rng, pool=pool)
            print(product_key(shape.planes()), f"workers {workers}", len(p.timed), p.best, p.best_us,
                  f"{time.monotonic() - t:.1f} s", flush=True)


if __name__ == "__main__":     # the compile pool's processes import this file again
    main()
