"""Each product shape of the 8B-shaped Q4_K_M route, its word kernel timed alone at every legal gemv
geometry (spaces.toml `gemv` on the target's facts), beside FutureSight's prediction, and the byte
kernel at the opts BEAM chose for it on the searched route (bench/h200/searched), as a yardstick.

Calibration data, not a decision: the search judges geometries on the whole token. Timed as tinygrad's
BEAM times a kernel (its own _time_program, caches emptied before each run), on scratch buffers of the
kernel's sizes. Run on the device:  DEV=CUDA python bench/h200/gemv_geometry.py OUT.json [REPS]
"""
import json
import sys
import time
from statistics import median

from tinygrad import Device, Tensor, dtypes
from tinygrad.codegen.opt import KernelOptError, Opt, OptOps
from tinygrad.codegen.opt.postrange import bufs_from_ast
from tinygrad.codegen.opt.search import _time_program
from tinygrad.engine import realize

import tinygrad.codegen as codegen
from boltbeam.bound.targets import get_target
from boltbeam.measure.route import with_opts
from boltbeam.route.choose import gemv_settings
from boltbeam.route.layout import Planes
from boltbeam.search.future import Work, calibration, predict, rank_correlation
from scipy.stats import spearmanr   # noqa: F401  (rank_correlation's, imported early: a missing scipy fails first)

SECONDS_PER_SHAPE = 30    # then the rest of FutureSight's order goes untimed (the output says how many)
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


def planes(rows, cols, bits, group, high, offset, words):
    low_bytes = cols if bits == 8 else cols // 2
    t = lambda n: Tensor.empty(rows, n // 4 if words else n, dtype=dtypes.float32 if words else dtypes.uint8)
    return Planes(rows, cols, bits, group, t(low_bytes), t(cols * (bits - 4) // 8) if high else None,
                  Tensor.empty(rows, cols // group, dtype=dtypes.float16),
                  Tensor.empty(rows, cols // group, dtype=dtypes.float16) if offset else None, words=words)


def ast_of(p):
    seen = []
    orig = codegen.full_rewrite_to_sink
    def grab(ast, ren, optimize=True):
        if ast.arg is not None and ast.arg.name.startswith("gemv"):
            seen.append(ast)
        return orig(ast, ren, optimize)
    codegen.full_rewrite_to_sink = grab
    try:
        p.kernel_product(Tensor.empty(1, p.cols).contiguous()).realize()
    finally:
        codegen.full_rewrite_to_sink = orig
    return seen[0]


def timed(ast, opts, reps):
    ren = Device[Device.DEFAULT].renderer
    try:
        prg = realize.to_program(with_opts(ast, tuple(opts)), ren)
    except (KernelOptError, RuntimeError) as e:
        return str(e).splitlines()[0][:160]
    bufs = [b.ensure_allocated() for b in bufs_from_ast(ast, Device.DEFAULT)]
    return [t * 1e6 for t in _time_program(prg, {}, bufs, allow_test_size=False, cnt=reps, clear_l2=True)]


def main(out, reps=20):
    target = get_target("h200")
    cal = calibration("h200")
    word_cal = type(cal)(4, True, cal.bandwidth_fraction)
    geometries = gemv_settings(target)
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "reps": reps,
              "device": Device.DEFAULT, "shapes": []}
    for name, rows, cols, bits, group, high, offset, beam_opts in SHAPES:
        t0 = time.time()
        byte_p = planes(rows, cols, bits, group, high, offset, False)
        yard = timed(ast_of(byte_p), [Opt(OptOps[o], a, g) for o, a, g in beam_opts], reps)
        word_p = planes(rows, cols, bits, group, high, offset, True)
        ast = ast_of(word_p)
        nbytes = sum(t.nbytes() for t in word_p.tensors())
        rows_out = []
        fits = [g for g in geometries if g.opts(word_p) is not None]
        preds = {g: predict(Work(nbytes, 2 * rows * cols, rows), {"local": g.rows_per_group, "group": g.lanes_per_row,
                 "upcast": g.rows_per_thread, "unroll": g.words_per_load(word_p)}, target, word_cal) for g in fits}
        for g in sorted(fits, key=lambda g: preds[g].us):     # FutureSight's order: a cut-off keeps its best
            if time.time() - t0 > SECONDS_PER_SHAPE:
                break
            pred, got = preds[g], timed(ast, g.opts(word_p), reps)
            rows_out.append({"geometry": g.flag, "predicted_us": pred.us,
                             "median_us": median(got) if isinstance(got, list) else None,
                             "samples_us": got if isinstance(got, list) else None,
                             "refused": None if isinstance(got, list) else got})
        ok = [r for r in rows_out if r["median_us"]]
        best = min(ok, key=lambda r: r["median_us"]) if ok else None
        rho = rank_correlation([r["predicted_us"] for r in ok], [r["median_us"] for r in ok])
        shape = {"name": name, "rows": rows, "cols": cols, "bits": bits, "bytes": nbytes,
                 "byte_kernel_beam_opts_us": median(yard) if isinstance(yard, list) else yard,
                 "byte_kernel_samples_us": yard if isinstance(yard, list) else None,
                 "best": best and {"geometry": best["geometry"], "median_us": best["median_us"],
                                   "gb_s": nbytes / best["median_us"] / 1e3},
                 "futuresight_first": min(ok, key=lambda r: r["predicted_us"])["geometry"] if ok else None,
                 "spearman": rho, "fitting": len(fits), "geometries": rows_out, "seconds": round(time.time() - t0, 1)}
        result["shapes"].append(shape)
        print(f"{name}: BEAM's byte kernel {shape['byte_kernel_beam_opts_us']} µs; best word geometry "
              f"{best and best['geometry']} {best and round(best['median_us'], 2)} µs "
              f"({best and round(shape['best']['gb_s'])} GB/s); FutureSight first {shape['futuresight_first']}; "
              f"spearman {rho and round(rho, 3)}; {len(ok)} of {len(fits)} timed, {shape['seconds']} s", flush=True)
        json.dump(result, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
