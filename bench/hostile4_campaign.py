"""Hostile input, round four (issue 35, item 4): a seeded campaign over the surfaces the issue names, round three's
(bench/hostile3_campaign.py, whose surfaces run here too) and those added since: route files through `profile --route`
and the Python entry point boltbeam.route.use.load, search summaries (audit --search, search-calibrate, search
--alone-from), tune's flags and files, judge with traces that disagree, gzip and swollen JSON, every parse string,
generate's prompts, text with line breaks, scheduler addresses; then, as real processes, a sample of those cases,
audits on a full disk, and two searches on one ledger with one of them killed.

  nice -n 19 python bench/hostile4_campaign.py --cases 100000 --processes 300 --kills 3 \
      --out bench/records/hostile4.json

The contract every case is held to: exit 0, 2 or 3; when not 0, one line on stderr and no traceback; no input
changed; nothing written when it fails; no case past 30 s; judge never promotes across devices, engines, models
or depths. In process (the CLI's own `main`, SystemExit caught), a case whose input is accepted stops where the
model would load (`architectures.load`, and the two timings that need no model, raise Reached): the campaign
holds the refusals to the contract, not the decode. Memory: this process's peak resident set (under a 4 GiB
address-space limit, where a swollen input is a MemoryError, a break), and tracemalloc's peak of every 25th case.
The real processes stub nothing. Seeded (--seed): the same command makes the same cases.
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
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import traceback
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_campaign import LIMIT_BYTES  # noqa: E402
from hostile3_campaign import Surfaces, big_number, listener, number_text  # noqa: E402
from test_hostile3 import choice, route_doc, trace_doc  # noqa: E402

from boltbeam.cli import main, one_line  # noqa: E402

SLOW_S = 30.0          # the contract's bound on a case (a scheduler that does not answer included)
TRACED_EVERY = 25      # tracemalloc's peak is taken on every 25th case (it slows a parse several times)
ARG_MAX = 128 * 1024   # Linux's limit on one argument (MAX_ARG_STRLEN): exec refuses a longer one (E2BIG)
SKIPPED = "skipped: argv no process can take (a NUL, or one argument of 128 KiB or more)"


class Reached(Exception):
    """Raised where the model would load: the input was accepted."""


def stop_at_the_run() -> None:
    """The in-process stubs: where an accepted case would load the model or time products, it stops."""
    from boltbeam.measure import architectures, tinygrad_run
    from boltbeam.search import alone, choose

    def reached(*a, **k):
        raise Reached
    architectures.load = reached
    alone.time_products = reached
    tinygrad_run.profile_elsewhere = choose.profile_elsewhere = reached    # the whole-token families' profiles


def run_case(call) -> tuple[str, float, str]:
    """(outcome class, seconds, stderr) of `call()` (argv for the CLI's main, or a function), stdout and stderr
    captured. Outcome classes: 'exit 0', 'accepted' (Reached), 'exit 2: words', 'TRACEBACK ...', 'CONTRACT ...'."""
    err = io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main(call) if isinstance(call, list) else call()
            except SystemExit as e:
                code = e.code
    except Reached:
        return "accepted", time.perf_counter() - t0, err.getvalue()
    except BaseException as e:   # the contract is broken: record where
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return (f"TRACEBACK {type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}",
                time.perf_counter() - t0, err.getvalue())
    took, text = time.perf_counter() - t0, err.getvalue()
    return outcome_of(code, text), took, text


def outcome_of(code, text: str) -> str:
    if "Traceback" in text:
        return f"TRACEBACK on stderr, exit {code}"
    if code not in (0, 2, 3) or (code and text.count("\n") != 1):
        return f"CONTRACT exit {code}, {text.count(chr(10))} stderr lines"
    if code == 0:
        return "exit 0"
    words = text.split(":", 3)[-1].strip().split()
    return f"exit {code}: {' '.join(w for w in words[:4] if not w.startswith('/'))}"


def spelled_model(path: Path) -> None:
    """The tiny model with a vocabulary tinygrad.llm's tokenizer reads (gpt2's byte-level pieces, then filler
    words): the synthetic writer's `<0x41>` pieces spell nothing, so every prompt would stop at the encoder."""
    from boltbeam.synth import writer
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    pieces = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in keep)}
    plain = writer._vocabulary
    writer._vocabulary = lambda n: iter([pieces[b] for b in range(256)] + [f"w{i}" for i in range(256, n)])
    try:
        writer.write(path, "qwen3", writer.shape_from("tiny"), "q4_k_m")
    finally:
        writer._vocabulary = plain


# --- what the generators draw from -------------------------------------------------------------------

