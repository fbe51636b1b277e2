"""The prefill's chunks timed one by one, with the repacked layout's products as tinygrad fuses them today (the
weights unpacked inside each chunk's matmul) or unpacked once a chunk into a buffer first (`materialized`): on an
H100 a profile at depth 4,096 spent ~84 s of a busy GPU in the prefill (128 chunks of 32, bench/h200/s17/), and
the fused form may unpack every weight once per prompt token. Not a route family: a yardstick of where the time is.

  DEV=CUDA python3 bench/h200/prefill.py MODEL ROUTE TOKENS fused|materialized OUT.json
"""
import json
import os
import sys
import time

model, route, n, variant, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ.setdefault("DEV", "CUDA")
from tinygrad import Device  # noqa: E402

from boltbeam.measure.tinygrad_run import prompt_tokens, start_decode  # noqa: E402
from boltbeam.read.census import take_census  # noqa: E402
from boltbeam.route import layout, use  # noqa: E402

if variant == "materialized":      # the chunk's products on weights unpacked into a buffer first
    fused = layout.Planes.gemv

    def gemv(self, x, form, norm=None):
        if form == "kernel" and not all(isinstance(d, int) for d in x.shape):
            return (norm(x) if norm is not None else x).matmul(self.weights().contiguous().T)
        return fused(self, x, form, norm)
    layout.Planes.gemv = gemv
elif variant != "fused":
    sys.exit(f"variant: fused or materialized, not {variant}")

ids = list(prompt_tokens(n, take_census(model).facts.vocabulary))
marks = []
with use.load(model, route, positions=n + 16, tokenizer=(None, [])) as routed:
    call = type(routed.net).__call__

    def timed(self, *args, **kwargs):     # each chunk realized and waited for, its end marked
        result = call(self, *args, **kwargs).realize()
        Device[Device.DEFAULT].synchronize()
        marks.append(time.perf_counter())
        return result
    type(routed.net).__call__ = timed
    started = time.perf_counter()
    gen, first = start_decode(routed.net, ids)
    tokens = [first] + [next(gen) for _ in range(3)]
chunks = [b - a for a, b in zip([started, *marks], marks)]
json.dump({"model": model, "route": route, "prompt_tokens": n, "variant": variant, "device": Device.DEFAULT,
           "chunk_seconds": chunks, "later_chunks_median_s": sorted(chunks[1:-4])[len(chunks[1:-4]) // 2]
           if len(chunks) > 5 else None, "tokens": tokens}, open(out, "w"), indent=1)
print(variant, n, "first chunk", round(chunks[0], 2), "s; later chunks, median",
      json.load(open(out))["later_chunks_median_s"], "s; tokens", tokens)
