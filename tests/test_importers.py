"""Importers (llama-bench JSON, Chrome/Kineto JSON, nsys cuda_gpu_trace CSV) and the Chrome export.

Fixtures in tests/data/import_*: a llama-bench -o json file in the schema of the vendored llama.cpp
(two decode depths, three repetitions each, plus a prompt test); a real torch.profiler trace of
three annotated decode steps on an H200 (torch 2.11); nsys CSVs in the 2024 and 2021 dialects.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from boltbeam.cli import main
from boltbeam.errors import BadInput
from boltbeam.files import sha256_file
from boltbeam.measure.importers import import_chrome_trace, import_llama_bench, import_nsys_gpu_trace
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload, load
from boltbeam.report.chrome import chrome_trace

DATA = Path(__file__).parent / "data"
LLAMA_BENCH = DATA / "import_llama_bench.json"
KINETO = DATA / "import_kineto.json"
NSYS_2024 = DATA / "import_nsys_2024.csv"
NSYS_2021 = DATA / "import_nsys_2021.csv"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def decode_test(depth: int) -> dict:
    return next(t for t in json.loads(LLAMA_BENCH.read_text()) if t["n_prompt"] == 0 and t["n_depth"] == depth)


# --- llama-bench ----------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [0, 512])
def test_llama_bench_takes_every_repetition_of_the_chosen_depth(tmp_path, capsys, depth):
    out = tmp_path / "trace.json"
    code, _, err = run(capsys, "import", "llama-bench", LLAMA_BENCH, "--depth", depth, "--out", out)
    assert (code, err) == (0, "")
    trace, test = load(str(out)), decode_test(depth)
    assert trace.token_wall_us == pytest.approx([s / 128 / 1000 for s in test["samples_ns"]])
    assert len(trace.token_wall_us) == 3 and trace.kernels == []
    assert trace.workload == Workload(context=depth, tokens=128, batch=1)
    assert trace.environment.engine == "llama.cpp"
    assert trace.environment.engine_version == "0c1e57098 (build 0)"
    assert trace.environment.device == "NVIDIA H200"
    assert trace.route.label == "llama.cpp" and trace.route.switch is None
    settings = trace.route.settings
    assert [settings[k] for k in ("flash_attn", "n_gpu_layers", "n_ubatch", "backends")] == [1, 99, 512, "CUDA"]
    assert "samples_ns" not in settings and "n_depth" not in settings
    assert trace.provenance.source == "import:llama-bench"
    assert trace.provenance.inputs == [{"path": str(LLAMA_BENCH), "sha256": sha256_file(LLAMA_BENCH)}]
    assert any("per repetition" in n for n in trace.provenance.notes)


def test_llama_bench_with_two_depths_and_no_depth_lists_them(tmp_path, capsys):
    out = tmp_path / "trace.json"
    code, stdout, err = run(capsys, "import", "llama-bench", LLAMA_BENCH, "--out", out)
    assert code == 2 and stdout == ""
    assert err.count("\n") == 1 and "0, 512" in err and "--depth" in err
    assert not out.exists()


def test_llama_bench_depth_not_present_lists_the_depths(tmp_path, capsys):
    code, _, err = run(capsys, "import", "llama-bench", LLAMA_BENCH, "--depth", 256, "--out", tmp_path / "t.json")
    assert code == 2 and "no decode test at depth 256" in err and "0, 512" in err


def test_llama_bench_older_version_without_samples_or_depth(tmp_path):
    """Older llama-bench: no n_depth, no samples_ns. One decode test needs no --depth."""
    old = [{k: v for k, v in t.items() if k not in ("samples_ns", "samples_ts", "n_depth")}
           for t in json.loads(LLAMA_BENCH.read_text())[:2]]
    trace = import_llama_bench(write_json(tmp_path / "old.json", old))
    assert trace.token_wall_us == pytest.approx([old[1]["avg_ns"] / 128 / 1000])
    assert trace.workload.context == 0
    notes = " ".join(trace.provenance.notes)
    assert "avg_ns" in notes and "depth 0 assumed" in notes


def test_llama_bench_two_decode_tests_at_one_depth_name_what_differs(tmp_path):
    tests = json.loads(LLAMA_BENCH.read_text())
    twin = {**decode_test(0), "n_gpu_layers": 20}
    with pytest.raises(BadInput, match="n_gpu_layers"):
        import_llama_bench(write_json(tmp_path / "two.json", tests + [twin]), depth=0)


# --- Chrome / Kineto ------------------------------------------------------------------------------

def kineto_events() -> list[dict]:
    return json.loads(KINETO.read_text())["traceEvents"]


def test_kineto_tokens_come_from_the_annotations(tmp_path, capsys):
    out = tmp_path / "trace.json"
    code, _, err = run(capsys, "import", "chrome", KINETO, "--out", out, "--context", 0, "--engine", "pytorch")
    assert (code, err) == (0, "")
    trace = load(str(out))
    annotations = sorted((e for e in kineto_events() if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    assert trace.token_wall_us == pytest.approx([e["dur"] for e in annotations], abs=1e-3)
    assert trace.kernel_pass_wall_us == trace.token_wall_us
    assert trace.kernel_tokens == [0, 1, 2] and trace.workload.tokens == 3
    assert trace.environment.device == "NVIDIA H200" and trace.environment.engine == "pytorch"
    gpu = [e for e in kineto_events() if e.get("cat") in ("kernel", "gpu_memcpy")]
    assert len(trace.kernels) == len(gpu) == 21 and trace.provenance.kernels_outside_tokens == 0
    for token in trace.kernel_tokens:
        kernels = trace.kernels_of_token(token)
        assert [k.index for k in kernels] == list(range(7))
        assert kernels[0].start_us == 0 and all(a.start_us <= b.start_us for a, b in zip(kernels, kernels[1:]))
        assert [k.category for k in kernels] == ["other"] * 6 + ["copy"]
        assert kernels[0].name.startswith("nvjet_sm90") and kernels[0].global_size == [4, 24, 1]
        assert kernels[0].local_size == [384, 1, 1] and kernels[-1].bytes == 8
    first = min(gpu, key=lambda e: e["ts"])
    assert trace.kernels[0].duration_us == pytest.approx(first["dur"])


def test_kineto_tokens_must_agree_with_the_annotations(tmp_path, capsys):
    out = tmp_path / "trace.json"
    code, _, err = run(capsys, "import", "chrome", KINETO, "--tokens", 4, "--out", out)
    assert code == 2 and "--tokens 4 but 3 annotations" in err and not out.exists()


def kernel_event(ts: float, dur: float, corr: int, name: str = "gemv", **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "grid": [32, 1, 1], "block": [128, 1, 1], **args}}


def launch_event(ts: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": ts, "dur": 5,
            "args": {"correlation": corr}}


def annotation(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 9, "tid": 9, "ts": ts, "dur": dur}


def test_kernels_belong_to_the_token_that_launched_them(tmp_path):
    """Token 0 launches at 110 a kernel that runs at 215, inside token 1's span by GPU time."""
    events = [annotation("decode_token_0", 100, 100), annotation("decode_token_1", 210, 100),
              launch_event(50, 1), kernel_event(60, 10, 1, "prefill"),
              launch_event(110, 2), kernel_event(120, 50, 2, "a"),
              launch_event(150, 3), kernel_event(215, 20, 3, "b"),
              launch_event(220, 4), kernel_event(240, 30, 4, "a"), launch_event(230, 5), kernel_event(275, 20, 5, "b")]
    trace = import_chrome_trace(write_json(tmp_path / "t.json", {"traceEvents": events}))
    assert [(k.token, k.index, k.name, k.start_us) for k in trace.kernels] == [
        (0, 0, "a", 0), (0, 1, "b", 95), (1, 0, "a", 0), (1, 1, "b", 35)]
    assert trace.provenance.kernels_outside_tokens == 1
    assert trace.token_wall_us == [100, 100]


