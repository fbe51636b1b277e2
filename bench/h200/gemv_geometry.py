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
from statistics import median

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import KernelOptError, Opt, OptOps
from tinygrad.codegen.opt.postrange import bufs_from_ast
from tinygrad.codegen.opt.search import _time_program
from tinygrad.engine import realize

import tinygrad.codegen as codegen
from boltbeam.bound.targets import get_target
from boltbeam.measure.route import with_opts
from boltbeam.route.choose import GEMV, geometry_sight
from boltbeam.route.layout import Planes
from boltbeam.search.future import calibration, rank_correlation

SECONDS_PER_SHAPE = 30    # then the rest of FutureSight's order goes untimed (the output says how many)
CHECK = 1e-4              # a geometry's product against the planes' weights times the input, relative to its largest
# (name, rows, cols, bits, group, high, offset, BEAM's opts for the byte kernel on the searched route)
SHAPES = [
    ("gate+up Q4_K", 24576, 4096, 4, 32, False, True,
     [("LOCAL", 0, 16), ("GROUP", 0, 16), ("UPCAST", 1, 4), ("UNROLL", 2, 0)]),
    ("q+k Q4_K", 5120, 4096, 4, 32, False, True,
     [("LOCAL", 0, 8), ("GROUP", 0, 4), ("UPCAST", 1, 2), ("GROUP", 0, 8), ("UNROLL", 3, 4), ("UNROLL", 2, 0), ("UNROLL", 2, 0)]),
    ("output Q4_K", 4096, 4096, 4, 32, False, True,
     [("LOCAL", 0, 8), ("GROUP", 0, 16), ("UNROLL", 2, 0), ("UNROLL", 1, 4), ("UPCAST", 1, 2)]),
    ("down Q6_K", 4096, 12288, 6, 16, True, False,
     [("GROUP", 0, 16), ("UNROLL", 2, 0), ("GROUP", 0, 4), ("UPCAST", 0, 2), ("LOCAL", 0, 16), ("UNROLL", 2, 4)]),
]


def planes(rows, cols, bits, group, high, offset, rng):
    """Random byte planes of this shape, realized (float16 scales and offsets; Q6_K's zero point 32)."""
    u8 = lambda n: Tensor(rng.integers(0, 256, (rows, n), dtype=np.uint8))
    f16 = lambda: Tensor(rng.uniform(-1e-2, 1e-2, (rows, cols // group)).astype(np.float16))
    p = Planes(rows, cols, bits, group, u8(cols if bits == 8 else cols // 2), u8(cols * (bits - 4) // 8) if high else None,
               f16(), f16() if offset else None, zero=0 if offset else 1 << (bits - 1))
    Tensor.realize(*p.tensors())
    return p


def ast_of(p, x):
    seen = []
    orig = codegen.full_rewrite_to_sink
    def grab(ast, ren, optimize=True):
        if ast.arg is not None and ast.arg.name.startswith("gemv"):
            seen.append(ast)
        return orig(ast, ren, optimize)
    codegen.full_rewrite_to_sink = grab
    try:
        p.memo = None
        p.kernel_product(x).realize()
    finally:
        codegen.full_rewrite_to_sink = orig
    return seen[0]


def timed(ast, opts, reps, rng):
    ren = Device[Device.DEFAULT].renderer
    try:
        prg = realize.to_program(with_opts(ast, tuple(opts)), ren)
    except (KernelOptError, RuntimeError) as e:
        return str(e).splitlines()[0][:160]
    bufs = [b.ensure_allocated() for b in bufs_from_ast(ast, Device.DEFAULT)]
    for b in bufs:
        b.copyin(memoryview(bytearray(rng.bytes(b.nbytes))))
    return [t * 1e6 for t in _time_program(prg, {}, bufs, allow_test_size=False, cnt=reps, clear_l2=True)]


def main(out, reps=20, shrink=1):
    rng = np.random.default_rng(0)
    target = get_target("h200")
    cal = calibration("h200")
    geometries = GEMV.space(target)[0]
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "reps": reps,
              "shrink": shrink, "device": Device.DEFAULT, "shapes": []}
    for name, rows, cols, bits, group, high, offset, beam_opts in SHAPES:
        t0 = time.time()
        rows //= shrink
        byte_p = planes(rows, cols, bits, group, high, offset, rng)
        x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
        want = (x @ byte_p.weights().T).numpy().ravel()
        yard = timed(ast_of(byte_p, x), [Opt(OptOps[o], a, g) for o, a, g in beam_opts], reps, rng)
        word_p = Planes(**{**vars(byte_p), "memo": None})
        word_p.to_words()
        ast = ast_of(word_p, x)
        nbytes = word_p.nbytes
        sights = {g: s for g in geometries if (s := geometry_sight(word_p, nbytes, g, target, cal)) is not None}
        rows_out = []
        for g in sorted(sights, key=lambda g: sights[g].us):     # FutureSight's order: a cut-off keeps its best
            if time.time() - t0 > SECONDS_PER_SHAPE:
                break
            word_p.geometry, word_p.thread_groups, word_p.memo = g, Device[Device.DEFAULT].renderer.has_local, None
            got = word_p.gemv(x, "kernel").numpy().ravel()
            err = float(np.abs(got - want).max() / np.abs(want).max())
            opts = g.opts(word_p, 1, Device[Device.DEFAULT].renderer.has_local)
            samples = timed(ast, opts, reps, rng) if err <= CHECK else f"wrong product: relative error {err:.3g}"
            rows_out.append({"geometry": g.flag, "predicted_us": sights[g].us, "relative_error": err,
                             "median_us": median(samples) if isinstance(samples, list) else None,
                             "samples_us": samples if isinstance(samples, list) else None,
                             "refused": None if isinstance(samples, list) else samples})
        ok = [r for r in rows_out if r["median_us"]]
        best = min(ok, key=lambda r: r["median_us"]) if ok else None
        rho = rank_correlation([r["predicted_us"] for r in ok], [r["median_us"] for r in ok])
        shape = {"name": name, "rows": rows, "cols": cols, "bits": bits, "bytes": nbytes,
                 "byte_kernel_beam_opts_us": median(yard) if isinstance(yard, list) else yard,
                 "byte_kernel_samples_us": yard if isinstance(yard, list) else None,
                 "best": best and {"geometry": best["geometry"], "median_us": best["median_us"],
                                   "gb_s": nbytes / best["median_us"] / 1e3},
                 "futuresight_first": min(ok, key=lambda r: r["predicted_us"])["geometry"] if ok else None,
                 "spearman": rho, "fitting": len(sights), "geometries": rows_out, "seconds": round(time.time() - t0, 1)}
        result["shapes"].append(shape)
        print(f"{name}: BEAM's byte kernel {shape['byte_kernel_beam_opts_us']} µs; best word geometry "
              f"{best and best['geometry']} {best and round(best['median_us'], 2)} µs "
              f"({best and round(shape['best']['gb_s'])} GB/s); FutureSight first {shape['futuresight_first']}; "
              f"spearman {rho and round(rho, 3)}; {len(ok)} of {len(sights)} timed, {shape['seconds']} s", flush=True)
        json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
