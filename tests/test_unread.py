"""Every tensor of the file read by the decode token, or a refusal: the comparison on traces built in memory
against the tiny model's census, the facts that excuse a tensor, the audit's page and --strict, and one
profile of a file carrying a tensor tinygrad.llm never reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from boltbeam.cli import main
from boltbeam.measure.trace import Environment, Kernel, Provenance, RouteRecord, Trace, Workload, save
from boltbeam.measure.unread import NEUTRAL, _neutral, unread_tensors
from boltbeam.read.census import TensorEntry, take_census
from boltbeam.synth import writer

ROPE = "rope_freqs.weight"


def decoded(names_by_token: list[list[str]], engine: str = "tinygrad", source: str = "profile") -> Trace:
    """A trace whose token t has one kernel per name in names_by_token[t], reading that tensor."""
    kernels = [Kernel(token=t, index=i, name=f"k{i}", duration_us=1.0, tensors=[n])
               for t, names in enumerate(names_by_token) for i, n in enumerate(names)]
    return Trace(Environment(engine=engine), Workload(context=0, batch=1), RouteRecord("r"),
                 token_wall_us=[10.0] * len(names_by_token), provenance=Provenance(source), kernels=kernels)


@pytest.fixture(scope="module")
def census(tiny_model):
    return take_census(tiny_model)


def names(census) -> list[str]:
    return sorted({t.name for t in census.tensors})


def test_a_tensor_one_token_did_not_read_is_named(census):
    every = names(census)
    assert unread_tensors(decoded([every, every]), census).complete
    skipped = [n for n in every if n != "blk.1.ffn_norm.weight"]
    u = unread_tensors(decoded([every, skipped]), census)          # read in token 0, not in token 1
    assert u.missing == ["blk.1.ffn_norm.weight"] and not u.complete and u.tensors == len(every)
    assert "blk.1.ffn_norm.weight" in u.sentence() and u.sentence().startswith("adapter-incomplete")
    u = unread_tensors(decoded([every[:3]]), census)
    assert len(u.missing) == len(every) - 3 and f"and {len(every) - 3 - 5} more" in u.sentence()


def test_only_a_trace_whose_kernels_name_tensors_is_checked(census):
    assert unread_tensors(decoded([[]], engine="llama.cpp"), census) is None    # its kernels carry no tensor
    assert unread_tensors(decoded([[]], source="import:chrome"), census) is None
    assert unread_tensors(decoded([]), census) is None                          # whole-token samples only


def test_a_tied_output_is_the_embeddings_name(tmp_path):
    path = tmp_path / "tied.gguf"
    writer.write(path, "qwen3", writer.shape_from("tiny"), "q8_0", tied=True)
    tied = take_census(path)
    assert [t.name for t in tied.tensors if t.role == "output"] == ["token_embd.weight"]
    u = unread_tensors(decoded([names(tied)]), tied)
    assert u.complete and u.tensors == len(names(tied))                           # counted once, read once


def test_a_table_of_its_roles_neutral_value_is_excused(tmp_path):
    path = tmp_path / "values.bin"
    values = np.ones(40, dtype=np.float32)
    values[36:] = 2.0
    values.tofile(path)
    entry = lambda role, elements, offset=0, fmt="F32": TensorEntry(ROPE, role, fmt, [elements], 4 * elements,
                                                                    4 * elements, data_offset=offset)
    assert _neutral(str(path), entry("rope_freqs", 32)) == NEUTRAL["rope_freqs"][1]
    assert _neutral(str(path), entry("rope_freqs", 8, offset=4 * 32)) is None     # a factor of 2 changes rotary
    assert _neutral(str(path), entry("ffn_norm", 32)) is None                     # no such fact for a norm
    assert _neutral(str(path), entry("rope_freqs", 32, fmt="Q8_0")) is None       # values not plain numbers


@pytest.fixture(scope="module")
def unread_model(tmp_path_factory):
    """The tiny model with a rotary frequency-factor table of values near 1 (tinygrad.llm never reads one)."""
    plan = writer.plan

    def with_rope_freqs(*args, **kwargs):
        return plan(*args, **kwargs) + [writer.Planned(ROPE, 32, 0, GGMLQuantizationType.F32)]
    path = tmp_path_factory.mktemp("unread") / "rope.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer, "plan", with_rope_freqs)
        writer.write(path, "qwen3", writer.shape_from("tiny"), "q4_k_m")
    return str(path)


def test_the_audit_page_and_strict_say_what_was_not_read(unread_model, tmp_path, capsys):
    """A tinygrad trace whose kernels read every tensor but the table: the page and audit.json name it, and
    --strict refuses."""
    every = [n for n in names(take_census(unread_model)) if n != ROPE]
    trace = decoded([every] * 3)
    trace.kernels = [Kernel(**{**vars(k), "role": "ffn_down", "category": "weights", "bytes": 10})
                     for k in trace.kernels]
    save(trace, str(tmp_path / "t.json"))
    argv = ["audit", unread_model, "--trace", str(tmp_path / "t.json"), "--target", "h200", "--no-hash-check"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert doc["tensors_read"]["status"] == "adapter-incomplete" and doc["tensors_read"]["missing"] == [ROPE]
    page = (tmp_path / "a" / "report.html").read_text()
    assert ROPE in page and "checked against no reference engine" in page     # (no trace of another engine given)
    assert main([*argv, "--out", str(tmp_path / "b"), "--strict"]) == 3
    err = capsys.readouterr().err
    assert ROPE in err and "adapter-incomplete" in err and len(err.strip().splitlines()) == 1


def test_profile_refuses_a_file_with_a_tensor_the_engine_never_reads(unread_model, tmp_path):
    out = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "boltbeam", "profile", unread_model, "--device", "CPU",
                           "--context", "4", "--tokens", "2", "--no-hash", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 3, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "adapter-incomplete" in said[0] and ROPE in said[0] and "1 of the file's" in said[0]
    trace = json.loads(out.read_text())                       # the evidence is kept: every other tensor was read
    read = {n for k in trace["kernels"] for n in k["tensors"]}
    assert read == set(names(take_census(unread_model))) - {ROPE}