BREAKS = ["\n", "\r", "\r\n", "\x00", "\x1b[2J", "\x0b", "\x85", "\u2028", "\t", "\x7f"]
ODD = ["", " ", "é", "日本", "\u200f", "\u0301", "🙂", "\udcff", "%s", "{}", "'", '"', "\\", "..", "/", "-", "--",
       "-h", "none", "NONE", "null"]
PARSE_PARTS = {
    "--layout": ["float16", "bfloat16", "float32", "int8", "kernel", "expanded", "stacked", "planes", "①", "16"],
    "--gemv": ["1", "2", "4", "8", "16", "32", "64", "256", "0", "-1", "300", "²", "①", "1e3", "99999999999999999999"],
    "--fusion": ["norm", "gated", "inplace", "rms", "Norm", "norm ", "", "+"],
    "--split-attention": ["16", "32", "64", "0", "-16", "7", "1e2", "kernel", "staged", "carried", "wide", "unrolled",
                          "lanes", "rotary", "pooled", "²", "١٦"],
    "--families": ["repacked_layout", "gemv", "fusion", "constants_once", "split_attention", "direct_replay",
                   "tinygrad_opts", "Gemv", ""],
}
FLAG_JOIN = {"--layout": ":", "--gemv": ":", "--fusion": "+", "--split-attention": ":", "--families": ","}


def parse_text(rng: random.Random, flag: str) -> str:
    """A string for `flag`: its grammar's pieces in random order and number, now and then something else."""
    parts = [rng.choice(PARSE_PARTS[flag]) for _ in range(rng.randint(1, 7))]
    if rng.random() < 0.2:
        parts[rng.randrange(len(parts))] = rng.choice(ODD + BREAKS + [number_text(rng)])
    return rng.choice([FLAG_JOIN[flag], FLAG_JOIN[flag], ":", ",", "+", " ", ""]).join(parts)


def prompt_text(rng: random.Random) -> str:
    kind = rng.choice(["words", "run", "huge", "controls", "surrogate", "special", "empty", "mixed", "digits"])
    word = lambda: "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 12)))
    if kind == "words":
        return " ".join(word() for _ in range(rng.randint(1, 200)))
    if kind == "run":
        return rng.choice(["a", "é", "日", " ", "!", "_", "\n", "🙂"]) * rng.choice([255, 256, 257, 1000, 20_000])
    if kind == "huge":
        return (word() + " ") * rng.choice([5_000, 30_000, 200_000])
    if kind == "controls":
        return "".join(rng.choice(BREAKS + ["a", " "]) for _ in range(rng.randint(1, 300)))
    if kind == "surrogate":
        return word() + "\udcff" * rng.randint(1, 3) + word()
    if kind == "special":
        return "<|im_start|>" * rng.randint(1, 3000) + rng.choice(["", "<|endoftext|>", "<0x41>"])
    if kind == "empty":
        return rng.choice(["", " ", "\t\n", "\u3000"])
    if kind == "digits":
        return "".join(rng.choice("0123456789١²") for _ in range(rng.randint(1, 5000)))
    return "".join(rng.choice(ODD[1:] + BREAKS + ["a", "b", " "]) for _ in range(rng.randint(1, 2000)))


def mutated(rng: random.Random, doc):
    """`doc` with a few of its values, anywhere in it, swapped for hostile ones (or keys dropped or added)."""
    doc = json.loads(json.dumps(doc))
    for _ in range(rng.randint(1, 3)):
        node, path = doc, []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            continue
        parent, key = path[-1]
        r = rng.random()
        if r < 0.15 and isinstance(parent, dict):
            del parent[key]
        elif r < 0.25 and isinstance(parent, dict):
            parent[rng.choice(["extra", "Route", str(key) + "s", "x" * 300])] = big_number(rng)
        else:
            parent[key] = rng.choice([big_number(rng), rng.choice(ODD + BREAKS), [big_number(rng)] * 3,
                                      {"k": big_number(rng)}, -1, 0, 1.5, False, None, "1e999"])
    return doc


