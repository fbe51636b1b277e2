"""One gemv, four ways, each with tinygrad's BEAM choosing its opts: the GGUF blocks as tinygrad decodes
them by default (the weights cast to fp16, as tinygrad.llm loads them), and the generated repacked
layout (route/layout.py) in each setting. Every way runs COPIES different weight matrices of the
same shape inside one JIT graph (more bytes than the L2 holds, as in a real token); a sample is the
graph's wall (launch and a sync included) divided by COPIES. BEAM_WIDTH (default 2), SAMPLES,
ONLY (a substring of "(format, rows, cols) way") and SMALL=1 (tiny shapes, to check the script on a CPU).

    DEV=CUDA BEAM=2 python3 bench/h200/layout_kernels.py OUT.json
"""
import json
import os
import statistics
import sys
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from tinygrad import Context, Device, Tensor, TinyJit, dtypes
from tinygrad.llm.gguf import ggml_data_to_tensor
from tinygrad.helpers import GlobalCounters

from boltbeam.bound.roofline import formats
from boltbeam.route.layout import repack

COPIES, SAMPLES = int(os.environ.get("COPIES", 4)), int(os.environ.get("SAMPLES", 30))
SHAPES = [("Q4_K", 12288, 4096), ("Q6_K", 4096, 12288), ("Q4_K", 4096, 4096), ("Q6_K", 151936, 4096)]
if os.environ.get("SMALL"):    # a quick check of the script itself on a CPU
    SHAPES = [("Q4_K", 256, 512), ("Q6_K", 128, 512)]
WAYS = ["gguf", "float16:expanded", "float16:factored", "float32:expanded"]


def blocks_of(fmt: str, rows: int, cols: int, rng) -> Tensor:
    elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    b = np.frombuffer(rng.bytes(rows * cols // elements * size), np.uint8).reshape(-1, size).copy()
    for off in formats()[fmt]["half_fields"]:
        b[:, off:off + 2] = rng.uniform(5e-5, 1.5e-4, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return Tensor(b).realize()


def run(fmt: str, rows: int, cols: int, way: str, rng) -> dict:
    t = GGMLQuantizationType[fmt].value
    x = Tensor(rng.standard_normal((1, 1, cols)).astype(np.float32)).realize()
    mats, gguf_bytes = [], 0
    for _ in range(COPIES):
        b = blocks_of(fmt, rows, cols, rng)
        gguf_bytes = b.nbytes()
        if way == "gguf":
            mats.append(ggml_data_to_tensor(b.flatten(), rows * cols, t).reshape(rows, cols).cast(dtypes.float16))
        else:
            p = repack(b, fmt, rows, cols, way.split(":")[0])
            Tensor.realize(*p.tensors())
            mats.append(p)
    one = lambda m, x: x.matmul(m.T) if way == "gguf" else m.gemv(x, way.split(":")[1])
    GlobalCounters.reset()
    one(mats[0], x).realize()                     # outside a JIT, tinygrad counts the kernels it runs
    kernels = GlobalCounters.kernel_count
    t0 = time.perf_counter()
    # Each product realized on its own: stacking them let tinygrad fuse the copies into one kernel
    # unlike the model's (the 2026-11-30 record in bench/h200/layout/ was taken that way).
    step = TinyJit(lambda x: [one(m, x).realize() for m in mats])
    with Context(BEAM=int(os.environ.get("BEAM_WIDTH", 2))):
        for _ in range(3):
            out = step(x)
    Device[Device.DEFAULT].synchronize()
    search_s = time.perf_counter() - t0
    samples = []
    for _ in range(SAMPLES):
        t1 = time.perf_counter()
        step(x)
        Device[Device.DEFAULT].synchronize()
        samples.append((time.perf_counter() - t1) * 1e6 / COPIES)
    moved = gguf_bytes if way == "gguf" else mats[0].nbytes
    med = statistics.median(samples)
    return {"format": fmt, "rows": rows, "cols": cols, "way": way, "median_us": med, "samples_us": samples,
            "bytes_read": moved, "gguf_bytes": gguf_bytes, "gb_per_s": moved / med / 1e3,
            "kernels_per_gemv": kernels, "compile_and_search_s": search_s,
            "output_checksum": float(out[0].float().abs().sum().item())}


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    only = os.environ.get("ONLY")
    rows = []
    for shape in SHAPES:
        for way in WAYS:
            if only and only not in f"{shape} {way}":
                continue
            r = run(*shape, way, rng)
            rows.append(r)
            print(f"{r['format']} {r['rows']}x{r['cols']} {way:18s} {r['median_us']:9.1f} us {r['gb_per_s']:7.0f} GB/s "
                  f"{r['kernels_per_gemv']:.0f} kernel(s), {r['compile_and_search_s']:.0f} s to build", flush=True)
            json.dump({"command": " ".join(sys.argv), "device": Device.DEFAULT, "copies": COPIES, "rows": rows},
                      open(sys.argv[1], "w"), indent=1)
