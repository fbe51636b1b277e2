"""How long `account` and `compare` take on a trace the size of an 8B model's: 700 kernels x 20 tokens.

    python bench/account_speed.py                      # writes the "small" preset model to a temp dir
    python bench/account_speed.py --model 8b.gguf      # an existing file, e.g. `boltbeam synth --preset 8b`

Times the pure functions and the CLI commands end to end (trace load, census, bound, print), the
median of --runs runs each (time.perf_counter), and prints one JSON record with the raw samples.
Target: under 1 second each.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

from boltbeam import __version__
from boltbeam.account import account, compare
from boltbeam.bound.roofline import Bound, bound
from boltbeam.bound.targets import get_target
from boltbeam.cli import main
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload, save
from boltbeam.read.census import take_census
from boltbeam.read.roles import read_kind
from boltbeam.synth.writer import shape_from, write

KERNELS_PER_TOKEN = 700
TOKENS = 20
FILLER = ("attention", "kv_write", "rope", "copy", "elementwise", "other")


def synthetic_trace(b: Bound, census, seed: int) -> Trace:
    """One kernel per weight table (starved launches, 30-60x its floor), filler kernels that read no
    weights up to 700 a token, 1 µs apart on the device timeline; host and graph lines on top."""
    rng = random.Random(seed)
    floors = {t.name: t for t in b.tensors}
    kernels, pass_walls, walls = [], [], []
    for tok in range(TOKENS):
        t = 0.0
        for i in range(KERNELS_PER_TOKEN):
            if i < len(census.tensors) and census.tensors[i].role not in (None, "token_embd"):
                tensor = census.tensors[i]
                line = floors[tensor.name]
                category = "norm" if read_kind(tensor.role) == "vector" else "weights"
                k = Kernel(tok, i, tensor.name, line.floor_us * rng.uniform(30, 60) + 2.0, start_us=t,
                           role=tensor.role, category=category, tensors=[tensor.name], bytes=line.bytes,
                           flops=line.flops, global_size=[32], local_size=[32])
            else:
                k = Kernel(tok, i, "filler", rng.uniform(2.0, 6.0), start_us=t, category=FILLER[i % len(FILLER)],
                           global_size=[64], local_size=[128])
            kernels.append(k)
            t += k.duration_us + 1.0
        pass_walls.append(t + rng.uniform(20, 40))
        walls.append(pass_walls[-1] - rng.uniform(300, 400))
    return Trace(Environment(engine="bench"), Workload(context=0, tokens=TOKENS, batch=1),
                 RouteRecord(f"bench seed {seed}"), token_wall_us=walls, provenance=Provenance("bench"),
                 kernel_pass_wall_us=pass_walls, kernels=kernels)


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def quiet_cli(*argv: str) -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(list(argv))   # the synthetic trace does not close exactly: exit 3 is expected and ignored


def run(model: str, preset: str, runs: int, workdir: Path) -> dict:
    target = get_target("h200")
    census = take_census(model)
    b = bound(census, target, context=0, batch=1)
    a, c = synthetic_trace(b, census, seed=1), synthetic_trace(b, census, seed=2)
    path_a, path_b = workdir / "a.json", workdir / "b.json"
    save(a, path_a)
    save(c, path_b)
    samples = {
        "account": timed(lambda: account(a, b, target), runs),
        "compare": timed(lambda: compare(a, c, b), runs),
        "cli account --json": timed(lambda: quiet_cli("account", str(path_a), "--model", model, "--target", "h200",
                                                      "--no-hash-check", "--json"), runs),
        "cli compare --json": timed(lambda: quiet_cli("compare", str(path_a), str(path_b), "--model", model,
                                                      "--target", "h200", "--json"), runs),
    }
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {"boltbeam": __version__, **{p: metadata.version(p) for p in ("gguf", "numpy", "rich", "scipy")}},
        "workload": {"model": model, "preset": preset, "kernels_per_token": KERNELS_PER_TOKEN, "tokens": TOKENS,
                     "target": "h200"},
        "unit": "s",
        "median_s": {name: statistics.median(s) for name, s in samples.items()},
        "samples_s": samples,
        "target_s": 1.0,
    }


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="an existing GGUF (e.g. the 8b preset); default: write the small preset")
    p.add_argument("--preset", default=None, help="the preset the --model file was made from, for the record")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, preset = args.model, args.preset
        if model is None:
            model, preset = str(Path(tmp) / "small.gguf"), "small"
            write(model, "qwen3", shape_from("small"), "q4_k_m")
        print(json.dumps(run(model, preset or "unknown", args.runs, Path(tmp)), indent=1))


if __name__ == "__main__":
    cli()
