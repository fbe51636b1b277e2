"""Hostile input, round three (issue 35): each class refused at its root, in one line, exit 2 or 3, nothing
written and no input replaced."""
import errno
import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from boltbeam.cli import main as run_main
from boltbeam.measure.trace import FORMAT, VERSION


def main(argv: list[str]) -> int:
    """The command's exit code, argparse's own refusals (SystemExit) included."""
    try:
        return run_main(argv)
    except SystemExit as e:
        return e.code


def trace_doc(**environment) -> dict:
    return {"format": FORMAT, "version": VERSION, "environment": {"engine": "tinygrad", **environment},
            "workload": {"context": 4, "batch": 1}, "route": {"label": "r"}, "provenance": {"source": "test"},
            "token_wall_us": [100.0] * 6, "kernel_pass_wall_us": [110.0], "output_tokens": [1, 2],
            "memory": {"peak_bytes": 10, "capacity_bytes": 100},
            "kernels": [{"token": 0, "index": 0, "name": "k", "duration_us": 50.0, "start_us": 0.0,
                         "role": None, "category": "other", "tensors": [], "bytes": 10, "flops": 0,
                         "global_size": [32], "local_size": [32], "opts": []}]}


def one_line(capsys, code: int, rc: int, *says: str) -> str:
    err = capsys.readouterr().err
    assert rc == code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for s in says:
        assert s in err, err
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes (SQLite's -shm and -wal beside a ledger it read left out)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(("-shm", "-wal"))}


# --- 1. an output that is the command's own input ---------------------------------------------------

@pytest.fixture
def inputs(tmp_path, tiny_model):
    """A folder of inputs: a model, a trace, a ledger, a llama-bench file; `audit/` holds a trace to compare."""
    shutil.copy(tiny_model, tmp_path / "m.gguf")
    (tmp_path / "t.json").write_text(json.dumps(trace_doc()))
    (tmp_path / "bench.json").write_text(json.dumps([{"n_prompt": 0, "n_gen": 8, "avg_ts": 100.0}]))
    assert main(["ledger", "add", "--ledger", str(tmp_path / "L"), "--candidate", "c", "--verdict", "diagnostic",
                 "--reason", "r"]) == 0
    (tmp_path / "audit").mkdir()
    (tmp_path / "audit" / "audit.json").write_text(json.dumps(trace_doc()))
    os.link(tmp_path / "L", tmp_path / "L.hard")
    return tmp_path


SELF_WRITES = [
    ["ledger", "export", "--ledger", "L", "--out", "L"],
    ["ledger", "export", "--ledger", "L", "--out", "L.hard"],            # another name for the same file
    ["ledger", "export", "--ledger", "./audit/../L", "--out", "L"],
    ["report", "t.json", "--model", "m.gguf", "--target", "h200", "--out", "t.json"],
    ["export-trace", "t.json", "--chrome", "t.json"],
    ["import", "llama-bench", "bench.json", "--out", "bench.json"],
    ["import", "chrome", "t.json", "--out", "t.json"],
    ["profile", "m.gguf", "--device", "CPU", "--out", "m.gguf"],
    ["profile", "m.gguf", "--device", "CPU", "--out", "x.json", "--host-profile", "m.gguf"],
    ["audit", "m.gguf", "--trace", "t.json", "--target", "h200", "--compare", "audit/audit.json", "--out", "audit"],
    ["audit", "m.gguf", "--device", "CPU", "--target", "h200", "--out", "audit", "--ledger", "audit/audit.json"],
    ["search", "m.gguf", "--device", "CPU", "--target", "h200", "--ledger", "L", "--out", ".",
     "--baseline", "search.json"],
]


@pytest.mark.parametrize("argv", SELF_WRITES, ids=lambda a: " ".join(a[:2]))
def test_an_output_never_replaces_an_input(inputs, argv, capsys, monkeypatch):
    (inputs / "search.json").write_text("{}")
    monkeypatch.chdir(inputs)
    before = snapshot(inputs)
    one_line(capsys, 2, main(argv), "this command's input")
    assert snapshot(inputs) == before


def test_two_outputs_are_two_files(inputs, capsys, monkeypatch):
    monkeypatch.chdir(inputs)
    one_line(capsys, 2, main(["profile", "m.gguf", "--device", "CPU", "--out", "p.json", "--host-profile",
                              "./p.json"]), "are one file")
    assert not (inputs / "p.json").exists()


def test_a_trace_audited_in_its_own_folder_is_read_not_rewritten(inputs, capsys):
    """audit --trace D/trace.json --out D does not write trace.json: that is no self-write."""
    (inputs / "audit" / "trace.json").write_text(json.dumps(trace_doc()))
    before = (inputs / "audit" / "trace.json").read_bytes()
    assert main(["audit", str(inputs / "m.gguf"), "--trace", str(inputs / "audit" / "trace.json"), "--target",
                 "h200", "--no-hash-check", "--out", str(inputs / "audit"), "--json"]) == 0
    assert (inputs / "audit" / "trace.json").read_bytes() == before
    assert {"audit.json", "report.html"} <= set(snapshot(inputs / "audit"))


# --- 8. audit's outputs land together or not at all ------------------------------------------------

def test_audit_on_a_full_disk_writes_nothing(inputs, capsys, monkeypatch):
    real = Path.write_bytes

    def full(self, data):
        if "report.html" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    out = inputs / "new" / "audit"
    one_line(capsys, 2, main(["audit", str(inputs / "m.gguf"), "--trace", str(inputs / "t.json"), "--target", "h200",
                              "--no-hash-check", "--out", str(out)]), "No space left")
    assert not (inputs / "new").exists()     # no files, no temporary files, no folders made for them
    (inputs / "audit" / "report.html").write_text("old")
    before = snapshot(inputs / "audit")
    one_line(capsys, 2, main(["audit", str(inputs / "m.gguf"), "--trace", str(inputs / "t.json"), "--target", "h200",
                              "--no-hash-check", "--out", str(inputs / "audit")]), "No space left")
    assert snapshot(inputs / "audit") == before


def test_a_failed_write_leaves_no_folder(inputs, capsys, monkeypatch):
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: (_ for _ in ()).throw(OSError(errno.EDQUOT, "Quota")))
    one_line(capsys, 2, main(["ledger", "export", "--ledger", str(inputs / "L"), "--out",
                              str(inputs / "new" / "dir" / "L.jsonl")]), "Quota")
    assert not (inputs / "new").exists()


