"""Hostile input, round three (issue 35): a seeded campaign over the surfaces the round fixed. Every case must
end in exit 0, 2 or 3 with one line on stderr when it is not 0, leave no input changed, write nothing when
it fails, and (judge) never promote across devices, engines, models or depths.

  python bench/hostile3_campaign.py --cases 20000 --out bench/records/hostile3.json

Surfaces: outputs that name an input (every spelling: relative, ./x/.., a hard link); number strings in
every hand-parsed and typed flag (other scripts' digits, superscripts, '1_0', thousands of digits, nan,
1e999); target files with out-of-range numbers; route files (unknown keys, missing hash, other device,
out-of-range values); JSON inputs that swell when parsed, plain and gzipped; judge with traces that differ in
device, engine, model or depth; --context past the model's length; scheduler addresses (empty, a silent
listener, an HTTP reply, garbage). Seeded (--seed): the same command finds the same cases. Peak memory is
this process's maximum resident set (every case runs in process, as the CLI's own `main`).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import platform
import random
import resource
import socket
import sys
import tempfile
import threading
import time
import traceback
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_campaign import LIMIT_BYTES  # noqa: E402

from boltbeam.cli import main  # noqa: E402

from test_hostile3 import route_doc, choice, trace_doc  # noqa: E402

DIGITS = ["0", "1", "7", "9", "²", "①", "١", "٣", "߁", "𝟙", "_", ".", "e", "-", "+", " ", "x"]
WORDS = ["nan", "inf", "-inf", "Infinity", "1e999", "1e-999", "0x10", "1_000", "", " ", "9" * 30, "9" * 5000,
         "٣٢", "³²", "①②", "32", "16", "0", "-1", str(10 ** 18), str(10 ** 19)]


def run_case(argv: list[str]) -> tuple[str, float]:
    """(outcome class, seconds), as fuzz_campaign's run_case, where argparse's own refusal (SystemExit 2 and
    one line) is a refusal too."""
    err = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
    except BaseException as e:   # the contract is broken: record where
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return f"TRACEBACK {type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}", time.perf_counter() - t0
    took, text = time.perf_counter() - t0, err.getvalue()
    if code not in (0, 2, 3) or (code and text.count("\n") != 1):
        return f"CONTRACT exit {code}, {text.count(chr(10))} stderr lines", took
    if code == 0:
        return "exit 0", took
    words = text.split(":", 3)[-1].strip().split()
    return f"exit {code}: {' '.join(w for w in words[:4] if not w.startswith('/'))}", took


def number_text(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice(WORDS)
    return "".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 12)))


def big_number(rng: random.Random):
    return rng.choice([10 ** 309, -(10 ** 309), 2 ** 63, 2 ** 64, 10 ** 400, 1e308, -1e308, 0, -1, 1, 0.5,
                       True, None, "1", [], {}, 10 ** rng.randint(0, 30)])


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


class Surfaces:
    """Each surface: a function (rng) -> (argv list, expectation) run in a scratch folder of inputs."""

    def __init__(self, tmp: Path, model: Path):
        self.tmp, self.model = tmp, model
        self.sha = hashlib.sha256(model.read_bytes()).hexdigest()
        self.inputs = tmp / "in"
        self.inputs.mkdir()
        (self.inputs / "m.gguf").write_bytes(model.read_bytes())
        (self.inputs / "t.json").write_text(json.dumps(trace_doc()))
        (self.inputs / "b.json").write_text(json.dumps([{"n_prompt": 0, "n_gen": 8, "avg_ts": 100.0}]))
        with contextlib.redirect_stdout(io.StringIO()):
            main(["ledger", "add", "--ledger", str(self.inputs / "L"), "--candidate", "c", "--verdict", "diagnostic",
                  "--reason", "r"])
        os.link(self.inputs / "L", self.inputs / "L.hard")
        self.out = tmp / "out"

    def spelling(self, rng: random.Random, name: str) -> str:
        """One of the ways to name the input `name`."""
        hard = {"L": "L.hard"}.get(name)
        return rng.choice([str(self.inputs / name), f"{self.inputs}/./{name}",
                           f"{self.inputs}/../{self.inputs.name}/{name}", *([str(self.inputs / hard)] if hard else [])])

    def self_write(self, rng: random.Random):
        m, t, b, lg = (self.spelling(rng, n) for n in ("m.gguf", "t.json", "b.json", "L"))
        i = self.inputs
        argv = rng.choice([
            ["ledger", "export", "--ledger", str(i / "L"), "--out", lg],
            ["report", str(i / "t.json"), "--model", str(i / "m.gguf"), "--target", "h200", "--out", t],
            ["export-trace", str(i / "t.json"), "--chrome", t],
            ["import", "llama-bench", str(i / "b.json"), "--out", b],
            ["profile", str(i / "m.gguf"), "--device", "CPU", "--out", m],
            ["profile", str(i / "m.gguf"), "--device", "CPU", "--out", str(self.out / "x.json"), "--host-profile", m],
            ["audit", str(i / "m.gguf"), "--trace", str(i / "t.json"), "--target", "h200", "--out", str(i),
             "--compare", str(i / "t.json"), "--ledger", self.spelling(rng, "audit.json")],
            ["search", str(i / "m.gguf"), "--device", "CPU", "--target", "h200", "--ledger", str(self.out / "L"),
             "--out", str(i), "--baseline", str(i / "t.json"), "--on", str(i / "route.json")],
        ])
        if argv[0] == "audit":
            (i / "audit.json").write_text("{}")
        if argv[0] == "search":
            (i / "route.json").write_text("{}")
        return argv, "refused"

    def numbers(self, rng: random.Random):
        flag = rng.choice(["--split-attention", "--gemv", "--context", "--tokens", "--warmup", "--beam"])
        value = number_text(rng)
        if flag == "--split-attention" and rng.random() < 0.5:
            value += rng.choice([":kernel", ":staged", ":kernel:wide"])
        if flag == "--gemv" and rng.random() < 0.7:
            value = ":".join(number_text(rng) for _ in range(rng.randint(3, 7)))
        extra = ["--layout", "float16:kernel"] if flag == "--gemv" else []
        other = rng.choice([[], ["--tokens", "0"]])   # a value that parses still ends before loading
        return ["profile", str(self.model), "--device", "CPU", *extra, flag, value, *other, "--warmup", "2",
                "--out", str(self.out / "t.json")], "refused"

    def typed_numbers(self, rng: random.Random):
        t = str(self.inputs / "t.json")
        return rng.choice([
            ["bound", str(self.model), "--target", "h200", "--context", number_text(rng), "--json"],
            ["bound", str(self.model), "--target", "h200", "--batch", number_text(rng), "--json"],
            ["account", t, "--model", str(self.model), "--target", "h200", "--no-hash-check", "--price-per-hour",
             number_text(rng)],
            ["judge", "--baseline", t, "--candidate", t, "--floor-us", number_text(rng)],
        ]), "any"

    def target_file(self, rng: random.Random):
        value = rng.choice([str(10 ** 309), "9" * rng.randint(300, 5000), "1e999", "-1e999", "nan", "inf", "1e300",
                            "0", "-5", "4.8e12", str(2 ** 64), '"fast"', "true", "[1]"])
        unit = rng.choice(["B/s", "GB/s", "TB/s", "count", "furlongs"])
        path = self.tmp / "t.toml"
        path.write_text(f'[t]\nmemory_bandwidth = {{value = {value}, unit = "{unit}", status = "spec", '
                        f'source = "x", date = "x"}}\n')
        return ["bound", str(self.model), "--target", "t", "--targets", str(path), "--json"], "any"

    def route_file(self, rng: random.Random):
        doc = route_doc(model_sha256=rng.choice([self.sha, self.sha, None, "1" * 64]),
                        device=rng.choice(["CPU", "CPU", "CUDA", "cpu", "CPU:0", "METAL"]),
                        choices=[choice(**{rng.choice(["axis", "arg"]): big_number(rng)})
                                 for _ in range(rng.randint(0, 2))])
        for _ in range(rng.randint(0, 3)):
            key = rng.choice(["constant_once", "constants_once", "beam", "split_attention", "gemv", "fusion",
                              "direct_replay", "layout", "choices", "device", "engine", "direct_replays", "gemvs"])
            doc[key] = rng.choice([big_number(rng), {"chunk": big_number(rng), "staged": False},
                                   {"norm": big_number(rng), "gated": 0, "rms": 0}])
        path = self.tmp / "r.json"
        path.write_text(json.dumps(doc))
        # A route that passes ends at --gemv's refusal, before the model loads.
        return ["profile", str(self.model), "--device", "CPU", "--route", str(path), "--gemv", "①:1:1:1",
                "--out", str(self.out / "t.json")], "refused"

    def swollen_json(self, rng: random.Random):
        n = rng.choice([10, 1000, 100_000, 1_000_000, 3_000_000, 20_000_000 if rng.random() < 0.2 else 6_000_000])
        body = rng.choice([b"[]", b"{}", b"0", b'""'])
        doc = b"[" + (body + b",") * (n - 1) + body + b"]"
        path = self.tmp / "big.json"
        path.write_bytes(gzip.compress(doc, compresslevel=1) if rng.random() < 0.5 else doc)
        return ["export-trace", str(path), "--chrome", str(self.out / "c.json")], "refused"

    def judge_pair(self, rng: random.Random):
        key, a, b = rng.choice([("device", "CPU", "CUDA"), ("engine", "tinygrad", "llama.cpp"),
                                ("model_sha256", "ab" * 32, "cd" * 32), ("context", 4, 512)])
        paths = []
        for side, value, median in (("a", a, 1000.0), ("b", b, 500.0)):
            doc = trace_doc(model_sha256="ab" * 32)
            if key == "context":
                doc["workload"]["context"] = value
            else:
                doc["environment"][key] = value
            doc["route"] = {"label": side, "switch": "X=0"}
            doc["token_wall_us"] = [rng.gauss(median, 1.0) for _ in range(12)]
            doc["kernels"], doc["kernel_pass_wall_us"] = [], []
            paths.append(self.tmp / f"{side}.json")
            paths[-1].write_text(json.dumps(doc))
        return ["judge", "--baseline", str(paths[0]), "--candidate", str(paths[1]), "--expect", "promote"], "refused"

    def context(self, rng: random.Random):
        c = str(rng.choice([10 ** rng.randint(4, 18), 4090, 5000, -1]))   # past the tiny model's 4,096 (with tokens)
        argv = rng.choice([
            ["bound", str(self.model), "--target", "h200", "--context", c],
            ["profile", str(self.model), "--device", "CPU", "--context", c, "--out", str(self.out / "t.json")],
            ["audit", str(self.model), "--device", "CPU", "--target", "h200", "--context", c, "--out", str(self.out)],
            ["search", str(self.model), "--device", "CPU", "--target", "h200", "--context", c, "--ledger",
             str(self.out / "L"), "--out", str(self.out)],
        ])
        return argv, "any" if c == "4090" and argv[0] == "bound" else "refused"

    def scheduler(self, rng: random.Random):
        address = rng.choice(["", " ", "tcp://", "tcp://127.0.0.1:1", "127.0.0.1:1", "ws://127.0.0.1:1", "x" * 300,
                              "tcp://[::1", "tcp://127.0.0.1:99999", "tls://127.0.0.1:1", "①:8786",
                              f"tcp://{self.silent}", f"tcp://{self.http}", f"ws://{self.http}", f"tcp://{self.huge}"])
        return ["search", str(self.model), "--device", "CPU", "--target", "h200", "--scheduler", address,
                "--ledger", str(self.out / "L"), "--out", str(self.out)], "refused"


def listener(reply: bytes, stop: threading.Event) -> str:
    """A local listener that says `reply` (or nothing) to each connection, until `stop`."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    held = []

    def serve():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                held.append(conn)
                if reply:
                    conn.sendall(reply)
        for c in held:
            c.close()
        server.close()
    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}"


