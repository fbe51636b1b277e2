"""The layout's word kernel for a few product shapes at chosen geometries, run alone so that Nsight Compute
can read its counters (what holds a product below the memory's speed). Usage, on the device:

  ncu --clock-control none -k regex:gemv_words --section SpeedOfLight ... \
      python3 bench/h200/ncu_gemv.py ROWSxCOLS:qBITS:gGROUP:OFFSET=LANES:ROWS:PER_THREAD:LOAD_BYTES ...

OFFSET is 1 where the format stores an offset a group (Q4_K), 0 for a zero point (Q6_K). Each product is
checked against tensor code on its random planes (route/alone.py's random_planes), then run twice.
"""
import sys

import numpy as np


def main(specs: list[str]) -> None:
    from tinygrad import Device, Tensor

    from boltbeam.search.alone import Shape, random_planes
    from boltbeam.route.gemv import Geometry
    rng = np.random.default_rng(0)
    for spec in specs:
        product, flag = spec.split("=")
        dims, q, g, offset = product.split(":")
        rows, cols = map(int, dims.split("x"))
        p = random_planes(Shape(rows, cols, int(q[1:]), int(g[1:]), offset == "1"), "float16", rng)
        x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
        want = (x @ p.weights().T).numpy().ravel()
        p.to_words()
        p.geometry, p.thread_groups = Geometry.parse(flag), Device[Device.DEFAULT].renderer.has_local
        for _ in range(2):
            p.memo = None
            got = p.gemv(x, "kernel").numpy().ravel()
        err = float(np.abs(got - want).max() / np.abs(want).max())
        print(f"{spec}: {p.nbytes} bytes, relative error {err:.2e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