def test_a_failed_audit_leaves_no_folder(inputs, capsys, monkeypatch):
    from boltbeam.cli import audit
    monkeypatch.setattr(audit, "MAX_REPORT_BYTES", 10)
    one_line(capsys, 3, main(["audit", str(inputs / "m.gguf"), "--trace", str(inputs / "t.json"), "--target", "h200",
                              "--no-hash-check", "--out", str(inputs / "a" / "b")]), "over its")
    assert not (inputs / "a").exists()


@pytest.mark.parametrize("argv", [
    ["audit", "m.gguf", "--trace", "t.json", "--target", "h200", "--out", "N"],
    ["profile", "m.gguf", "--device", "CPU", "--out", "N"],
    ["account", "N", "--target", "h200"],
    ["ledger", "export", "--ledger", "L", "--out", "N/x"],
], ids=lambda a: a[0])
def test_a_name_past_the_file_systems_limit_is_one_line(inputs, argv, capsys, monkeypatch):
    monkeypatch.chdir(inputs)
    before = snapshot(inputs)
    one_line(capsys, 2, main([a.replace("N", "n" * 300) if a.startswith("N") else a for a in argv]), "n" * 100)
    assert snapshot(inputs) == before


# --- 4. judge compares one device and one engine ----------------------------------------------------