def test_kineto_without_annotations_splits_by_count(tmp_path, capsys):
    events = [kernel_event(10 * i, 4, i, name) for i, name in enumerate("abcabc")]
    path = write_json(tmp_path / "t.json", events)  # a bare event list is valid Chrome JSON too
    trace = import_chrome_trace(path, tokens=2)
    assert [k.name for k in trace.kernels_of_token(1)] == ["a", "b", "c"]
    assert trace.token_wall_us == [24, 24]  # first start to last end
    assert "first kernel's start" in " ".join(trace.provenance.notes)
    with pytest.raises(BadInput, match="6 GPU operations do not divide into 4"):
        import_chrome_trace(path, tokens=4)
    code, _, err = run(capsys, "import", "chrome", path, "--out", tmp_path / "o.json")
    assert code == 2 and "--tokens" in err


def test_kineto_custom_marker_and_overlapping_annotations(tmp_path):
    events = [annotation("step", 0, 50), annotation("step", 50, 50), annotation("token", 0, 100),
              kernel_event(10, 5, 1), kernel_event(60, 5, 2)]
    path = write_json(tmp_path / "t.json", events)
    assert import_chrome_trace(path, token_marker="^step$").kernel_tokens == [0, 1]
    with pytest.raises(BadInput, match="overlap"):
        import_chrome_trace(path, token_marker="step|token")
    with pytest.raises(BadInput, match="regular expression"):
        import_chrome_trace(path, token_marker="(")


