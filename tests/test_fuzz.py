"""Hostile input, generated: every reader either answers (exit 0) or refuses in one line (exit 2 or
3), never a traceback, never a file left half-written. Seeded (derandomize) so CI sees the same
cases every run; the budget is the example counts below (about a minute on a 2-core machine)."""
from __future__ import annotations

import json
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gguf_bytes
from boltbeam.cli import main
from test_trace import good

def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

F32, Q8_0 = 0, 8
VALID = gguf_bytes.gguf([(b"token_embd.weight", [64, 4], F32, 0), (b"output_norm.weight", [64], F32, 1024),
                         (b"blk.0.attn_norm.weight", [64], F32, 2048)],
                        gguf_bytes.arch_kv() + [(b"llama.block_count", gguf_bytes.UINT32, struct.pack("<I", 1))])


def answered_or_refused(capsys, argv: list[str]) -> int:
    code = main(argv)
    captured = capsys.readouterr()
    assert code in (0, 2, 3), (argv, code)
    if code:
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    return code


def writes_all_or_nothing(capsys, argv: list[str], out) -> None:
    """A command that writes `out` leaves it whole on success and absent on refusal."""
    if answered_or_refused(capsys, argv):
        assert not out.exists()
    out.unlink(missing_ok=True)


def replaced(doc, where: tuple, value):
    """The document with the value at path `where` replaced."""
    node = doc
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    return doc


def test_the_valid_file_reads(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    path.write_bytes(VALID)
    assert answered_or_refused(capsys, ["inspect", str(path), "--json"]) == 0


@fuzz(600)
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.one_of(st.none(), st.integers(0, len(VALID))))
def test_mutated_gguf_headers(tmp_path, capsys, edits, cut):
    blob = bytearray(VALID)
    for pos, value in edits:
        blob[pos] = value
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(blob[:cut]))
    for argv in (["inspect", str(path), "--json"], ["bound", str(path), "--target", "h200", "--json"]):
        answered_or_refused(capsys, argv)


@fuzz(300)
@given(dims=st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=4), ggml_type=st.integers(0, 40),
       offset=st.integers(0, 2 ** 64 - 1), count=st.integers(0, 3))
def test_generated_tensor_tables(tmp_path, capsys, dims, ggml_type, offset, count):
    tensors = [(f"blk.{i}.ffn_down.weight".encode(), dims, ggml_type, offset * i) for i in range(count)]
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes.gguf(tensors, gguf_bytes.arch_kv()))
    answered_or_refused(capsys, ["bound", str(path), "--target", "h200", "--json"])


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


def paths(doc, prefix=()):
    """Every path into a JSON document."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


TRACE_PATHS = [p for p in paths(good()) if p]


@fuzz(400)
@given(where=st.sampled_from(TRACE_PATHS), value=JSON)
def test_traces_with_a_field_replaced(tmp_path, capsys, where, value):
    path, out = tmp_path / "t.json", tmp_path / "chrome.json"
    path.write_text(json.dumps(replaced(good(), where, value)))
    for argv in (["compare", str(path), str(path), "--json"], ["judge", "--baseline", str(path), "--candidate",
                                                                str(path), "--json"]):
        answered_or_refused(capsys, argv)
    writes_all_or_nothing(capsys, ["export-trace", str(path), "--chrome", str(out), "--json"], out)


@fuzz(300)
@given(lines=st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=40), max_size=6),
       header=st.booleans())
def test_nsys_csv_of_anything(tmp_path, capsys, lines, header):
    csv = tmp_path / "gpu.csv"
    head = ["Start (ns),Duration (ns),Name"] if header else []
    csv.write_text("\n".join(head + lines) + "\n")
    out = tmp_path / "t.json"
    writes_all_or_nothing(capsys, ["import", "nsys", str(csv), "--tokens", "1", "--out", str(out), "--json"], out)


def fixture_doc(name: str):
    from pathlib import Path
    return json.loads((Path(__file__).parent / "data" / name).read_text())


IMPORTS = {"llama-bench": ("import_llama_bench.json", []), "chrome": ("import_kineto.json", ["--tokens", "2"])}


@fuzz(300)
@given(kind=st.sampled_from(sorted(IMPORTS)), data=st.data(), value=JSON)
def test_importer_json_with_a_field_replaced(tmp_path, capsys, kind, data, value):
    name, flags = IMPORTS[kind]
    doc = fixture_doc(name)
    where = data.draw(st.sampled_from([p for p in paths(doc) if p][:400]))
    src, out = tmp_path / "in.json", tmp_path / "t.json"
    src.write_text(json.dumps(replaced(doc, where, value)))
    writes_all_or_nothing(capsys, ["import", kind, str(src), *flags, "--out", str(out), "--json"], out)


FACT_NAMES = ["memory_bandwidth", "measured_bandwidth", "memory_latency", "multiprocessors", "peak_fp32",
              "launch_sync_per_kernel", "local_memory_per_group", "something_new"]
TOML_VALUE = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.floats(), st.text(max_size=6), st.booleans())


@fuzz(300)
@given(facts=st.dictionaries(st.sampled_from(FACT_NAMES), st.fixed_dictionaries(
    {"value": TOML_VALUE, "unit": st.sampled_from(["B/s", "GB/s", "s", "ns", "count", "FLOP/s", "B", "furlongs"]),
     "status": st.sampled_from(["spec", "measured", "derived", "guess"]), "source": st.just("s"),
     "date": st.just("d")}), max_size=5))
def test_target_files_of_any_facts(tmp_path, capsys, facts):
    def toml(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v > 0 else "-inf") if v in (float("inf"), float("-inf")) else repr(v)
        return json.dumps(v)
    body = "\n".join(f"{name} = {{ " + ", ".join(f"{k} = {toml(v)}" for k, v in fact.items()) + " }"
                     for name, fact in facts.items())
    path = tmp_path / "t.toml"
    path.write_text(f"[x]\n{body}\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(VALID)
    if answered_or_refused(capsys, ["bound", str(model), "--target", "x", "--targets", str(path), "--json"]) == 0:
        assert "memory_bandwidth" in facts          # accepted only with the one fact every target needs


@fuzz(200)
@given(candidate=st.text(max_size=12), reason=st.text(max_size=20), scope=st.lists(st.text(max_size=10), max_size=3),
       reopen=st.one_of(st.none(), st.text(max_size=12)))
def test_ledger_entries_of_any_text(tmp_path, capsys, candidate, reason, scope, reopen):
    path = tmp_path / "l.db"
    argv = ["ledger", "add", "--ledger", str(path), "--candidate", candidate, "--verdict", "refute",
            "--reason", reason, *[a for s in scope for a in ("--scope", s)]] + (["--reopen", reopen] if reopen else [])
    try:
        code = answered_or_refused(capsys, argv)
    except SystemExit as e:   # argparse's own refusals (a value that looks like a flag) exit 2 with one line
        assert e.code == 2
        capsys.readouterr()
        return
    if code:
        assert not path.exists() or main(["ledger", "verify", "--ledger", str(path)]) == 0
    capsys.readouterr()
