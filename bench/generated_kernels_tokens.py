"""The tiny test model's greedy tokens with the kernels generated at tinygrad's UOp level that need thread
groups (split attention `CHUNK:kernel`, fusion `rms`) against tinygrad's own route, on tinygrad's PYTHON
device (it runs thread groups, local memory and barriers; this machine's CPU device has none). Slow:
every kernel of the model is emulated in Python (~5 minutes a route).

    boltbeam synth /tmp/tiny.gguf --arch qwen3 --preset tiny --mix q4_k_m      # the tests' model
    DEV=PYTHON python bench/generated_kernels_tokens.py /tmp/tiny.gguf bench/records/generated_kernels_tokens.json
    DEV=PYTHON python bench/generated_kernels_tokens.py /tmp/tiny.gguf bench/records/generated_kernels_tokens_wide.json wide
"""
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version

from tinygrad import Context
from tinygrad.llm.model import Transformer

from boltbeam.read.census import take_census
from boltbeam.route import attention, fusion

PROMPT, TOKENS, CONTEXT, CHUNK = [1, 2, 3], 3, 64, 16


def tokens(path: str, generated: bool, wide: bool = False) -> tuple[list[int], float, list[dict]]:
    t0 = time.perf_counter()
    census = take_census(path)
    net, _ = Transformer.from_gguf(path, CONTEXT)
    prepared = []
    if generated:
        prepared = [attention.install(net, census, path, attention.Split(CHUNK, kernel=True, wide=wide)),
                    fusion.install(net, census, path, fusion.Fusion(rms=1))]
    gen = net.generate(list(PROMPT))
    with Context(JIT=2):            # the prefill's kernels one by one, as the profile runs it
        out = [next(gen)]
    out += [next(gen) for _ in range(TOKENS - 1)]
    return out, time.perf_counter() - t0, [p.summary() for p in prepared]


def main(model: str, out: str, *form: str) -> None:
    wide = form == ("wide",)
    plain, plain_s, _ = tokens(model, False)
    generated, generated_s, families = tokens(model, True, wide)
    record = {"command": f"DEV={os.environ.get('DEV', '')} python bench/generated_kernels_tokens.py {model} {out}"
                         f"{' wide' if wide else ''}",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
              "python": platform.python_version(), "tinygrad": version("tinygrad"), "prompt": PROMPT,
              "context": CONTEXT, "tinygrad_tokens": plain, "generated_tokens": generated,
              "families": families, "seconds": {"tinygrad": round(plain_s, 1), "generated": round(generated_s, 1)},
              "same": plain == generated}
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:4])