def test_kineto_event_args_may_carry_boltbeam_fields(tmp_path):
    events = [kernel_event(0, 5, 1, role="ffn_down", category="weights", bytes=1024),
              kernel_event(10, 5, 2, category="gemm")]
    trace = import_chrome_trace(write_json(tmp_path / "t.json", events), tokens=1)
    assert [(k.role, k.category, k.bytes) for k in trace.kernels] == [("ffn_down", "weights", 1024),
                                                                      (None, "other", None)]


# --- nsys -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, device, second_start_us", [(NSYS_2024, "NVIDIA H200", 3.116),
                                                           (NSYS_2021, "NVIDIA A100-SXM4-80GB", 4.0)])
def test_nsys_both_dialects(tmp_path, capsys, path, device, second_start_us):
    out = tmp_path / "trace.json"
    code, _, err = run(capsys, "import", "nsys", path, "--tokens", 2, "--out", out)
    assert (code, err) == (0, "")
    trace = load(str(out))
    with path.open() as f:
        rows = [r for r in csv.reader(f) if r and r[-1] != "Name" and len(r) > 10]
    assert len(trace.kernels) == len(rows) and trace.kernel_tokens == [0, 1]
    assert trace.environment.device == device
    first = trace.kernels_of_token(0)
    assert first[1].start_us == pytest.approx(second_start_us)
    assert first[1].duration_us == pytest.approx(float(rows[1][1]) / 1000)  # ns in both dialects
    assert first[1].global_size == [1, 1, 1] and first[1].local_size == [1024, 1, 1]
    for k in trace.kernels:
        if k.global_size is None:
            assert k.category == ("copy" if "memcpy" in k.name else "other")
        else:
            assert k.category == "other" and k.name.startswith("void ")
    assert [k.name for k in first] == [k.name for k in trace.kernels_of_token(1)]
    assert sum(k.category == "copy" for k in trace.kernels) == (4 if path == NSYS_2024 else 2)
    last = first[-1]
    assert trace.token_wall_us[0] == pytest.approx(last.start_us + last.duration_us)


def test_nsys_bare_columns_kernel_name_and_no_grid(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Start,Duration,Kernel Name\n1000,2000,\"k<1, 2>\"\n4000,1500,[CUDA memcpy HtoD]\n")
    trace = import_nsys_gpu_trace(path, tokens=1)
    assert [(k.name, k.start_us, k.duration_us, k.category, k.global_size) for k in trace.kernels] == [
        ("k<1, 2>", 0, 2, "other", None), ("[CUDA memcpy HtoD]", 3, 1.5, "copy", None)]
    assert trace.environment.device is None


# --- malformed and foreign files: one line, exit 2, nothing written --------------------------------

def no_decode(tmp_path: Path) -> Path:
    return write_json(tmp_path / "pp.json", [t for t in json.loads(LLAMA_BENCH.read_text()) if t["n_gen"] == 0])


def empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").write_text("")
    return tmp_path / "empty"


def no_duration(tmp_path: Path) -> Path:
    (tmp_path / "nodur.csv").write_text("Start (ns),CorrId,Name\n100,1,k\n")
    return tmp_path / "nodur.csv"


