"""tinygrad's greedy tokens against llama.cpp's recorded ones (tests/data/reference_tokens.json), for each text
prompt of each file given: tinygrad.llm's Transformer as it loads the file ("tinygrad.llm") and as BoltBeam's
adapter fits it to the file's formula ("fitted", boltbeam/measure/architectures.py).

    DEV=CPU .venv/bin/python bench/reference_check.py --out bench/records/reference_check_cpu.json MODEL.gguf ...
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import platform
import sys
import time

REFERENCE = pathlib.Path(__file__).parent.parent / "tests" / "data" / "reference_tokens.json"


def greedy(path: str, prompt: list[int], tokens: int, fitted: bool) -> list[int]:
    from tinygrad import Context
    from tinygrad.llm.model import Transformer

    from boltbeam.measure.architectures import load
    from boltbeam.read.census import take_census
    positions = len(prompt) + tokens + 1
    net = load(path, positions, take_census(path)) if fitted else Transformer.from_gguf(path, positions)[0]
    gen = net.generate(list(prompt))
    with Context(JIT=2):       # as profile runs a prefill
        out = [next(gen)]
    return out + [next(gen) for _ in range(tokens - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from tinygrad import Device

    from boltbeam.files import sha256_file
    reference = json.loads(REFERENCE.read_text())
    rows = []
    for path in args.models:
        name, sha = pathlib.Path(path).name, sha256_file(path)
        for run in (r for r in reference["runs"] if (r["file"], r["sha256"]) == (name, sha)
                    and r["prompt_kind"].startswith("text ")):
            want = run["flash"]["tokens"]
            for fitted in (False, True):
                t0 = time.perf_counter()
                got = greedy(path, run["prompt"], len(want), fitted)
                rows.append({"file": name, "prompt_kind": run["prompt_kind"], "prompt_ids": len(run["prompt"]),
                             "engine": "fitted" if fitted else "tinygrad.llm", "tokens": got, "llama_cpp": want,
                             "equal_to": next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want)),
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(json.dumps(rows[-1]), flush=True)
    from importlib.metadata import version
    doc = {"command": " ".join(["python", "bench/reference_check.py", *sys.argv[1:]]), "device": Device.DEFAULT,
           "machine": f"{platform.node()}: {platform.machine()}, {platform.system()} {platform.release()}",
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "tinygrad": version("tinygrad"),
           "reference": {k: reference[k] for k in ("binding", "device", "date")},
           "equal_to": "how many leading tokens equal llama.cpp's (flash path; its plain path gives the same on these texts)",
           "rows": rows}
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