def campaign(args, tmp: Path) -> dict:
    from boltbeam.search import fanout
    from boltbeam.synth.writer import shape_from, write
    fanout.CONNECT_SECONDS = 1          # the bound the contract holds it to is 30 s; a campaign need not wait it out
    model = tmp / "tiny.gguf"
    write(model, "qwen3", shape_from("tiny"), "q4_k_m")
    s = Surfaces(tmp, model)
    stop = threading.Event()
    s.silent, s.http = listener(b"", stop), listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", stop)
    s.huge = listener(b"\xff" * 64, stop)
    surfaces = {name: getattr(s, name) for name in ("self_write", "numbers", "typed_numbers", "target_file",
                                                    "route_file", "swollen_json", "judge_pair", "context",
                                                    "scheduler")}
    rng = random.Random(args.seed)
    outcomes, per_surface, breaks = collections.Counter(), collections.Counter(), collections.Counter()
    slowest = (0.0, None)
    for case in range(args.cases):
        name = rng.choice(list(surfaces))
        argv, expect = surfaces[name](rng)
        inputs_before = digest(s.inputs)
        outcome, took = run_case(argv)
        per_surface[name] += 1
        outcomes[f"{name} {outcome}"] += 1
        if outcome.startswith(("TRACEBACK", "CONTRACT")):
            breaks[f"{name}: {outcome}"] += 1
        elif expect != "any" and outcome == "exit 0":
            breaks[f"{name}: exit 0 where a refusal was due"] += 1
        if outcome != "exit 0" and s.out.exists() and any(s.out.rglob("*")):
            breaks[f"{name}: wrote outputs and failed"] += 1
        if digest(s.inputs) != inputs_before:
            breaks[f"{name}: an input changed ({' '.join(argv[:2])})"] += 1
        for extra in ("audit.json", "route.json"):
            (s.inputs / extra).unlink(missing_ok=True)
        if s.out.exists():
            for p in sorted(s.out.rglob("*"), reverse=True):
                p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
            s.out.rmdir()
        if took > slowest[0]:
            slowest = (took, f"case {case}: {name}: {' '.join(a[:40] for a in argv[:8])}")
    stop.set()
    return {"cases": args.cases, "cases_per_surface": dict(per_surface.most_common()),
            "tracebacks": sum(v for k, v in breaks.items() if "TRACEBACK" in k),
            "contract_breaks": sum(breaks.values()), "breaks": dict(breaks.most_common()),
            "outcomes": dict(outcomes.most_common()), "slowest_s": slowest[0], "slowest": slowest[1]}


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))   # a swollen case is a MemoryError, recorded
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="boltbeam-hostile3-") as tmp:
        result = campaign(args, Path(tmp))
    record = {"command": " ".join(["bench/hostile3_campaign.py", *sys.argv[1:]]),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
              "versions": {p: version(p) for p in ("boltbeam", "tinygrad", "distributed", "numpy")},
              "wall_s": time.perf_counter() - t0, "address_space_limit_bytes": LIMIT_BYTES,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **result}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "outcomes"}, indent=1))


if __name__ == "__main__":
    main_()