@pytest.mark.parametrize("key, a, b", [("device", "CPU", "CUDA"), ("engine", "tinygrad", "llama.cpp")])
def test_judge_never_promotes_across_devices_or_engines(tmp_path, key, a, b, capsys):
    import numpy as np
    rng = np.random.default_rng(0)
    paths = []
    for side, value, median in (("a", a, 1000.0), ("b", b, 500.0)):
        doc = trace_doc(**{key: value, "model_sha256": "ab" * 32})
        doc["route"] = {"label": side, "switch": "X=0"}
        doc["token_wall_us"] = list(rng.normal(median, 1.0, 20))
        doc["kernels"], doc["kernel_pass_wall_us"] = [], []
        paths.append(tmp_path / f"{side}.json")
        paths[-1].write_text(json.dumps(doc))
    main(["judge", "--baseline", str(paths[0]), "--candidate", str(paths[1]), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "adapter-incomplete"
    assert any(f"{key} is {a!r} in the baseline" in r for r in out["reasons"])


# --- 6. every JSON input has one size cap, before it is parsed ------------------------------------

@pytest.mark.parametrize("packed", [False, True])
def test_json_too_big_to_parse_is_refused_before_parsing(tmp_path, packed, capsys, monkeypatch):
    from boltbeam import files
    monkeypatch.setattr(files, "MAX_UNPACKED", 1000)
    big = json.dumps(trace_doc() | {"pad": "x" * 2000}).encode()
    swollen = b"[" + b"[]," * 300 + b"[]]"       # small in bytes, many objects once parsed
    monkeypatch.setattr(files, "MAX_VALUES", 200)
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed"))
    for doc, says in ((big, "more than 1,000 bytes"), (swollen, "more than the 200")):
        path = tmp_path / "t.json"
        path.write_bytes(gzip.compress(doc) if packed else doc)
        one_line(capsys, 2, main(["export-trace", str(path), "--chrome", str(tmp_path / "c.json")]), says)
    assert not (tmp_path / "c.json").exists()


# --- 2. numbers: ASCII digits, bounded before they are converted -----------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--split-attention", "²"], "--split-attention"),
    (["--split-attention", "①:kernel"], "--split-attention"),
    (["--split-attention", "9" * 5000], "--split-attention"),
    (["--layout", "float16:kernel", "--gemv", "①:1:1:1"], "--gemv"),
    (["--layout", "float16:kernel", "--gemv", "4096x4096:q4:g32=8:4:²:16"], "--gemv"),
    (["--context", "١٢"], "--context"),
    (["--tokens", "1_0"], "--tokens"),
    (["--tokens", "9" * 5000], "--tokens"),
], ids=lambda v: repr(v)[:30])
def test_profile_numbers_are_ascii_digits(tiny_model, tmp_path, flags, says, capsys):
    one_line(capsys, 2, main(["profile", tiny_model, "--device", "CPU", *flags, "--out", str(tmp_path / "t.json")]),
             says)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, says", [
    (["bound", "M", "--target", "h200", "--batch", "²"], "--batch"),
    (["account", "T", "--target", "h200", "--price-per-hour", "1e999"], "--price-per-hour"),
    (["account", "T", "--target", "h200", "--price-per-hour", "nan"], "--price-per-hour"),
    (["judge", "--baseline", "T", "--candidate", "T", "--floor-us", "Infinity"], "--floor-us"),
])
def test_every_number_flag_reads_one_way(tiny_model, tmp_path, argv, says, capsys):
    (tmp_path / "t.json").write_text(json.dumps(trace_doc()))
    one_line(capsys, 2, main([{"M": tiny_model, "T": str(tmp_path / "t.json")}.get(a, a) for a in argv]), says)


@pytest.mark.parametrize("value, says", [(str(10 ** 309), "must be a positive number"), ("9" * 5000, "not valid TOML"),
                                         ("1e999", "must be a positive number"), ("1e300", "unit mistake")])
def test_a_target_fact_too_big_for_a_float_is_one_line(tiny_model, tmp_path, value, says, capsys):
    path = tmp_path / "t.toml"
    path.write_text(f'[t]\nmemory_bandwidth = {{value = {value}, unit = "B/s", status = "spec", source = "x", '
                    f'date = "x"}}\n')
    one_line(capsys, 2, main(["bound", tiny_model, "--target", "t", "--targets", str(path)]), says)


def test_a_file_number_too_big_for_a_float_is_one_line(tmp_path, capsys):
    big = 10 ** 309
    trace = trace_doc()
    trace["kernels"][0]["duration_us"] = big
    checks = {"token_floor_us": big}
    for name, doc in (("t.json", trace), ("c.json", checks)):
        (tmp_path / name).write_text(json.dumps(doc))
    one_line(capsys, 2, main(["export-trace", str(tmp_path / "t.json"), "--chrome", str(tmp_path / "x.json")]),
             "past a float's range")
    (tmp_path / "t.json").write_text(json.dumps(trace_doc()))
    one_line(capsys, 2, main(["judge", "--baseline", str(tmp_path / "t.json"), "--candidate", str(tmp_path / "t.json"),
                              "--checks", str(tmp_path / "c.json")]), "past a float's range")


# --- 3. --context is checked against the model before anything is built -----------------------------

