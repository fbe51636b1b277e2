"""A long hostile-input campaign: mutated GGUF files through `inspect` and `bound`, mutated traces
and importer inputs through every command that reads them, and the ledger under concurrent
writers and SIGKILLs. Every case must end in exit 0, 2 or 3 with at most one line on stderr.

  python bench/fuzz_campaign.py gguf   --cases 100000 --out bench/records/fuzz_gguf.json
  python bench/fuzz_campaign.py inputs --cases 100000 --out bench/records/fuzz_inputs.json
  python bench/fuzz_campaign.py ledger --out bench/records/fuzz_ledger.json

Seeded (--seed): the same command finds the same cases. Peak memory is this process's maximum
resident set (every case runs in process, as the CLI's own `main`).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import io
import json
import os
import platform
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from boltbeam.cli import main  # noqa: E402

LIMIT_BYTES = 4 << 30   # address space for the campaign process


def run_case(argv: list[str]) -> tuple[str, float]:
    """(outcome class, seconds): 'exit N' with the message's first words, or the exception's type."""
    err = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as e:   # the contract is broken: record where
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return f"TRACEBACK {type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}", time.perf_counter() - t0
    took = time.perf_counter() - t0
    text = err.getvalue()
    if code not in (0, 2, 3) or (code and text.count("\n") != 1):
        return f"CONTRACT exit {code}, {text.count(chr(10))} stderr lines", took
    if code == 0:
        return "exit 0", took
    words = text.split(":", 3)[-1].strip().split()
    return f"exit {code}: {' '.join(w for w in words[:4] if not w.startswith('/'))}", took


def mutate_gguf(rng: random.Random, valid: bytes) -> bytes:
    blob = bytearray(valid)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(blob))
        if rng.random() < 0.3:   # a whole little-endian u64 (lengths, counts, offsets, dims)
            value = rng.choice([0, 1, 2 ** 32, 2 ** 63, 2 ** 64 - 1, rng.getrandbits(64)])
            blob[pos:pos + 8] = value.to_bytes(8, "little")[:len(blob) - pos]
        else:
            blob[pos] = rng.randrange(256)
    if rng.random() < 0.2:
        blob = blob[:rng.randrange(len(blob))]
    return bytes(blob)


def campaign_gguf(args, tmp: Path) -> dict:
    from test_fuzz import VALID
    rng = random.Random(args.seed)
    path = tmp / "m.gguf"
    outcomes, slowest = collections.Counter(), (0.0, None)
    for case in range(args.cases):
        path.write_bytes(mutate_gguf(rng, VALID))
        for argv in (["inspect", str(path), "--json"], ["bound", str(path), "--target", "h200", "--json"]):
            outcome, took = run_case(argv)
            outcomes[outcome] += 1
            if took > slowest[0]:
                slowest = (took, f"case {case}: {argv[0]}")
    return {"cases": args.cases, "runs": sum(outcomes.values()), "outcomes": dict(outcomes.most_common()),
            "slowest_s": slowest[0], "slowest": slowest[1]}


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 2 and r < 0.15:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and r < 0.25:
        return {str(rng.randint(0, 9)): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice([None, True, False, 0, -1, 1, 2 ** 70, -(2 ** 70), 1e308, 0.5, "", "x", "token 1",
                       "kernel", "X", [], {}, "gpu_op", -0.0])


def campaign_inputs(args, tmp: Path) -> dict:
    from test_fuzz import IMPORTS, fixture_doc, paths
    from test_trace import good
    from boltbeam.synth.writer import shape_from, write
    rng = random.Random(args.seed)
    model = tmp / "tiny.gguf"
    write(model, "qwen3", shape_from("tiny"), "q4_k_m")
    docs = {"trace": good(), **{kind: fixture_doc(name) for kind, (name, _) in IMPORTS.items()}}
    csv_rows = (ROOT / "tests" / "data" / "import_nsys_2024.csv").read_text().splitlines()
    src, out = tmp / "in.json", tmp / "out.json"
    outcomes, slowest, left_behind = collections.Counter(), (0.0, None), 0
    for case in range(args.cases):
        kind = rng.choice([*docs, "nsys"])
        if kind == "nsys":
            rows = list(csv_rows)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(rows))
                cells = rows[i].split(",")
                cells[rng.randrange(len(cells))] = str(random_value(rng))
                rows[i] = ",".join(cells)
            if rng.random() < 0.1:
                rows = rows[1:]   # no header
            src.write_text("\n".join(rows) + "\n")
            argvs = [["import", "nsys", str(src), "--tokens", str(rng.randint(1, 3)), "--out", str(out)]]
        else:
            doc = json.loads(json.dumps(docs[kind]))
            where_all = [p for p in paths(doc) if p]
            for _ in range(rng.randint(1, 3)):
                where = rng.choice(where_all)
                node = doc
                with contextlib.suppress(KeyError, IndexError, TypeError):
                    for k in where[:-1]:
                        node = node[k]
                    node[where[-1]] = random_value(rng)
            src.write_text(json.dumps(doc))
            if kind == "trace":
                argvs = [["compare", str(src), str(src)], ["judge", "--baseline", str(src), "--candidate", str(src)],
                         ["export-trace", str(src), "--chrome", str(out)],
                         ["account", str(src), "--model", str(model), "--target", "h200", "--no-hash-check"]]
            else:
                argvs = [["import", kind, str(src), *IMPORTS[kind][1], "--out", str(out)]]
        for argv in argvs:
            outcome, took = run_case(argv)
            outcomes[f"{argv[0]} {outcome}"] += 1
            if outcome != "exit 0" and out.exists():
                left_behind += 1
            out.unlink(missing_ok=True)
            if took > slowest[0]:
                slowest = (took, f"case {case}: {argv[0]} {kind}")
    return {"cases": args.cases, "runs": sum(outcomes.values()), "outcomes": dict(outcomes.most_common()),
            "outputs_left_behind_on_failure": left_behind, "slowest_s": slowest[0], "slowest": slowest[1]}


def campaign_ledger(args, tmp: Path) -> dict:
    from boltbeam.ledger.store import Ledger
    writer = ROOT / "tests" / "ledger_writer.py"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    path = tmp / "l.db"
    spawn = lambda n, actor: subprocess.Popen([sys.executable, str(writer), str(path), str(n), actor],
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    procs = {a: spawn(args.appends, a) for a in "abcd"}
    printed = {a: [int(x) for x in p.communicate(timeout=600)[0].split()] for a, p in procs.items()}
    kills, committed_lost = 0, 0
    for round_ in range(args.kills):
        p = spawn(10_000, f"k{round_}")
        seen = []
        while len(seen) < 20 + round_:
            line = p.stdout.readline()
            if not line:
                break
            seen.append(int(line))
        os.kill(p.pid, signal.SIGKILL)
        seen += [int(x) for x in p.communicate()[0].split()]
        kills += 1
        with Ledger(path, create=False) as ledger:
            stored = {e.id for e in ledger.entries()}
        committed_lost += sum(1 for i in seen if i not in stored)
    with Ledger(path, create=False) as ledger:
        ok, total = ledger.verify().ok, len(ledger.entries())
    return {"writers": 4, "appends_each": args.appends,
            "concurrent_ids_unique_and_complete": sorted(i for ids in printed.values() for i in ids)
            == list(range(1, 4 * args.appends + 1)),
            "sigkills": kills, "committed_entries_lost": committed_lost, "entries": total, "chain_verifies": ok}


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("campaign", choices=["gguf", "inputs", "ledger"])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--appends", type=int, default=500)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    # A case that tries to allocate gigabytes becomes a recorded MemoryError, not a process the
    # kernel kills (the first campaign died that way: a block count of 2^31 made a 2^31-element set).
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="boltbeam-fuzz-") as tmp:
        result = {"gguf": campaign_gguf, "inputs": campaign_inputs, "ledger": campaign_ledger}[args.campaign](args, Path(tmp))
    record = {"command": " ".join(["bench/fuzz_campaign.py", *sys.argv[1:]]),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
              "versions": {p: version(p) for p in ("boltbeam", "gguf", "numpy")},
              "wall_s": time.perf_counter() - t0, "address_space_limit_bytes": LIMIT_BYTES,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **result}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "outcomes"}, indent=1))


if __name__ == "__main__":
    main_()
