"""tinygrad's greedy tokens against llama.cpp's recorded ones (tests/data/reference_tokens.json), for each text
prompt of each file given: tinygrad.llm's Transformer as it loads the file ("tinygrad.llm") and as BoltBeam's
adapter fits it to the file's formula ("fitted", boltbeam/measure/architectures.py), and with `--family` the
adapter with those route families built on it ("routed").

    DEV=CPU .venv/bin/python bench/reference_check.py --out bench/records/reference_check_cpu.json MODEL.gguf ...
    DEV=CUDA python bench/reference_check.py --reference ref_h200.json --family layout=float16:kernel:stacked \
        --family constants_once=1 --out check_h200.json MODEL.gguf
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import pathlib
import platform
import sys
import time

BOOLEAN = ("constants_once", "direct_replay")
REFERENCE = pathlib.Path(__file__).parent.parent / "tests" / "data" / "reference_tokens.json"


def greedy(path: str, prompt: list[int], tokens: int, engine: str, flags: dict) -> list[int]:
    """Greedy tokens of tinygrad.llm's Transformer as it loads the file, of BoltBeam's adapter ("fitted"), or of
    the adapter with the route families the flags name built on it ("routed", boltbeam.route.use.load)."""
    from tinygrad import Context
    from tinygrad.llm.model import Transformer

    from boltbeam.measure.architectures import load
    from boltbeam.read.census import take_census
    from boltbeam.route import use
    positions = len(prompt) + tokens + 1
    with contextlib.ExitStack() as inside:
        if engine == "routed":
            net = inside.enter_context(use.load(path, None, use.Flags(**flags), positions=positions,
                                                   tokenizer=(None, []))).net    # prompt ids given: no tokenizer
        elif engine == "fitted":
            net = load(path, positions, take_census(path))
        else:
            net = Transformer.from_gguf(path, positions)[0]
        gen = net.generate(list(prompt))
        with Context(JIT=2):       # as profile runs a prefill
            out = [next(gen)]
        return out + [next(gen) for _ in range(tokens - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reference", default=str(REFERENCE), help="llama.cpp's tokens (bench/reference_tokens.py)")
    ap.add_argument("--family", action="append", default=[], metavar="FIELD=VALUE",
                    help="a route family for a third, routed engine (boltbeam.route.use.Flags' fields, e.g. "
                         "layout=float16:kernel:stacked, constants_once=1)")
    args = ap.parse_args()
    from tinygrad import Device

    from boltbeam.errors import BadInput, Refused
    from boltbeam.files import sha256_file
    flags = {k: (v if k not in BOOLEAN else v not in ("0", "")) for k, v in (f.split("=", 1) for f in args.family)}
    reference = json.loads(pathlib.Path(args.reference).read_text())
    rows = []
    for path in args.models:
        name, sha = pathlib.Path(path).name, sha256_file(path)
        for run in (r for r in reference["runs"] if (r["file"], r["sha256"]) == (name, sha)
                    and r["prompt_kind"].startswith("text ")):
            want = run["flash"]["tokens"]
            for engine in ("tinygrad.llm", "fitted", *(["routed"] if flags else [])):
                t0 = time.perf_counter()
                row = {"file": name, "prompt_kind": run["prompt_kind"], "prompt_ids": len(run["prompt"]),
                       "engine": engine, **({"families": flags} if engine == "routed" else {}), "llama_cpp": want}
                try:
                    got = greedy(path, run["prompt"], len(want), engine, flags)
                    row |= {"tokens": got,
                            "equal_to": next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))}
                except (BadInput, Refused) as e:      # a family the model cannot take: its one line
                    row |= {"refused": str(e)}
                rows.append(row | {"seconds": round(time.perf_counter() - t0, 1)})
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