@pytest.mark.parametrize("argv", [
    ["bound", "M", "--target", "h200", "--context", str(10 ** 17)],
    ["bound", "M", "--target", "h200", "--context", str(10 ** 23)],
    ["profile", "M", "--device", "CPU", "--context", str(10 ** 8), "--out", "D/t.json"],
    ["profile", "M", "--device", "CPU", "--context", "4090", "--tokens", "10", "--out", "D/t.json"],
    ["audit", "M", "--device", "CPU", "--target", "h200", "--context", str(10 ** 12), "--out", "D"],
    ["search", "M", "--device", "CPU", "--target", "h200", "--context", str(10 ** 8), "--ledger", "D/L", "--out", "D"],
    ["search", "M", "--device", "CPU", "--target", "h200", "--family", "split_attention", "--context",
     str(10 ** 8), "--ledger", "D/L", "--out", "D"],
], ids=lambda a: " ".join(a[:1] + a[-4:-2]))
def test_a_context_past_the_models_is_refused_before_anything_is_built(tiny_model, tmp_path, argv, capsys):
    import tracemalloc
    traced = argv[0] in ("profile", "audit")     # (tracing the imports of a search takes seconds)
    if traced:
        tracemalloc.start()
    try:
        rc = main([tiny_model if a == "M" else a.replace("D", str(tmp_path / "D")) for a in argv])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(capsys, 2, rc, "--context")
    assert peak < 64 << 20          # no prompt of --context tokens was built
    assert not (tmp_path / "D").exists()


# --- 7. a scheduler that is no Dask scheduler: one line, within the connect timeout ------------------