@pytest.mark.parametrize("kind, make, extra, says", [
    ("nsys", lambda t: LLAMA_BENCH, ["--tokens", "1"], "no header row with a Start column"),
    ("nsys", empty, ["--tokens", "1"], "no header row"),
    ("nsys", no_duration, ["--tokens", "1"], "no Duration column"),
    ("llama-bench", empty, [], "not valid JSON"),
    ("llama-bench", no_decode, [], "no decode test"),
    ("llama-bench", lambda t: KINETO, [], "expected a non-empty JSON array"),
    ("llama-bench", lambda t: t / "missing.json", [], "no such file"),
    ("chrome", lambda t: LLAMA_BENCH, [], "no GPU kernel events"),
    ("chrome", empty, [], "not valid JSON"),
    ("chrome", lambda t: write_json(t / "o.json", {"traceEvents": {}}), [], "traceEvents"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, kind, make, extra, says):
    out = tmp_path / "trace.json"
    code, stdout, err = run(capsys, "import", kind, make(tmp_path), *extra, "--out", out)
    assert code == 2 and stdout == ""
    assert err.startswith("boltbeam: error:") and err.count("\n") == 1 and says in err
    assert not out.exists()


# --- round trip: what an import writes, load reads back unchanged ------------------------------------

@pytest.mark.parametrize("argv", [["llama-bench", LLAMA_BENCH, "--depth", "512"], ["chrome", KINETO],
                                  ["nsys", NSYS_2024, "--tokens", "2"], ["nsys", NSYS_2021, "--tokens", "2"]])
def test_imported_traces_load_back_unchanged(tmp_path, capsys, argv):
    out = tmp_path / "trace.json"
    code, stdout, _ = run(capsys, "import", *argv, "--out", out, "--json")
    written = json.loads(out.read_text())
    assert code == 0 and load(str(out)).to_dict() == written
    summary = json.loads(stdout)
    assert (summary["kernels"], summary["token_walls"]) == (len(written["kernels"]), len(written["token_wall_us"]))


# --- Chrome export ----------------------------------------------------------------------------------

def export(tmp_path: Path, capsys, trace_path: Path) -> dict:
    out = tmp_path / "chrome.json"
    code, _, err = run(capsys, "export-trace", trace_path, "--chrome", out)
    assert (code, err) == (0, "")
    return json.loads(out.read_text())


def test_export_lays_tokens_end_to_end(tmp_path, capsys):
    imported = tmp_path / "trace.json"
    run(capsys, "import", "chrome", KINETO, "--out", imported)
    trace = load(str(imported))
    doc = export(tmp_path, capsys, imported)
    events = doc["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    spans = [e for e in events if e["ph"] == "X" and e["cat"] == "user_annotation"]
    assert len(kernels) == len(trace.kernels) and len(spans) == 3
    assert len(events) == len(kernels) + len(spans) + sum(e["ph"] == "M" for e in events)
    assert {e["name"] for e in events if e["ph"] == "M"} == {"process_name", "thread_name"}
    assert [s["dur"] for s in spans] == pytest.approx(trace.kernel_pass_wall_us)
    assert spans[0]["ts"] == 0
    for a, b in zip(spans, spans[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    times = [e["ts"] for e in kernels]
    assert times == sorted(times)
    for e, k in zip(kernels, trace.kernels):
        span = spans[k.token]
        assert e["name"] == k.name and e["dur"] == k.duration_us
        assert e["ts"] == pytest.approx(span["ts"] + k.start_us)
        assert span["ts"] <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-9
        assert e["args"]["category"] == k.category and e["args"]["global_size"] == k.global_size


def test_export_reads_back_as_the_same_kernels(tmp_path, capsys):
    imported = tmp_path / "trace.json"
    run(capsys, "import", "nsys", NSYS_2024, "--tokens", "2", "--out", imported)
    export(tmp_path, capsys, imported)
    again = import_chrome_trace(tmp_path / "chrome.json")
    before = load(str(imported))
    assert again.token_wall_us == pytest.approx(before.kernel_pass_wall_us)
    key = lambda k: (k.token, k.index, k.name, k.duration_us, k.category, k.global_size, k.local_size)
    assert [key(k) for k in again.kernels] == [key(k) for k in before.kernels]
    assert [k.start_us for k in again.kernels] == pytest.approx([k.start_us for k in before.kernels])


def minimal_trace(kernels: list[Kernel], walls: list[float], pass_walls: list[float] | None = None) -> Trace:
    return Trace(Environment(), Workload(), RouteRecord("x"), token_wall_us=walls, provenance=Provenance("profile"),
                 kernel_pass_wall_us=pass_walls or [], kernels=kernels)


def test_export_without_device_times_places_kernels_back_to_back(tmp_path):
    kernels = [Kernel(token=t, index=i, name=f"k{i}", duration_us=d) for t in (0, 1) for i, d in enumerate((3.0, 5.0))]
    events = chrome_trace(minimal_trace(kernels, [10.0, 10.0]))["traceEvents"]
    assert [e["ts"] for e in events if e.get("cat") == "kernel"] == [0, 3, 8, 11]  # span 8 per token
    kernels_with_wall = chrome_trace(minimal_trace(kernels, [10.0], pass_walls=[20.0, 20.0]))["traceEvents"]
    assert [e["ts"] for e in kernels_with_wall if e.get("cat") == "kernel"] == [0, 3, 20, 23]


def test_export_whole_token_trace_has_spans_only(tmp_path, capsys):
    imported = tmp_path / "trace.json"
    run(capsys, "import", "llama-bench", LLAMA_BENCH, "--depth", "0", "--out", imported)
    events = export(tmp_path, capsys, imported)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["dur"] for e in spans] == pytest.approx(load(str(imported)).token_wall_us)


def test_export_refuses_a_file_that_is_not_a_trace(tmp_path, capsys):
    out = tmp_path / "chrome.json"
    code, _, err = run(capsys, "export-trace", KINETO, "--chrome", out)
    assert code == 2 and err.count("\n") == 1 and "not a BoltBeam trace" in err and not out.exists()


def test_nsys_header_cell_with_a_newline_is_one_line(tmp_path, capsys):
    """A quoted header cell may hold a newline (found by the fuzz campaign: it crashed the header parser)."""
    csv_path = tmp_path / "gpu.csv"
    csv_path.write_text('"Sta\nrt (ns)",Duration (ns),Name\n1000,500,k\n')
    out = tmp_path / "t.json"
    code = main(["import", "nsys", str(csv_path), "--tokens", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err and (code == 0) == out.exists()