def search_summary() -> dict:
    return {"route": "r.json", "seconds": 1.0, "seconds_timing": 0.5, "launches_per_token": 1,
            "space": {"settings": 3, "legal": 2, "survivors": 1, "foreseen_out": 0, "token_product_log10": 0.5,
                      "legal_token_product_log10": 0.3, "rejected_by_reason": {"x": 1}},
            "timed_now": 1, "reused_from_ledger": 0, "refused_by_compiler": 0, "spearman": {},
            "spearman_within_kernels": {}, "futuresight": {}, "routed_kernels": 1, "search_space_incomplete": [],
            "unbuilt": {}, "per_kernel": [{"kernel": "ab" * 12, "name": "k", "launches": 1, "legal": 2, "settings": 3,
                                           "survivors": 1, "timed": 1, "default_us": 2.0, "best_us": 1.0,
                                           "floor_us": 0.5, "choice": {"UPCAST0": 4}, "output": 1, "reduce": 1,
                                           "outputs": 8, "bytes": 100, "flops": 10}],
            "alone": [{"key": "4096x4096:q4:g32", "timed": [{"geometry": "8:4:1:16", "median_us": 3.0}]}]}


class Campaign(Surfaces):
    """Round three's surfaces (Surfaces) and round four's; each a function (rng) -> (argv or call, expectation)."""

    def __init__(self, tmp: Path, model: Path, spelled: Path):
        super().__init__(tmp, model)
        self.spelled = spelled
        (self.inputs / "s.json").write_text(json.dumps(search_summary()))

    def out_path(self, name: str) -> str:
        return str(self.out / name)

    def numbers(self, rng: random.Random):
        """Round three's number strings; a value that parses is accepted here (it stops where the model loads)."""
        return super().numbers(rng)[0], "any"

    def parse_strings(self, rng: random.Random):
        """The family flags' strings (profile, audit), search's --layout and --family, tune's --families."""
        command = rng.choice(["profile", "profile", "audit", "search", "tune"])
        argv = [command, str(self.model), "--device", "CPU", *(["--target", "h200"] if command != "profile" else [])]
        if command in ("profile", "audit"):
            for flag in rng.sample(["--layout", "--gemv", "--fusion", "--split-attention"], rng.randint(1, 3)):
                argv += [flag, parse_text(rng, flag)]
            argv += rng.choice([[], ["--constants-once"], ["--direct-replay"]])
        elif command == "search":
            argv += ["--layout", parse_text(rng, "--layout"), "--family", parse_text(rng, "--families"),
                     "--ledger", self.out_path("L")]
        else:
            argv += ["--families", parse_text(rng, "--families")]
        if rng.random() < 0.3:
            argv += ["--context", number_text(rng)]
        return argv + ["--out", self.out_path("t.json") if command == "profile" else str(self.out)], "any"

    def route_doc(self, rng: random.Random) -> dict:
        doc = route_doc(model_sha256=rng.choice([self.sha] * 4 + [None, "1" * 64, "A" * 64, 7]),
                        device=rng.choice(["CPU"] * 4 + ["CUDA", "cpu", "CPU:0", "", "\n"]),
                        choices=[choice(kernel=rng.choice(["ab" * 12, "x", "", "\n"]),
                                        **{rng.choice(["axis", "arg", "op"]): rng.choice(
                                            [big_number(rng), "UPCAST", "LOCAL", "NOLOCALS", "FOO", 0, 1, 2, 4])})
                                 for _ in range(rng.randint(0, 3))])
        for _ in range(rng.randint(0, 3)):
            key = rng.choice(["constants_once", "constant_once", "beam", "split_attention", "gemv", "fusion",
                              "direct_replay", "layout", "families", "engine", "provenance", "version", "format"])
            doc[key] = rng.choice([big_number(rng), True, False, "none", {"chunk": 16, "staged": False},
                                   {"norm": 1, "gated": 0}, {"scale_dtype": "float16", "form": "kernel"},
                                   {"lanes_per_row": 8, "rows_per_group": 4, "rows_per_thread": 1, "load_bytes": 16}])
        return mutated(rng, doc) if rng.random() < 0.3 else doc

    def route_files(self, rng: random.Random):
        path = self.tmp / "r.json"
        text = json.dumps(self.route_doc(rng))
        path.write_bytes(gzip.compress(text.encode()) if rng.random() < 0.1 else text.encode())
        return ["profile", str(self.model), "--device", "CPU", "--route", str(path), "--tokens",
                rng.choice(["1", "2"]), "--out", self.out_path("t.json")], "any"

    def entry_point(self, rng: random.Random):
        """boltbeam.route.use.load, as a user's program calls it: a route, a model, positions."""
        from boltbeam.errors import BadInput
        from boltbeam.route import use
        path = self.tmp / "r.json"
        path.write_text(json.dumps(self.route_doc(rng)))
        model = rng.choice([str(self.model)] * 6 + [str(self.inputs / "t.json"), str(self.tmp / "none.gguf")])
        route = rng.choice([str(path)] * 6 + ["none", None, str(self.tmp / "no-route.json"), str(self.inputs)])
        positions = rng.choice([1, 8, 4096, 4097, 0, -1, 10 ** 12])

        def call() -> int:
            os.environ["DEV"] = "CPU"
            try:
                with use.load(model, route, positions=positions):
                    return 0
            except BadInput as e:     # (the CLI's one line; a message may quote a route's line breaks)
                print(f"boltbeam: error: {one_line(str(e))}", file=sys.stderr)
                return 2
        return call, "any"

    def summaries(self, rng: random.Random):
        path = self.tmp / "s.json"
        doc = mutated(rng, search_summary()) if rng.random() < 0.9 else rng.choice([[], {}, "x", 1e308, None])
        text = json.dumps(doc).encode()
        path.write_bytes(gzip.compress(text) if rng.random() < 0.2 else text)
        t = str(self.inputs / "t.json")
        return rng.choice([
            ["audit", str(self.model), "--trace", t, "--target", "h200", "--no-hash-check", "--search", str(path),
             "--out", str(self.out)],
            ["search-calibrate", "--summary", str(path), "--ledger", str(self.inputs / "L"), "--target", "h200"],
            ["search", str(self.model), "--device", "CPU", "--target", "h200", "--family", "gemv", "--layout",
             "float16:kernel", "--alone", "2", "--alone-from", str(path), "--ledger", self.out_path("L"),
             "--out", str(self.out)],
        ]), "any"

    def tune_flags(self, rng: random.Random):
        argv = ["tune", str(self.model), "--device", "CPU", "--target", rng.choice(["h200", "host-like", ""]),
                "--out", str(self.out)]
        for flag in rng.sample(["--minutes", "--context", "--tokens", "--budget", "--families", "--ledger", "--alone",
                                "--seconds-per-kernel", "--processes", "--beam"], rng.randint(1, 5)):
            value = {"--families": lambda: parse_text(rng, "--families"),
                     "--ledger": lambda: rng.choice([str(self.inputs / "L"), str(self.inputs / "t.json"),
                                                     self.out_path("tune.json"), self.out_path("route.json"),
                                                     str(self.inputs / "m.gguf"), self.out_path("L")])}.get(
                flag, lambda: number_text(rng))()
            argv += [flag, value]
        return argv, "any"

    def judge_disagree(self, rng: random.Random):
        """Two traces of one workload in all but one fact (or a few fields mutated): never a promotion across
        devices, engines, models or depths."""
        key, a, b = rng.choice([("device", "CPU", "CUDA"), ("device", "CPU", "NVIDIA H200"),
                                ("engine", "tinygrad", "llama.cpp"), ("engine", "tinygrad", "pytorch"),
                                ("model_sha256", "ab" * 32, "cd" * 32), ("model_sha256", "ab" * 32, None),
                                ("context", 4, 512), ("context", 4, 0), ("batch", 1, 2)])
        paths = []
        for side, value, median in (("a", a, 1000.0), ("b", b, rng.choice([500.0, 990.0, 1000.0]))):
            doc = trace_doc(model_sha256="ab" * 32)
            (doc["workload"] if key in ("context", "batch") else doc["environment"])[key] = value
            doc["route"] = {"label": side, "switch": "X=0"}
            doc["token_wall_us"] = [rng.gauss(median, 1.0) for _ in range(rng.choice([6, 12, 40]))]
            doc["kernels"], doc["kernel_pass_wall_us"] = [], []
            if rng.random() < 0.2:
                doc = mutated(rng, doc)
            paths.append(self.tmp / f"{side}.json")
            paths[-1].write_text(json.dumps(doc))
        return ["judge", "--baseline", str(paths[0]), "--candidate", str(paths[1]), "--expect", "promote"], "refused"

    def json_inputs(self, rng: random.Random):
        """Gzip and plain JSON that swell, nest, lie about their size or end early."""
        kind = rng.choice(["deep", "long-string", "many-keys", "bomb", "cut-gzip", "junk-after", "two-members",
                           "numbers", "swollen"])
        body = {"deep": lambda: b"[" * rng.choice([100, 5000, 200_000]) + b"]" * 3,
                "long-string": lambda: b'{"a": "' + b"x" * rng.choice([10, 10 ** 6, 50 * 10 ** 6]) + b'"}',
                "many-keys": lambda: b"{" + b",".join(b'"%d": 0' % i for i in range(rng.choice([10, 10 ** 5, 10 ** 6])))
                + b"}",
                "bomb": lambda: b" " * rng.choice([10 ** 6, 300 << 20]),
                "cut-gzip": lambda: json.dumps(trace_doc()).encode(),
                "junk-after": lambda: json.dumps(trace_doc()).encode(),
                "two-members": lambda: json.dumps(trace_doc()).encode(),
                "numbers": lambda: b"[" + b",".join(rng.choice([b"1e308", b"1e309", b"-0", b"9" * 400, b"1.5",
                                                                  b"123456789012345678901234"])
                                                     for _ in range(rng.choice([1, 1000, 100_000]))) + b"]",
                "swollen": lambda: b"[" + b"{}," * rng.choice([10 ** 5, 6 * 10 ** 6, 17 * 10 ** 6]) + b"{}]"}[kind]()
        packed = gzip.compress(body, compresslevel=1)
        data = {"cut-gzip": packed[:len(packed) // 2], "junk-after": packed + b"garbage",
                "two-members": packed + packed}.get(kind, packed if rng.random() < 0.6 else body)
        path = self.tmp / "big.json"
        path.write_bytes(data)
        t = str(self.inputs / "t.json")
        return rng.choice([
            ["export-trace", str(path), "--chrome", self.out_path("c.json")],
            ["account", str(path), "--target", "h200"],
            ["judge", "--baseline", t, "--candidate", str(path)],
            ["import", "chrome", str(path), "--tokens", "1", "--out", self.out_path("t.json")],
            ["import", "llama-bench", str(path), "--out", self.out_path("t.json")],
            ["report", str(path), "--model", str(self.model), "--target", "h200", "--out", self.out_path("r.html")],
        ]), "any"

    def prompts(self, rng: random.Random):
        return ["generate", str(rng.choice([self.spelled] * 5 + [self.model])), "--prompt", prompt_text(rng),
                "--max-tokens", rng.choice(["1", "2", "4096", "0", number_text(rng)])], "any"

    def line_breaks(self, rng: random.Random):
        """Text with line breaks where a refusal quotes it: paths, flag values, names."""
        b = lambda: rng.choice(BREAKS)
        return rng.choice([
            ["inspect", f"/tmp/no{b()}such.gguf"],
            ["judge", "--baseline", f"{self.tmp}/x{b()}.json", "--candidate", str(self.inputs / "t.json")],
            ["bound", str(self.model), "--target", f"h{b()}200"],
            ["bound", str(self.model), "--target", "h200", f"extra{b()}arg"],
            ["profile", str(self.model), "--device", "CPU", "--route", f"{self.tmp}/r{b()}.json", "--out",
             self.out_path("t.json")],
            ["ledger", "show", "--ledger", str(self.inputs / "L"), f"cand{b()}idate"],
            ["search", str(self.model), "--device", "CPU", "--target", "h200", "--family", f"gem{b()}v", "--ledger",
             self.out_path("L"), "--out", str(self.out)],
            ["export-trace", f"{self.tmp}/{b()}", "--chrome", self.out_path("c.json")],
        ]), "refused"


SURFACES = {   # name: relative weight (the slow ones rarer: a scheduler that does not answer waits out its timeout)
    "self_write": 6, "numbers": 6, "typed_numbers": 6, "target_file": 6, "route_file": 4, "swollen_json": 1,
    "judge_pair": 4, "context": 4, "scheduler": 0.4,
    "parse_strings": 12, "route_files": 8, "entry_point": 6, "summaries": 8, "tune_flags": 6, "judge_disagree": 6,
    "json_inputs": 2, "prompts": 6, "line_breaks": 6,
}


def snapshot(folder: Path) -> dict[str, tuple]:
    """Each input's identity and times (a file replaced or written to changes them); cheap enough for every case."""
    return {str(p): (st.st_ino, st.st_size, st.st_mtime_ns) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(("-shm", "-wal")) and (st := p.stat())}


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.endswith(("-shm", "-wal")):
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


def clear(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def in_process(args, tmp: Path, s: Campaign) -> tuple[dict, list]:
    """The in-process cases; also the sample of refused cases (surface, argv) for the real processes."""
    rng = random.Random(args.seed)
    names, weights = list(SURFACES), [w if not args.surfaces or n in args.surfaces else 0 for n, w in SURFACES.items()]
    outcomes, per_surface, breaks = collections.Counter(), collections.Counter(), collections.Counter()
    seconds: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    peaks, slowest = [], (0.0, None)
    refused, seen, keep_rng = collections.defaultdict(list), collections.Counter(), random.Random(args.seed + 1)
    for case in range(args.cases):
        name = rng.choices(names, weights)[0]
        call, expect = getattr(s, name)(rng)
        before = snapshot(s.inputs)
        traced = case % TRACED_EVERY == 0
        if traced:
            tracemalloc.start()
        outcome, took, err = run_case(call)
        if traced:
            peaks.append((tracemalloc.get_traced_memory()[1], name))
            tracemalloc.stop()
        per_surface[name] += 1
        seconds[name] += took
        outcomes[f"{name} {outcome}"] += 1
        found = []
        if outcome.startswith(("TRACEBACK", "CONTRACT")):
            found.append(f"{name}: {outcome}")
        elif expect == "refused" and outcome in ("exit 0", "accepted"):
            found.append(f"{name}: {outcome} where a refusal was due")
        if outcome.startswith("exit") and outcome != "exit 0" and s.out.exists() and any(s.out.rglob("*")):
            found.append(f"{name}: wrote outputs and failed")
        if snapshot(s.inputs) != before:
            found.append(f"{name}: an input changed ({outcome})")
        if took > SLOW_S:
            found.append(f"{name}: {took:.0f} s, past {SLOW_S:g} s")
        for f in found:
            if not breaks[f]:
                print(f"{dt.datetime.now():%H:%M:%S} case {case:,}: {f}", flush=True)
            breaks[f] += 1
            examples.setdefault(f, repr(call if isinstance(call, list) else call.__qualname__)[:600] + " | " +
                                err[-400:])
        if outcome.startswith("exit") and outcome != "exit 0" and not found and isinstance(call, list):
            seen[name] += 1      # a reservoir of args.processes a surface: every refused case equally likely kept
            if len(refused[name]) < args.processes:
                refused[name].append(call)
            elif (j := keep_rng.randrange(seen[name])) < args.processes:
                refused[name][j] = call
        for extra in ("audit.json", "route.json"):
            (s.inputs / extra).unlink(missing_ok=True)
        clear(s.out)
        if took > slowest[0]:
            slowest = (took, f"case {case}: {name}: {' '.join(str(a)[:40] for a in call[:8]) if isinstance(call, list) else name}")
        if case % 1000 == 0:
            print(f"{dt.datetime.now():%H:%M:%S} case {case:,}: {sum(breaks.values())} breaks, "
                  f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB", flush=True)
    peak = max(peaks) if peaks else (0, None)
    result = {"cases": args.cases, "cases_per_surface": dict(per_surface.most_common()),
              "seconds_per_surface": {k: round(v, 1) for k, v in seconds.most_common()},
              "tracebacks": sum(v for k, v in breaks.items() if "TRACEBACK" in k),
              "contract_breaks": sum(breaks.values()), "breaks": dict(breaks.most_common()), "break_examples": examples,
              "traced_cases": len(peaks), "tracemalloc_peak_mb": peak[0] / 2 ** 20, "tracemalloc_peak_surface": peak[1],
              "slowest_s": slowest[0], "slowest": slowest[1], "outcomes": dict(outcomes.most_common())}
    return result, sample(refused, args.processes, keep_rng)


def sample(refused: dict[str, list], n: int, rng: random.Random) -> list[tuple[str, list]]:
    """`n` of the refused cases, spread over the surfaces in turn (each surface's drawn without repeats)."""
    pools = {name: rng.sample(cases, len(cases)) for name, cases in sorted(refused.items())}
    sampled = []
    while len(sampled) < n and any(pools.values()):
        for name, pool in pools.items():
            if pool and len(sampled) < n:
                sampled.append((name, pool.pop()))
    return sampled


def real_process(argv: list[str], env: dict, limit_file: int | None = None, timeout: float = 120) -> tuple:
    """(exit code, stderr, seconds, peak resident MB) of `python -m boltbeam ARGV`; `limit_file`: the largest
    file it may write (a full disk, as the process sees it: a write past it fails with EFBIG, SIGXFSZ ignored).
    GNU time reads the peak: a child forked from this large process would report this one's resident set as
    its own (Linux keeps the larger across fork and exec), one forked from `time` does not."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        limit = ["prlimit", f"--fsize={limit_file}"] if limit_file is not None else []
        t0 = time.perf_counter()
        child = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss.name, *limit, sys.executable, "-m",
                                  "boltbeam", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                                 cwd=ROOT, start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
        try:
            _, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)       # the group: `time` and the boltbeam under it
            child.communicate()
            return None, "timeout", time.perf_counter() - t0, 0.0
        took = time.perf_counter() - t0
        peak_kb = int(rss.read().split()[-1])     # (after "Command exited with non-zero status N", when it did)
    return child.returncode, err.decode(errors="replace"), took, peak_kb / 1024


def processes(args, s: Campaign, sampled: list) -> dict:
    """The sampled refusals again as real processes (nothing stubbed), audits on a full disk, and scheduler
    addresses at the real connect timeout."""
    env = {**os.environ, "DEV": "CPU"}
    breaks, counts, slowest, peak_mb = collections.Counter(), collections.Counter(), 0.0, 0.0
    examples = {}
    rng = random.Random(args.seed + 2)
    scheduler = [["search", str(s.model), "--device", "CPU", "--target", "h200", "--scheduler", a, "--ledger",
                  str(s.out / "L"), "--out", str(s.out)]
                 for a in ["", f"tcp://{s.silent}", f"tcp://{s.http}", f"ws://{s.http}", f"tcp://{s.huge}",
                           "tcp://127.0.0.1:1"] if args.processes]
    full_disk = [["audit", str(s.model), "--trace", str(s.inputs / "t.json"), "--target", "h200", "--no-hash-check",
                  "--out", str(s.out / rng.choice(["a", "a/b"]))] for _ in range(args.full_disk)]
    cases = [("sampled " + n, argv, None) for n, argv in sampled] + [("scheduler, real timeout", a, None)
                                                                     for a in scheduler] + \
        [("audit on a full disk", a, rng.choice([0, 100, 4096, 20_000])) for a in full_disk]
    for what, argv, limit in cases:
        if not all(isinstance(a, str) and "\x00" not in a for a in argv) or max(map(len, argv)) >= ARG_MAX:
            counts[SKIPPED] += 1
            continue
        before = digest(s.inputs)
        code, err, took, peak = real_process(argv, env, limit)
        slowest, peak_mb = max(slowest, took), max(peak_mb, peak)
        surface = what.split(" ")[0] if what.startswith("sampled") else what
        counts[surface if not what.startswith("sampled") else "sampled"] += 1
        problems = []
        if code not in (0, 2, 3) or "Traceback" in err or (code and err.count("\n") != 1):
            problems.append(f"{what}: exit {code}, {err.count(chr(10))} stderr lines")
        if code and s.out.exists() and any(p.is_file() for p in s.out.rglob("*")):
            problems.append(f"{what}: wrote outputs and failed")
        if digest(s.inputs) != before:
            problems.append(f"{what}: an input changed")
        if took > SLOW_S:
            problems.append(f"{what}: {took:.0f} s, past {SLOW_S:g} s")
        if what == "audit on a full disk" and code != 2 and limit < 20_000:
            problems.append(f"{what}: exit {code} with files capped at {limit} bytes")
        for p in problems:
            breaks[p] += 1
            examples.setdefault(p, " ".join(a[:60] for a in argv)[:600] + " | " + err[-600:])
        clear(s.out)
        for extra in ("audit.json", "route.json"):
            (s.inputs / extra).unlink(missing_ok=True)
    return {"cases": sum(counts.values()) - counts[SKIPPED],
            "counts": dict(counts), "tracebacks": sum(v for k, v in breaks.items() if "stderr lines" in k),
            "contract_breaks": sum(breaks.values()), "breaks": dict(breaks), "break_examples": examples,
            "slowest_s": slowest, "peak_rss_mb": peak_mb}


def killed_searches(args, s: Campaign) -> dict:
    """Two searches on one ledger, one killed (SIGKILL) at a random moment: the ledger's chain stays intact,
    the other search ends as it would alone, and every file the killed one left under its --out is whole."""
    rng = random.Random(args.seed + 3)
    env = {**os.environ, "DEV": "CPU"}
    runs, breaks, examples = [], collections.Counter(), {}
    for i in range(args.kills):
        root = s.tmp / f"kill{i}"
        ledger = root / "L"
        argv = lambda out: [sys.executable, "-m", "boltbeam", "search", str(s.model), "--device", "CPU", "--target",
                            "h200", "--budget", "1", "--tokens", "5", "--ledger", str(ledger), "--out", str(out)]
        t0 = time.monotonic()
        keep = subprocess.Popen(argv(root / "kept"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        doomed = subprocess.Popen(argv(root / "killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  cwd=ROOT, start_new_session=True)
        after = rng.uniform(2, args.kill_within)
        with contextlib.suppress(subprocess.TimeoutExpired):
            doomed.wait(after)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(doomed.pid, signal.SIGKILL)     # the search and the profiles it started, as a killed job
        doomed.wait()
        _, err = keep.communicate(timeout=1800)
        verify = subprocess.run([sys.executable, "-m", "boltbeam", "ledger", "verify", "--ledger", str(ledger)],
                                capture_output=True, text=True, env=env, cwd=ROOT)
        left = sorted(str(p.relative_to(root)) for p in (root / "killed").rglob("*") if p.is_file()) \
            if (root / "killed").exists() else []
        whole = []
        for name in left:
            with contextlib.suppress(Exception):
                json.loads((root / name).read_bytes())
                whole.append(name)
        temporaries = [n for n in left if n.endswith(".partial")]
        run = {"killed_after_s": round(after, 1), "kept_exit": keep.returncode,
               "kept_stderr": err.decode(errors="replace")[-300:], "ledger_verify_exit": verify.returncode,
               "ledger_verify": verify.stdout.strip()[-200:] + verify.stderr.strip()[-200:],
               "killed_left": left, "killed_left_whole_json": whole, "temporaries_left": temporaries,
               "kept_outputs": sorted(p.name for p in (root / "kept").iterdir()) if (root / "kept").exists() else [],
               "wall_s": round(time.monotonic() - t0, 1)}
        runs.append(run)
        problems = []
        if keep.returncode != 0:
            problems.append("the search beside the killed one did not finish")
        if verify.returncode != 0:
            problems.append("the ledger's chain broke")
        if set(left) - set(whole) - set(temporaries):
            problems.append("the killed search left a file that is not whole")
        for p in problems:
            breaks[p] += 1
            examples.setdefault(p, json.dumps(run)[:800])
        shutil.rmtree(root, ignore_errors=True)
    return {"cases": len(runs), "contract_breaks": sum(breaks.values()), "breaks": dict(breaks),
            "break_examples": examples, "runs": runs}


def campaign(args, tmp: Path) -> dict:
    from boltbeam.search import fanout
    from boltbeam.synth.writer import shape_from, write
    model, spelled = tmp / "tiny.gguf", tmp / "spelled.gguf"
    write(model, "qwen3", shape_from("tiny"), "q4_k_m")
    spelled_model(spelled)
    s = Campaign(tmp, model, spelled)
    stop = threading.Event()
    s.silent, s.http = listener(b"", stop), listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", stop)
    s.huge = listener(b"\xff" * 64, stop)
    result = {}
    if args.cases:
        connect = fanout.CONNECT_SECONDS
        fanout.CONNECT_SECONDS = 1     # in process; the real processes wait the real timeout
        stop_at_the_run()
        result["in_process"], sampled = in_process(args, tmp, s)
        print(json.dumps({k: v for k, v in result["in_process"].items() if k != "outcomes"}, indent=1), flush=True)
        fanout.CONNECT_SECONDS = connect
    else:
        sampled = []
    print(f"{dt.datetime.now():%H:%M:%S} real processes: {len(sampled)} sampled refusals", flush=True)
    result["processes"] = processes(args, s, sampled)
    print(f"{dt.datetime.now():%H:%M:%S} killed searches: {args.kills}", flush=True)
    result["killed_searches"] = killed_searches(args, s)
    stop.set()
    return result


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=100_000, help="in-process cases")
    ap.add_argument("--processes", type=int, default=300, help="refused cases run again as real processes")
    ap.add_argument("--full-disk", type=int, default=20, help="audits as real processes on a full disk")
    ap.add_argument("--kills", type=int, default=3, help="pairs of searches on one ledger, one killed")
    ap.add_argument("--kill-within", type=float, default=120.0, help="the kill comes within this many seconds")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--surfaces", type=lambda t: t.split(","), default=[], help="only these in-process surfaces")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    args.dirty = subprocess.run(["git", "status", "--short", "--untracked-files=no"], capture_output=True, text=True,
                                cwd=ROOT).stdout.split("\n")[:-1]
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))   # a swollen case is a MemoryError, recorded
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="boltbeam-hostile4-") as tmp:
        result = campaign(args, Path(tmp))
    parts = [result.get("in_process", {}), result["processes"], result["killed_searches"]]
    record = {"command": " ".join(["bench/hostile4_campaign.py", *sys.argv[1:]]), "seed": args.seed,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_at_end": os.getloadavg()},
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "python": platform.python_version(),
              "versions": {p: version(p) for p in ("boltbeam", "tinygrad", "distributed", "numpy")},
              "commit_at_start": args.commit,
              "uncommitted_at_start": args.dirty,   # (other work in the same checkout, imported as it stood)
              "wall_s": time.perf_counter() - t0, "address_space_limit_bytes": LIMIT_BYTES,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "cases": sum(p.get("cases", 0) for p in parts),
              "tracebacks": sum(p.get("tracebacks", 0) for p in parts),
              "contract_breaks": sum(p.get("contract_breaks", 0) for p in parts), **result}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("in_process", "processes", "killed_searches")},
                     indent=1))


if __name__ == "__main__":
    main_()
