"""The generated decode-attention kernels alone, in the forms FORMS names, at a model's attention shape: each form's
kernels for LAYERS distinct caches (as a token's layers read theirs) in one JIT graph, the position a
variable as in decode, timed over REPS replays (synchronized, so a replay's launch is in its figure), and
checked against tinygrad's attention. Not a route: a yardstick for the split attention family's kernel
forms before a whole token is judged (under Nsight Compute, each kernel's own time).

    DEV=CUDA [FORMS="32:kernel:wide 32:kernel:lanes"] [CACHE=float32] python bench/h200/attention_kernels.py OUT.json \
        [KV_HEADS GROUP HEAD_DIM POSITIONS DEPTH LAYERS REPS]
    (defaults: every generated form at chunks of 16 and 32 and lanes at 64; the 8B's 8 key heads of 4 query heads,
    128 dimensions, a 4,096-position cache, depth 540 (512 + the prompt), 36 layers, 50 replays; the cache in float16
    (as half_cache holds it; CACHE=float32: as tinygrad.llm holds it); on the CPU:
    DEV=PYTHON with small numbers, e.g. FORMS=16:kernel:lanes ... 2 2 16 64 40 2 2)
"""
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version

from tinygrad import Device, Tensor, TinyJit, UOp, dtypes

from boltbeam.route.attention import Split, decode_kernels

FORMS = [f"{c}:kernel{form}" for c in (16, 32) for form in ("", ":wide", ":wide:unrolled", ":lanes")] + ["64:kernel:lanes"]


def main(out: str, kv_heads=8, group=4, head_dim=128, positions=4096, depth=540, layers=36, reps=50) -> None:
    dev = Device.DEFAULT
    cache = os.environ.get("CACHE", "float16")
    cache_type = {"float16": dtypes.half, "float32": dtypes.float32}[cache]
    caches = [Tensor.randn(2, 1, kv_heads, positions, head_dim, dtype=cache_type).realize() for _ in range(layers)]
    q = Tensor.randn(1, kv_heads * group, 1, head_dim, dtype=dtypes.half).realize()
    x = Tensor.randn(2, 1, kv_heads, 1, head_dim, dtype=cache_type).realize()
    pos = UOp.variable("start_pos", 0, positions - 1)
    forms = os.environ.get("FORMS", " ".join(FORMS)).split()
    record = {"command": f"DEV={dev} FORMS='{' '.join(forms)}' CACHE={cache} python bench/h200/attention_kernels.py "
                         f"{' '.join(sys.argv[1:])}",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
              "device": dev, "python": platform.python_version(), "tinygrad": version("tinygrad"),
              "shape": {"kv_heads": kv_heads, "group": group, "head_dim": head_dim, "positions": positions,
                        "depth": depth, "layers": layers, "reps": reps, "cache": cache}, "forms": {}}
    for form in forms:
        split = Split.parse(form)

        @TinyJit
        def step(q, x, p):
            outs = []
            for cache in caches:          # as decode does: this token's key and value stored, then read
                written = Tensor(cache.uop.after(cache[:, :, :, p:p + 1, :].uop.store(x.uop)))
                outs.append(decode_kernels(q, written[0, :, :, 0:p + 1, :], split.chunk, split.wide, split.unrolled,
                                           split.lanes, split.burst))
            return Tensor.stack(*outs).realize()
        for _ in range(3):                # capture the graph
            got = step(q, x, pos.bind(depth))
        Device[dev].synchronize()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step(q, x, pos.bind(depth))
            Device[dev].synchronize()
            samples.append((time.perf_counter() - t0) * 1e6 / layers)
        kv = caches[0].float()             # the first layer against tinygrad's attention, this step's row stored
        want = q.float().scaled_dot_product_attention(kv[0, :, :, :depth + 1], kv[1, :, :, :depth + 1],
                                                      enable_gqa=True)
        error = (got[0].float() - want).abs().max().item()
        record["forms"][form] = {"us_per_layer_median": round(statistics.median(samples), 2),
                                 "us_per_layer_samples": [round(s, 2) for s in samples], "max_abs_error": error}
        print(form, record["forms"][form]["us_per_layer_median"], "µs a layer; max error", error, flush=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:9]))
