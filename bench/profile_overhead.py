"""Does `boltbeam profile` change the token it reports? Decode the same prompt with plain tinygrad
(no BoltBeam hook installed) and record the same whole-token walls, then compare with a trace.

  python bench/profile_overhead.py plain MODEL --device CUDA --context 512 --tokens 10 --out plain.json
  python bench/profile_overhead.py compare plain.json TRACE.json
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from importlib.metadata import version


def plain(args) -> None:
    os.environ["DEV"] = args.device
    from tinygrad import Context
    from tinygrad.llm.model import Transformer

    from boltbeam.measure.tinygrad_run import prompt_tokens
    from boltbeam.read.census import take_census
    vocab = take_census(args.model).facts.vocabulary
    prompt = prompt_tokens(args.context, vocab)
    net, _ = Transformer.from_gguf(pathlib.Path(args.model), max(len(prompt) + 2 * (args.warmup + args.tokens) + 2, 4096))
    gen = net.generate(list(prompt))
    with Context(JIT=2):   # the prefill as boltbeam profile runs it (see tinygrad_run.py)
        next(gen)
    for _ in range(args.warmup - 1):
        next(gen)
    walls = []
    for _ in range(args.tokens):
        t0 = time.perf_counter()
        next(gen)
        walls.append((time.perf_counter() - t0) * 1e6)
    record = {"command": " ".join(sys.argv), "machine": platform.node(), "platform": platform.platform(),
              "date": time.strftime("%Y-%m-%d"), "tinygrad": version("tinygrad"), "device": args.device,
              "context": len(prompt), "warmup": args.warmup, "token_wall_us": walls}
    pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"median_token_wall_us": statistics.median(walls)}))


def compare(args) -> None:
    base = json.loads(pathlib.Path(args.plain).read_text())
    trace = json.loads(pathlib.Path(args.trace).read_text())
    a, b = statistics.median(base["token_wall_us"]), statistics.median(trace["token_wall_us"])
    print(json.dumps({"plain_median_us": a, "profiled_median_us": b, "added_fraction": (b - a) / a,
                      "goal": "profile adds no more than 5% to the whole-token time it reports"}, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("plain")
    q.add_argument("model")
    q.add_argument("--device", default="CUDA")
    q.add_argument("--context", type=int, default=512)
    q.add_argument("--tokens", type=int, default=10)
    q.add_argument("--warmup", type=int, default=3)
    q.add_argument("--out", required=True)
    q.set_defaults(func=plain)
    q = sub.add_parser("compare")
    q.add_argument("plain")
    q.add_argument("trace")
    q.set_defaults(func=compare)
    args = p.parse_args()
    args.func(args)