@pytest.fixture
def listener():
    """A listener on 127.0.0.1 that says `reply` (or nothing) to whoever connects; it stops with the test."""
    import socket
    import threading
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop, held = threading.Event(), []

    def serve(reply: bytes):
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if reply:
                conn.sendall(reply)

    def start(reply: bytes = b"") -> str:
        threading.Thread(target=serve, args=(reply,), daemon=True).start()
        return f"127.0.0.1:{server.getsockname()[1]}"
    yield start
    stop.set()
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.parametrize("scheme, reply", [
    ("tcp://", b""),                                                          # silent: Dask waits for ever
    ("tcp://", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),     # read as frames of any size
    ("tcp://", b"\xff" * 64),                                                 # a claim of a huge frame
    ("ws://", b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"),
], ids=["silent", "http", "huge-frame", "ws-at-http"])
def test_a_scheduler_that_does_not_answer_is_one_line(tiny_model, tmp_path, listener, scheme, reply, capsys,
                                                       monkeypatch):
    from boltbeam.search import fanout
    monkeypatch.setattr(fanout, "CONNECT_SECONDS", 1)
    address = scheme + listener(reply)
    one_line(capsys, 2, main(["search", tiny_model, "--device", "CPU", "--target", "h200", "--scheduler", address,
                              "--ledger", str(tmp_path / "D" / "L"), "--out", str(tmp_path / "D")]), address)
    assert not (tmp_path / "D").exists()


@pytest.mark.parametrize("family", ["tinygrad_opts", "split_attention"])
def test_an_empty_scheduler_is_refused_not_ignored(tiny_model, tmp_path, family, capsys):
    one_line(capsys, 2, main(["search", tiny_model, "--device", "CPU", "--target", "h200", "--family", family,
                              "--scheduler", " ", "--ledger", str(tmp_path / "D" / "L"), "--out", str(tmp_path / "D")]),
             "--scheduler")
    assert not (tmp_path / "D").exists()


# --- 5. route files: known keys, the model and device they were made for, opts that fit ----------

def route_doc(**kw) -> dict:
    return {"format": "boltbeam-route", "version": 1, "model_sha256": "0" * 64, "engine": "tinygrad 0.13.0",
            "device": "CPU", "target": "t", "family": "tinygrad_opts", "provenance": "generated by search",
            "choices": [], **kw}


def choice(kernel: str = "ab" * 12, **opt) -> dict:
    return {"kernel": kernel, "name": "k", "setting": {}, "measured_us": 1.0, "default_us": 2.0,
            "opts": [{"op": "UPCAST", "axis": 0, "arg": 4, **opt}]}


@pytest.mark.parametrize("doc, says", [
    (route_doc(constant_once=True), "unknown key 'constant_once' (did you mean 'constants_once'?)"),
    (route_doc(choices=[choice() | {"measurd_us": 1.0}]), "did you mean 'measured_us'?"),
    (route_doc(choices=[choice(amount=2)]), "unknown key 'amount'"),
    (route_doc(model_sha256=None, choices=[choice()]), "but no model"),
    (route_doc(model_sha256="1" * 64), "another model"),
    (route_doc(device="CUDA"), "was made on CUDA; this runs on CPU"),
    (route_doc(choices=[choice() | {"measured_us": 10 ** 400}]), "past a float's range"),   # (load_json's bound)
    (route_doc(choices=[choice(arg=10 ** 30)]), "is not a tinygrad opt"),
], ids=["typo", "choice-typo", "opt-typo", "no-hash", "other-model", "other-device", "huge-time", "huge-arg"])
def test_a_route_is_refused_before_the_model_loads(tiny_model, tmp_path, doc, says, capsys, monkeypatch):
    from boltbeam.files import sha256_file
    if doc["model_sha256"] == "0" * 64:
        doc["model_sha256"] = sha256_file(tiny_model)
    (tmp_path / "r.json").write_text(json.dumps(doc))
    monkeypatch.setenv("DEV", "CPU")
    one_line(capsys, 2, main(["profile", tiny_model, "--device", "CPU", "--route", str(tmp_path / "r.json"),
                              "--out", str(tmp_path / "t.json")]), says)
    assert not (tmp_path / "t.json").exists()


FIT = """
import json, sys
from tinygrad import Tensor
from tinygrad.uop.ops import Ops
from boltbeam.errors import BadInput
from boltbeam.measure import route as routes
compute = lambda: (Tensor.ones(7, 11).contiguous() * 3).sum(1)
keys = [routes.kernel_key(c.src[0]) for c in compute().schedule_linear().src if c.src[0].op is Ops.SINK]
doc = json.loads(sys.argv[1])
doc["choices"] = [dict(doc["choices"][0], kernel=k) for k in keys]
open(sys.argv[2], "w").write(json.dumps(doc))
try:
    with routes.apply(sys.argv[2]):
        compute().realize()
except BadInput as e:
    sys.exit(f"refused: {e}")
"""


@pytest.mark.parametrize("opt", [{"axis": 5, "arg": 2}, {"axis": 0, "arg": 4}], ids=["axis-past", "upcast-past"])
def test_route_opts_that_do_not_fit_their_kernel_are_one_line(tmp_path, opt):
    """The Python entry point, in a fresh process (tinygrad keeps the compile hook it first saw), on a kernel of
    7 x 11: an axis past the kernel's, an upcast of 4 the 7 rows do not divide into, each refused naming the
    kernel (profile --route installs the route the same way)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", FIT, json.dumps(route_doc(choices=[choice(**opt)])),
                           str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DEV": "CPU"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert "refused: route kernel " in done.stderr and "do not fit the kernel" in done.stderr, done.stderr


@pytest.mark.parametrize("family, table", [("split_attention", {"chunk": 10 ** 30, "staged": False}),
                                           ("gemv", {"4096x4096:q4:g32": {"lanes_per_row": 2 ** 70}}),
                                           ("fusion", {"norm": -10 ** 40})])
def test_a_routes_family_numbers_are_bounded(tiny_model, tmp_path, family, table, capsys):
    from boltbeam.files import sha256_file
    (tmp_path / "r.json").write_text(json.dumps(route_doc(model_sha256=sha256_file(tiny_model), **{family: table})))
    one_line(capsys, 2, main(["profile", tiny_model, "--device", "CPU", "--route", str(tmp_path / "r.json"),
                              "--out", str(tmp_path / "t.json")]), f"{family}'s numbers must be below 2**63")


def test_a_baseline_given_in_the_search_folder_is_read_not_rewritten(inputs, capsys, monkeypatch):
    """search --baseline D/baseline.json --out D does not profile the baseline again: no self-write (it stops
    later, at --on's route, which is no route)."""
    monkeypatch.chdir(inputs)
    (inputs / "audit" / "baseline.json").write_text(json.dumps(trace_doc()))
    rc = main(["search", "m.gguf", "--device", "CPU", "--target", "h200", "--family", "split_attention", "--ledger",
               "L", "--baseline", "audit/baseline.json", "--on", "t.json", "--out", "audit"])
    err = one_line(capsys, 2, rc, "route")
    assert "this command's input" not in err
